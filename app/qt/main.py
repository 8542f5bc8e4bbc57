"""Command-line options and the Qt event loop."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication

from ..core.paths import data_dir
from ..core.private import restrict_umask
from .application import Options, WarmstartApp
from .theme import Theme, app_icon

log = logging.getLogger(__name__)


def command_line_args(argv: list[str]) -> tuple[list[str], bool]:
    """The app's own arguments in a whole command line (``sys.argv``), and whether it
    came through ``warmstart [...] app ARGS`` (the CLI has parsed that line already, so
    what follows ``app`` may hold its settings flags as well as the app's options)."""
    script = Path(argv[0]) if argv else Path()
    rest = argv[1:]
    if (script.name, script.parent.name) == ("__main__.py", "app") or "app" not in rest:
        return rest, False  # python -m app ARGS
    return rest[rest.index("app") + 1 :], True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """``argv``: the app's options; ``None`` reads them from ``sys.argv``."""
    from_cli = False
    if argv is None:
        argv, from_cli = command_line_args(sys.argv)
    parser = argparse.ArgumentParser(prog="warmstart app", description="warmstart's desktop app")
    parser.add_argument("--server", metavar="URL", help="base URL, e.g. http://host:8765/v1")
    parser.add_argument(
        "--api-key",
        help="Bearer key for a server you run (visible to other users in ps: prefer "
        "--api-key-file or Settings)",
    )
    parser.add_argument("--api-key-file", metavar="PATH", help="a file holding that key")
    parser.add_argument(
        "--no-autostart", action="store_true", help="never start a local warmstart server"
    )
    parser.add_argument("--theme", choices=("system", "light", "dark"), default="system")
    parser.add_argument("--data-dir", help="where conversations are kept")
    parser.add_argument("-v", "--verbose", action="store_true")
    if not from_cli:
        return parser.parse_args(argv)
    args, ignored = parser.parse_known_args(argv)
    if ignored:  # warmstart's settings flags, accepted by the CLI's own parser
        log.warning("warmstart app: ignoring %s", " ".join(ignored))
    return args


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file:
        # Like the server's api_key_file: the trailing newline is not part of the key.
        return Path(args.api_key_file).read_text("utf-8").rstrip("\r\n")
    return str(args.api_key) if args.api_key is not None else None


def build(argv: list[str] | None = None) -> tuple[QApplication, WarmstartApp, Theme]:
    restrict_umask()  # conversations, keys, logs: everything written is the user's alone
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    qapp = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(qapp, QApplication)
    qapp.setApplicationName("warmstart")
    qapp.setDesktopFileName("warmstart")
    qapp.setWindowIcon(app_icon())
    theme = Theme(qapp, args.theme)
    options = Options(
        data_dir=Path(args.data_dir) if args.data_dir else data_dir(),
        base_url=args.server,
        api_key=_api_key(args),
        autostart=False if args.no_autostart else None,
        scheme=theme.scheme,
    )
    return qapp, WarmstartApp(options), theme


def run(argv: list[str] | None = None) -> int:
    qapp, window_app, _theme = build(argv)
    window_app.start()
    return qapp.exec()
