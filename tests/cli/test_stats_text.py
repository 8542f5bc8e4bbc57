"""`warmstart cache stats` as a table, from a server's stats or from the files alone."""

from __future__ import annotations

from pathlib import Path

from warmstart.runtime.cli._stats_text import render_stats
from warmstart.runtime.engine._fake import FakeOptions
from warmstart.runtime.types import Message, Request

from tests.conftest import fake_runtime


def test_a_servers_stats_read_as_a_table(tmp_path: Path) -> None:
    rt = fake_runtime(tmp_path, FakeOptions(prefill_delay=0.0))
    try:
        for _ in range(2):
            rt.generate(Request(messages=(Message("user", "Hello"),), session_id="s")).text()
        stats = rt.stats()
    finally:
        rt.close()
    text = render_stats(stats, "the server at http://127.0.0.1:8765")
    lines = text.splitlines()
    assert lines[0] == "KV cache (the server at http://127.0.0.1:8765, model warmstart-fake)"
    assert [line.split()[0] for line in lines[1:5]] == ["tier", "live", "ram", "disk"]
    assert "requests 2:" in text and "from the cache" in text and "hits" in text
    assert "queue" in text and "sessions 1" in text
    assert max(len(line) for line in lines) <= 100
    assert "{" not in text  # no raw JSON


def test_what_the_files_hold_reads_as_a_table_too() -> None:
    stats = {
        "source": "files (no server answered)",
        "tiers": {"disk": {"tokens": 12345, "chunks": 7, "kv_bytes": 1 << 20, "bytes": 3 << 20}},
        "sessions": 3,
    }
    text = render_stats(stats, "the files in /d/cache: no server answered")
    disk = next(line for line in text.splitlines() if line.strip().startswith("disk"))
    assert "12,345" in disk and "3.0 MiB" in disk and "7 chunks" in disk
    assert "live" not in text and "requests" not in text and "sessions 3" in text
