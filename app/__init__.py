"""warmstart's desktop app: a PySide6 client of warmstart's OpenAI-compatible HTTP API.

``app.core`` holds the logic without Qt; ``app.qt`` the models, controllers and views.
The app imports nothing from ``runtime``: it talks to a server over HTTP, starting a
local ``warmstart serve`` when none answers.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the desktop app; ``warmstart app`` and ``python -m app`` call this."""
    from app.qt.main import run

    return run(argv)
