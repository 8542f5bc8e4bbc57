"""The ``warmstart`` command line: parses, sets up logging, runs the command and turns
its errors into exit codes. Output here is the CLI's own: print is allowed."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from .._private import restrict_umask
from ..errors import WarmstartError
from ._commands import run_app
from ._parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    restrict_umask()  # everything written from here on is the user's alone (0600/0700)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["app"]:
        return run_app(argv[1:])  # every option after `app` is the app's own, --help too
    parser = build_parser(show_all="--help-all" in argv)
    args = parser.parse_args(argv)
    if getattr(args, "check", None) is not None:
        args.check(args)  # a usage error argparse cannot express: exits 2 like one
    level = logging.WARNING - 10 * args.verbose
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = int(args.fn(args))
        sys.stdout.flush()  # inside the try: a reader that left shows up here, not at exit
        return code
    except WarmstartError as exc:
        print(f"warmstart: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_left()


def _reader_left() -> int:
    """The reader of our output went away (``| head``): it asked for less, which is not
    an error. stdout is pointed at /dev/null so that the interpreter's final flush
    does not raise again (the recipe of Python's signal documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0
