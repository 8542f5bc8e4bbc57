"""Issue 22 items 2 and 6 against the real CLI, one real ``warmstart serve`` and the
real window (offscreen): one name per model everywhere, a Models panel that stays
readable after a switch, a status bar that follows it, and an app that keeps what it
showed (each reply's cache line after a restart, a chart whose empty state reads
well, readable badges, banner buttons with contrast in both themes).

The server serves the default model (SmolLM2-135M) and Gemma-3-270M from one models
directory, as ``warmstart models pull`` leaves them; it is started once for the module.
With ``WARMSTART_SCREENSHOTS=DIR`` the window tests save what they show as PNGs there
(the docs' screenshots: ``docs/screenshots/``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QApplication, QWidget
from warmstart.app.core.models import LocalModels
from warmstart.app.core.types import Sampling
from warmstart.app.qt.application import Options, WarmstartApp
from warmstart.app.qt.models import BADGE_SIZE
from warmstart.app.qt.theme import Theme
from warmstart.app.qt.views.memory_panel import axis_top, tick_label

from tests.app.servers import REAL_SETTINGS, ROOT, ServerProcess
from tests.conftest import seed_calibration, seed_extra_buffer_verdicts

pytestmark = [pytest.mark.gui, pytest.mark.slow]
SMOL, GEMMA = "smollm2-135m", "gemma-3-270m-q4_k_m"
WAIT = 15_000
REAL_WAIT = 120_000  # two shared CPU cores: a model switch or a reply can take a while
SHOTS = os.environ.get("WARMSTART_SCREENSHOTS")


@pytest.fixture(scope="module")
def data_dir(
    tmp_path_factory: pytest.TempPathFactory, model_path: Path, gemma_path: Path, calibration: Path
) -> Path:
    data = tmp_path_factory.mktemp("first-hour")
    models = data / "models"
    models.mkdir()
    for path in (model_path, gemma_path):
        (models / path.name).symlink_to(path)
    seed_extra_buffer_verdicts(data)
    seed_calibration(calibration, data)
    return data


@pytest.fixture(scope="module")
def server(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = next((data_dir / "models").glob("SmolLM2*.gguf"))

    def command(port: int) -> list[str]:
        serve = [sys.executable, "-m", "warmstart.runtime.cli", "serve", "--port", str(port)]
        return [*serve, "--data-dir", str(data_dir), "--model", str(model), *REAL_SETTINGS]

    process = ServerProcess(command, tmp_path_factory.mktemp("first-hour-log") / "server.log")
    process.start(timeout=300.0)
    yield process
    process.stop()


def cli(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "warmstart.runtime.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip


def shoot(widget: QWidget, name: str) -> None:
    """Saves what ``widget`` shows (QWidget.grab) for the docs, when asked to."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        assert widget.grab().save(str(Path(SHOTS) / f"{name}.png"))


@pytest.fixture
def themed(qapp: QApplication) -> Iterator[Theme]:
    """The app's own palette and stylesheet, as ``warmstart app`` applies them."""
    theme = Theme(qapp, "light")
    yield theme
    qapp.setStyleSheet("")
    qapp.setPalette(QApplication.style().standardPalette())


def make_app(qtbot, app_data: Path, url: str, local: LocalModels | None = None) -> WarmstartApp:
    class App(WarmstartApp):
        def _local_models(self) -> LocalModels | None:
            return local

    app = App(Options(data_dir=app_data, base_url=url, autostart=False))
    qtbot.addWidget(app.window)
    sampling = Sampling(temperature=0.0, max_tokens=8, seed=0)  # greedy and short
    app.apply_preferences(replace(app.prefs, sampling=sampling))
    app.window.resize(1280, 800)
    app.start()
    qtbot.waitUntil(lambda: app.connection.ready, timeout=REAL_WAIT)
    return app


def send(qtbot, app: WarmstartApp, text: str) -> None:
    composer = app.window.chat.composer
    composer.setFocus()
    qtbot.keyClicks(composer, text)
    with qtbot.waitSignal(app.chat.reply_finished, timeout=REAL_WAIT):
        qtbot.keyClick(composer, Qt.Key.Key_Return)


# -- one name per model ---------------------------------------------------------------


def test_the_cli_and_both_api_dialects_call_each_model_by_one_name(
    server: ServerProcess, data_dir: Path
) -> None:
    listed = cli("models", "list", "--data-dir", str(data_dir)).splitlines()
    names = [line.split()[0] for line in listed]
    assert sorted(names) == sorted([SMOL, GEMMA]), listed  # no "default", no ".gguf"

    available = cli("models", "list", "--available", "--data-dir", str(data_dir)).splitlines()
    rows = {line.split()[0]: line for line in available[1:-1]}
    assert available[-1].startswith("* installed")
    assert SMOL in rows and "*" in rows[SMOL], available  # the default is in the catalogue
    assert [n for n, row in rows.items() if " * " in row or row.endswith(" *")] == [SMOL]

    root = server.url.removesuffix("/v1")
    api = httpx.get(f"{root}/v1/models", timeout=30).json()
    assert [m["id"] for m in api["data"]] == [SMOL, GEMMA]  # the loaded one first
    assert httpx.get(f"{root}/v1/models/default", timeout=30).json()["id"] == SMOL
    tags = httpx.get(f"{root}/api/tags", timeout=30).json()["models"]
    assert sorted(m["name"] for m in tags) == sorted(f"{n}:latest" for n in (SMOL, GEMMA))
    ps = httpx.get(f"{root}/api/ps", timeout=30).json()["models"]
    assert [m["name"] for m in ps] == [f"{SMOL}:latest"]


def test_the_models_panel_lists_each_model_once_and_follows_a_switch(
    qtbot, server: ServerProcess, data_dir: Path, app_data: Path, themed: Theme
) -> None:
    local = LocalModels(data_dir / "models", data_dir / "cache")
    app = make_app(qtbot, app_data, server.url, local)
    picker = app.window.models
    qtbot.waitUntil(lambda: any(m.fit for m in picker.models), timeout=REAL_WAIT)
    app.window.models_dock.raise_()
    names = [m.name for m in picker.models]
    assert len(names) == len(set(names)) and "default" not in names
    assert not any(n.endswith(".gguf") for n in names), names
    for name in (SMOL, GEMMA):
        row = next(m for m in picker.models if m.name == name)
        assert row.served and row.installed and row.size_label and row.fit_label, row
    assert SMOL in app.window.connection_label.text()

    picker.select(GEMMA)
    qtbot.mouseClick(picker.use_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: app.models.current == GEMMA, timeout=REAL_WAIT)
    send(qtbot, app, "Hi")
    QApplication.processEvents()
    assert picker.names_fit(), [picker.table.columnWidth(c) for c in range(4)]
    assert not picker.table.horizontalScrollBar().isVisible()
    row = next(i for i, m in enumerate(picker.models) if m.name == GEMMA)
    assert picker.table.item(row, 3).text() == "in use"
    # the status bar names the model in use, through the replies after the switch
    assert (
        GEMMA in app.window.connection_label.text()
        and SMOL not in app.window.connection_label.text()
    )
    shoot(app.window.models_dock, "models-panel-after-switch")
    shoot(app.window.statusBar(), "status-bar-after-switch")
    shoot(app.window, "window-after-switch")
    # back to the default for the tests that follow
    picker.select(SMOL)
    qtbot.mouseClick(picker.use_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: app.models.current == SMOL, timeout=REAL_WAIT)
    assert SMOL in app.window.connection_label.text()
    app.window.close()


# -- the app keeps what it showed -----------------------------------------------------------


def footers(app: WarmstartApp) -> list[str]:
    return [b.footer.text() for b in app.window.chat.bubbles if b.role == "assistant"]


def test_a_reopened_conversation_shows_its_cache_lines(
    qtbot, server: ServerProcess, app_data: Path, themed: Theme
) -> None:
    app = make_app(qtbot, app_data, server.url)
    send(qtbot, app, "Name a colour.")
    send(qtbot, app, "And another one?")
    cid, shown = app.chat.current, footers(app)
    assert len(shown) == 2 and all(shown), shown
    app.window.close()

    again = make_app(qtbot, app_data, server.url)  # a new run: nothing but the files
    qtbot.waitUntil(lambda: again.chat.current == cid, timeout=WAIT)
    qtbot.waitUntil(lambda: len(again.window.chat.bubbles) == 4, timeout=WAIT)
    assert footers(again) == shown
    # shown once the reopened bubbles are laid out (after the list arrives, not with it)
    qtbot.waitUntil(
        lambda: all(b.footer.isVisibleTo(again.window) for b in again.window.chat.bubbles[1::2]),
        timeout=WAIT,
    )
    # the memory panel shows them again too: the last reply and the plot's two dots
    assert [p.report for p in again.memory.points] == [
        m.report for m in again.history.messages(cid) if m.report
    ]
    assert len(again.window.memory.plot.points) == 2
    qtbot.waitUntil(lambda: not again.window.chat.progress_banner.isVisible(), timeout=REAL_WAIT)
    shoot(again.window, "reopened-conversation-with-cache-lines")
    # deleting the conversation forgets its reports too
    again.server_history.delete(cid)
    assert again.store.kept_reports(cid) == {}
    again.window.close()


def test_the_empty_chart_the_badges_and_the_banner_read_well(
    qtbot, server: ServerProcess, app_data: Path, qapp: QApplication, themed: Theme
) -> None:
    assert (axis_top(0.4), axis_top(7.0), axis_top(180.0)) == (1.0, 10.0, 200.0)
    assert [tick_label(axis_top(1.0) * f) for f in (0.0, 0.5, 1.0)] == ["0", "1", "2"]
    app = make_app(qtbot, app_data, server.url)
    plot = app.window.memory.plot
    assert plot.points == []
    shoot(plot, "empty-ttft-chart")
    image = plot.grab().toImage()
    # no y-axis labels left of the frame: the column where "1, 1, 0" was is blank
    assert not _has_ink(image, 0, 40, plot.palette().window().color()), "labels on an empty axis"
    assert app.window.conversations.iconSize() == QSize(*BADGE_SIZE)

    for mode in ("light", "dark"):
        themed.mode = mode
        themed.apply()
        app.window.chat.show_error("Could not switch to gemma: not enough memory.", "models")
        QApplication.processEvents()
        banner = app.window.chat.error_banner
        # the button as it shows on the banner (grabbed alone, it has no background)
        image = banner.grab(banner.dismiss_button.geometry()).toImage()
        assert contrast(image) >= 4.5, mode
        shoot(app.window.chat.error_banner, f"error-banner-{mode}")
    app.window.close()


def _has_ink(image: QImage, x0: int, x1: int, background: QColor) -> bool:
    """Any pixel in columns x0..x1 far from the background (text drawn there)."""
    ref = background.lightness()
    return any(
        abs(image.pixelColor(x, y).lightness() - ref) > 60
        for x in range(x0, min(x1, image.width()))
        for y in range(image.height())
    )


def _luminance(color: QColor) -> float:
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    return (
        0.2126 * channel(color.redF())
        + 0.7152 * channel(color.greenF())
        + 0.0722 * channel(color.blueF())
    )


def contrast(image: QImage) -> float:
    """WCAG contrast between a button's background (its most common colour) and its
    text (the pixel farthest from it)."""
    counts: dict[int, int] = {}
    for x in range(image.width()):
        for y in range(image.height()):
            rgb = image.pixel(x, y)
            counts[rgb] = counts.get(rgb, 0) + 1
    back = _luminance(QColor(max(counts, key=lambda k: counts[k])))
    ink = max((_luminance(QColor(k)) for k in counts), key=lambda lum: abs(lum - back))
    high, low = max(back, ink), min(back, ink)
    return (high + 0.05) / (low + 0.05)
