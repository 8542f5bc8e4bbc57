"""The command line: `warmstart` and its subcommands (serve, ask, chat, doctor, bench,
cache, sessions, models), on the runtime, or on a running server, or on the files alone."""

from ._main import main

__all__ = [
    "main",
]
