"""The memory panel says so when the server's disk tier is off (full, read-only,
damaged): a warning line with the server's reason, gone once the tier is back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from warmstart.app.core.api import ApiClient
from warmstart.app.core.memory import parse_stats
from warmstart.app.qt.application import Options, WarmstartApp
from warmstart.app.qt.views.memory_panel import MemoryPanel

from tests.app.fakes import FakeBackend

pytestmark = pytest.mark.gui
WAIT = 15_000


class DegradedBackend(FakeBackend):
    """A warmstart server whose disk tier is off until ``reason`` is cleared."""

    reason = "cannot write the disk cache: [Errno 28] No space left on device"

    def stats(self) -> dict[str, Any] | None:
        stats = super().stats()
        assert stats is not None
        disk = {"used_bytes": 0, "degraded": bool(self.reason), "degraded_reason": self.reason}
        stats["tiers"]["disk"] = disk
        return stats


def test_the_panel_warns_while_the_disk_tier_is_off(qtbot, app_data):
    backend = DegradedBackend()
    app = WarmstartApp(Options(data_dir=app_data, autostart=False), backend=backend)
    qtbot.addWidget(app.window)
    app.memory._timer.setInterval(50)
    app.start()
    panel = app.window.memory
    qtbot.waitUntil(lambda: panel.degraded.isVisible(), timeout=WAIT)
    text = panel.degraded.text()
    assert "Disk tier off" in text and "No space left on device" in text
    assert "RAM only" in text
    backend.reason = None  # space freed: the tier is back
    qtbot.waitUntil(lambda: not panel.degraded.isVisible(), timeout=WAIT)
    assert panel.degraded.text() == ""
    app.window.close()


def test_no_warning_for_a_plain_server(qtbot):
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.set_snapshot(parse_stats({"degraded": {"disk": "read-only"}}))
    assert panel.degraded.isVisible()
    panel.set_snapshot(None)  # not a warmstart server: nothing to say about tiers
    assert not panel.degraded.isVisible()


@pytest.mark.slow
def test_a_real_server_with_a_damaged_cache_dir(qtbot, make_runtime, tmp_path: Path):
    """The real runtime behind the real API (in process), its cache index garbage: the
    app's client reads the server's stats, and the panel shows the server's reason."""
    from fastapi.testclient import TestClient
    from warmstart.runtime.api import create_app

    cache = tmp_path / "cache"
    (cache / "blobs").mkdir(parents=True)
    (cache / "blobs" / "cache.db").write_bytes(b"garbage" * 1000)
    rt = make_runtime(cache_dir=cache)
    with TestClient(create_app(rt.settings, rt), base_url="http://localhost") as client:

        def forward(request: httpx.Request) -> httpx.Response:
            got = client.request(request.method, str(request.url), content=request.content)
            return httpx.Response(got.status_code, json=got.json())

        api = ApiClient("http://localhost/v1", transport=httpx.MockTransport(forward))
        stats = api.stats()
        assert stats is not None
        snap = parse_stats(stats)
        assert "disk" in snap.degraded and snap.degraded["disk"] == rt.degraded()["disk"]
        panel = MemoryPanel()
        qtbot.addWidget(panel)
        panel.show()
        panel.set_snapshot(snap)
        assert panel.degraded.isVisible()
        assert rt.degraded()["disk"].rstrip(".") in panel.degraded.text()
