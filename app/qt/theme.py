"""Light and dark palettes, following the system unless the user picked one."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPalette
from PySide6.QtWidgets import QApplication

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
# The error banner's red in both themes: white text on it has a contrast of 5.6:1
# (WCAG AA asks 4.5:1); its buttons are white too, never the muted grey of flat ones.
ERROR_RED = "#c92a2a"

# (window, base, alternate base, text, button, highlight, muted text, bubble user, bubble bot)
_COLORS = {
    "light": (
        "#f4f4f6",
        "#ffffff",
        "#ececf0",
        "#1d1d22",
        "#e9e9ee",
        "#e8590c",
        "#6b6b76",
        "#fff0e6",
        "#ffffff",
    ),
    "dark": (
        "#1e1f23",
        "#26272c",
        "#2d2e34",
        "#e8e8ec",
        "#33343a",
        "#ff8a3d",
        "#9a9aa6",
        "#3a2b22",
        "#2b2c31",
    ),
}


def app_icon() -> QIcon:
    icon = QIcon()
    for name in ("warmstart.svg", "warmstart.png"):
        path = RESOURCES / name
        if path.exists():
            icon.addFile(str(path))
    return icon


def system_scheme() -> str:
    scheme = QGuiApplication.styleHints().colorScheme()
    return "dark" if scheme == Qt.ColorScheme.Dark else "light"


def resolve(mode: str) -> str:
    return system_scheme() if mode == "system" else mode


def palette_for(scheme: str) -> QPalette:
    window, base, alt, text, button, accent, muted, *_ = (QColor(c) for c in _COLORS[scheme])
    pal = QPalette()
    role = QPalette.ColorRole
    for r, c in (
        (role.Window, window),
        (role.Base, base),
        (role.AlternateBase, alt),
        (role.Text, text),
        (role.WindowText, text),
        (role.Button, button),
        (role.ButtonText, text),
        (role.Highlight, accent),
        (role.HighlightedText, QColor("white")),
        (role.ToolTipBase, base),
        (role.ToolTipText, text),
        (role.PlaceholderText, muted),
        (role.Link, accent),
        (role.Mid, alt),
        (role.Midlight, alt),
    ):
        pal.setColor(r, c)
    pal.setColor(QPalette.ColorGroup.Disabled, role.Text, muted)
    pal.setColor(QPalette.ColorGroup.Disabled, role.ButtonText, muted)
    return pal


def stylesheet(scheme: str) -> str:
    c = _COLORS[scheme]
    return f"""
    QFrame#bubble_user {{ background: {c[7]}; border-radius: 10px; }}
    QFrame#bubble_assistant {{ background: {c[8]}; border: 1px solid {c[2]};
                              border-radius: 10px; }}
    QFrame#bubble_user QTextBrowser, QFrame#bubble_assistant QTextBrowser {{
        background: transparent; border: none; }}
    QLabel#role {{ color: {c[6]}; font-weight: 600; }}
    QLabel#muted {{ color: {c[6]}; }}
    QFrame#banner_error {{ background: {ERROR_RED}; border-radius: 6px; }}
    QFrame#banner_error QLabel {{ color: white; }}
    QFrame#banner_info {{ background: {c[2]}; border-radius: 6px; }}
    QToolButton#flat {{ border: none; color: {c[6]}; padding: 2px 6px; }}
    QToolButton#flat:hover {{ color: {c[5]}; }}
    QFrame#banner_error QToolButton#flat {{ color: white; font-weight: 600;
        border: 1px solid rgba(255, 255, 255, 190); border-radius: 4px; padding: 2px 10px; }}
    QFrame#banner_error QToolButton#flat:hover {{ background: rgba(255, 255, 255, 40); }}
    QFrame#banner_info QToolButton#flat {{ color: {c[3]}; }}
    QPlainTextEdit#composer {{ border: 1px solid {c[2]}; border-radius: 8px; padding: 6px;
                              background: {c[1]}; }}
    """


def code_background(scheme: str) -> QColor:
    return QColor("#f1f3f5" if scheme == "light" else "#1a1b1f")


class Theme:
    """Applies a palette to the whole app; with mode "system", follows the system's."""

    def __init__(self, app: QApplication, mode: str = "system") -> None:
        self._app = app
        self.mode = mode
        self.scheme = resolve(mode)
        app.setStyle("Fusion")
        QGuiApplication.styleHints().colorSchemeChanged.connect(lambda _s: self.apply())
        self.apply()

    def apply(self) -> None:
        self.scheme = resolve(self.mode)
        self._app.setPalette(palette_for(self.scheme))
        self._app.setStyleSheet(stylesheet(self.scheme))
