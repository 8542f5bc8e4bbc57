"""``python -m warmstart.runtime.api --fake --port N``: the API over the real runtime
on the fake engine (runtime/engine/_fake.py): no model file, deterministic text.

For tests and demos.

The real server is ``warmstart serve``; this entry point exists so that the API
tests can start a real server process without a model.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile

from .._private import restrict_umask
from ..engine import FakeOptions
from ..errors import ConfigError
from ..serving import open_fake_runtime
from ..settings import load_settings
from ._server import serve


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m warmstart.runtime.api", description=__doc__)
    p.add_argument("--fake", action="store_true", required=True, help="serve the fake engine")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8765)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument("--max-queue", type=int, default=None, help="waiting requests before 429")
    p.add_argument("--data-dir", default=None, help="sessions and cache (default: a temporary one)")
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
        with contextlib.ExitStack() as stack:
            data_dir = args.data_dir or stack.enter_context(
                tempfile.TemporaryDirectory(prefix="warmstart-fake-")
            )
            settings = load_settings(
                host=args.host,
                port=args.port,
                api_key=args.api_key,
                max_queue=args.max_queue,
                data_dir=data_dir,
                resident_sequences=args.slots,
            )
            options = FakeOptions(
                model_id=args.model_id,
                n_ctx=args.n_ctx,
                token_delay=args.token_delay,
                prefill_delay=args.prefill_delay,
                reply_words=args.reply_words,
            )
            serve(settings, open_fake_runtime(settings, options), log_level=args.log_level)
    except ConfigError as exc:
        logging.getLogger(__package__).error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
