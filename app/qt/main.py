"""Command-line options and the Qt event loop."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication

from app.core.paths import data_dir
from app.qt.application import Options, WarmstartApp
from app.qt.theme import Theme, app_icon


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warmstart app", description="warmstart's desktop app")
    parser.add_argument("--server", metavar="URL", help="base URL, e.g. http://host:8765/v1")
    parser.add_argument("--api-key", help="Bearer key for a server off this machine")
    parser.add_argument(
        "--no-autostart", action="store_true", help="never start a local warmstart server"
    )
    parser.add_argument("--theme", choices=("system", "light", "dark"), default="system")
    parser.add_argument("--data-dir", help="where conversations are kept")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def build(argv: list[str] | None = None) -> tuple[QApplication, WarmstartApp, Theme]:
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
        api_key=args.api_key,
        autostart=False if args.no_autostart else None,
        scheme=theme.scheme,
    )
    return qapp, WarmstartApp(options), theme


def run(argv: list[str] | None = None) -> int:
    qapp, window_app, _theme = build(argv)
    window_app.start()
    return qapp.exec()
