"""``python -m warmstart.runtime.api --fake --port N``: the API over FakeRuntime.

For tests and demos.

The real server is ``warmstart serve``; this entry point exists so that the API
tests can start a real server process without a model.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .._private import restrict_umask
from ..errors import ConfigError
from ..fake import FakeRuntime
from ..settings import load_settings
from ._server import serve


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m warmstart.runtime.api", description=__doc__)
    p.add_argument("--fake", action="store_true", required=True, help="serve the FakeRuntime")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8765)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument("--max-queue", type=int, default=None, help="waiting requests before 429")
    p.add_argument("--n-ctx", type=int, default=2048, help="tokens per conversation")
    p.add_argument("--slots", type=int, default=4, help="replies generated at once")
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds per token round")
    p.add_argument("--prefill-delay", type=float, default=2e-4, help="seconds per prompt token")
    p.add_argument("--model-id", default="warmstart-fake", help="the model name to report")
    p.add_argument("--reply-words", type=int, default=None, help="make every reply this long")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    return p


def main(argv: list[str] | None = None) -> int:
    restrict_umask()
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    try:
        settings = load_settings(
            host=args.host, port=args.port, api_key=args.api_key, max_queue=args.max_queue
        )
        runtime = FakeRuntime(
            model_id=args.model_id,
            n_ctx=args.n_ctx,
            max_queue=settings.max_queue,
            slots=args.slots,
            token_delay=args.token_delay,
            prefill_delay=args.prefill_delay,
            reply_words=args.reply_words,
        )
        serve(settings, runtime, log_level=args.log_level)
    except ConfigError as exc:
        logging.getLogger(__package__).error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
