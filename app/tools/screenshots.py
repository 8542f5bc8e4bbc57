"""Screenshots of the main window for the docs, light and dark.

Run ``python -m app.tools.screenshots`` (it re-runs itself under ``xvfb-run`` when no
display is set). Each theme runs in its own process against its own ``warmstart serve``
on the real model (``--model``; by default the one the tests pull, else the server
pulls the default model), with a few real conversations so the memory panel has
something to show. Each server calibrates the machine first, so a run takes about a
minute. ``--server-cmd`` (with ``{port}`` and ``{data_dir}``) swaps in another server.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..qt.application import WarmstartApp

ROOT = Path(__file__).resolve().parents[2]
TEST_MODEL = Path.home() / ".cache/warmstart-tests/models/SmolLM2-135M-Instruct.Q4_1.gguf"
SERVER_SETTINGS = [
    *("--n-ctx", "2048", "--resident-sequences", "2", "--chunk-tokens", "64"),
    *("--ram-pool-bytes", "268435456", "--prewarm-sessions", "0"),
]
SYSTEM = "You are a helpful assistant. Answer briefly and precisely, in two or three sentences."
QUESTIONS = [
    ("How does warmstart keep a conversation's KV cache?", True),
    ("Write a Python function that greets someone.", False),
    ("And how is a restore different from a prefill?", True),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    from PySide6.QtWidgets import QApplication

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not reach the expected state")
        QApplication.processEvents()
        time.sleep(0.01)


def server_command(port: int, data_dir: Path, model: str, custom: str | None) -> list[str]:
    if custom:
        return shlex.split(custom.replace("{port}", str(port)).replace("{data_dir}", str(data_dir)))
    serve = [sys.executable, "-m", "warmstart.runtime.cli", "serve", "--port", str(port)]
    return [*serve, "--data-dir", str(data_dir), "--model", model, *SERVER_SETTINGS]


def converse(app: WarmstartApp) -> str:
    """Asks QUESTIONS over two conversations, pins the first and polls the memory panel
    until it shows the tiers after the last reply; returns the first conversation."""
    first = None
    for question, in_first in QUESTIONS:
        if in_first and first is not None:
            app.chat.open(first)
        elif not in_first or first is None:
            app.chat.new_conversation()
        first = first or app.chat.current
        app.chat.send(question)
        wait_until(lambda: not app.chat.busy, 120)
    assert first is not None
    app.library.set_pinned(first, True)
    app.memory.refresh()
    wait_until(lambda: not app.memory.polling)
    app.memory.refresh()  # a second poll shows the tiers after the last reply
    wait_until(lambda: not app.memory.polling)
    return first


def shoot(theme: str, out: Path, model: str, server_cmd: str | None) -> None:
    from dataclasses import replace

    from PySide6.QtWidgets import QApplication

    from ..core.types import Sampling
    from ..qt.application import Options, WarmstartApp
    from ..qt.theme import Theme, app_icon

    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="warmstart-shots-"))
    cmd = server_command(port, work / "server", model, server_cmd)
    server = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        qapp = QApplication.instance() or QApplication([sys.argv[0]])
        assert isinstance(qapp, QApplication)
        qapp.setWindowIcon(app_icon())
        styled = Theme(qapp, theme)
        options = Options(
            data_dir=work / "app",
            base_url=f"http://127.0.0.1:{port}/v1",
            autostart=False,
            scheme=styled.scheme,
        )
        app = WarmstartApp(options)
        # seeded, so a rerun shows the same replies; short, so the chat fits the window
        sampling = Sampling(temperature=0.3, max_tokens=80, seed=7)
        app.apply_preferences(replace(app.prefs, sampling=sampling, system_prompt=SYSTEM))
        app.start()
        app.window.resize(1280, 800)
        wait_until(lambda: app.connection.ready, 180)  # the first start calibrates
        app.chat.open(converse(app))
        app.window.memory_dock.show()
        for _ in range(30):
            QApplication.processEvents()
            time.sleep(0.02)
        out.parent.mkdir(parents=True, exist_ok=True)
        app.window.grab().save(str(out))
        app.window.close()
        print(f"wrote {out}")
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--theme", choices=("light", "dark"), help="one theme (default: both)")
    parser.add_argument(
        "--model",
        default=str(TEST_MODEL) if TEST_MODEL.exists() else "default",
        help="GGUF path or model name for the server (default: the tests' model)",
    )
    parser.add_argument("--server-cmd", help="server command with {port} and {data_dir}")
    args = parser.parse_args(argv)
    if not os.environ.get("DISPLAY") and not os.environ.get("QT_QPA_PLATFORM"):
        xvfb = shutil.which("xvfb-run")
        if xvfb is None:
            print("no display and no xvfb-run: install xvfb (installers/linux/system-deps.sh)")
            return 2
        argv = sys.argv[1:] if argv is None else argv
        command = [xvfb, "-a", "-s", "-screen 0 1600x1000x24", sys.executable, "-m"]
        return subprocess.call([*command, "app.tools.screenshots", *argv], cwd=ROOT)
    if args.theme is None:
        for theme in ("light", "dark"):
            # one process per theme: a fresh QApplication picks up its palette cleanly
            rc = subprocess.call(
                [
                    sys.executable,
                    "-m",
                    "app.tools.screenshots",
                    "--theme",
                    theme,
                    "--out",
                    str(args.out),
                    "--model",
                    args.model,
                ]
                + (["--server-cmd", args.server_cmd] if args.server_cmd else []),
                cwd=ROOT,
            )
            if rc:
                return rc
        return 0
    shoot(args.theme, args.out / f"app-{args.theme}.png", args.model, args.server_cmd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
