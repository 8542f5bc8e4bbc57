"""warmstart's desktop app: a PySide6 client of warmstart's OpenAI-compatible HTTP API.

``app.core`` holds the logic without Qt; ``app.qt`` the models, controllers and views.
The app imports nothing from ``runtime``: it talks to a server over HTTP, starting a
local ``warmstart serve`` when none answers.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the desktop app and return its exit code.

    ``argv`` holds the app's options (``--server URL`` ...). ``None`` reads them from
    ``sys.argv``: all of it after ``python -m app``, what follows the ``app``
    subcommand after ``warmstart [...] app``.
    """
    from .qt.main import run

    return run(argv)
