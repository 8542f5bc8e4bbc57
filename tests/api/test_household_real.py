"""Issue 43's isolation, measured on the real model: a real ``warmstart serve`` with a
key per person. A prompt alice sent never restores for bob (cached_tokens 0, and his
TTFT is a cold prefill's, not a hit's, both measured in the same test), after a
restart neither; a cache group shares by opt-in; cache_salt narrows within a user.
Keys and logs never hold a key in clear."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from warmstart.runtime.users import add_user

from tests.api.conftest import Server
from tests.api.real import real_server

pytestmark = pytest.mark.slow

# 1,527 tokens, the 1,500-token prompt: a cold prefill takes over ten seconds on
# two cores, a hit tens of ms.
DOC = " ".join(
    f"Section {n}: the household keeps its recipes, its timetables and its plans in "
    f"a shared notebook, page {n * 7}, written in blue ink and checked each Sunday."
    for n in range(42)
)


def _ask(srv: Server, key: str, text: str, **extra: Any) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 2,
        "temperature": 0,
        **extra,
    }
    headers = {"Authorization": f"Bearer {key}"}
    reply = httpx.post(srv.v1 + "/chat/completions", json=body, headers=headers, timeout=300)
    assert reply.status_code == 200, reply.text
    extra_out = reply.json()["x_warmstart"]
    return {"cached": extra_out["cached_tokens"], "ttft": extra_out["ttft_ms"]}


def _cold_not_hit(ttft: float, cold: float, hit: float) -> bool:
    """Nearer a cold prefill's TTFT than a hit's, both measured in this test."""
    return abs(ttft - cold) < abs(ttft - hit)


@pytest.mark.timeout(1500)  # two starts and seven cold prefills, on a loaded machine
def test_isolation_by_measurement(model_path: Path, calibration: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    keys_file = data / "keys.json"
    keys = {name: add_user(keys_file, name) for name in ("alice", "bob")}
    keys.update({name: add_user(keys_file, name, cache_group="home") for name in ("carol", "dave")})
    with real_server(model_path, data, calibration=calibration) as srv:
        cold = _ask(srv, keys["alice"], DOC)
        hit = _ask(srv, keys["alice"], DOC)
        assert cold["cached"] == 0 and hit["cached"] > 0
        assert hit["ttft"] * 3 < cold["ttft"], (cold, hit)  # the measure tells them apart
        bob = _ask(srv, keys["bob"], DOC)
        assert bob["cached"] == 0 and _cold_not_hit(bob["ttft"], cold["ttft"], hit["ttft"]), (
            bob,
            cold,
            hit,
        )
        # opted in: the group's members share the cache (alice's is still not theirs)
        carol = _ask(srv, keys["carol"], DOC)
        dave = _ask(srv, keys["dave"], DOC)
        assert carol["cached"] == 0 and dave["cached"] > 0
        # cache_salt narrows within a user
        salted = _ask(srv, keys["alice"], DOC, cache_salt="private")
        again = _ask(srv, keys["alice"], DOC, cache_salt="private")
        assert salted["cached"] == 0 and again["cached"] > 0
        assert _ask(srv, keys["alice"], DOC, cache_salt="other")["cached"] == 0
        keys["erin"] = add_user(keys_file, "erin")  # taken without a restart
    with real_server(model_path, data, calibration=calibration) as srv:
        back = _ask(srv, keys["alice"], DOC)  # from disk, after the restart
        assert back["cached"] > 0
        # the references again, beside erin's: the load on the machine moves between
        cold2 = _ask(srv, keys["alice"], DOC.replace("Section", "Part"))
        erin = _ask(srv, keys["erin"], DOC)
        hit2 = _ask(srv, keys["alice"], DOC)
        assert erin["cached"] == 0 and _cold_not_hit(erin["ttft"], cold2["ttft"], hit2["ttft"])
    for path in data.rglob("*"):
        if path.is_file():
            raw = path.read_bytes()  # the keys file, the databases, the chunks, server.log
            assert not any(k.encode() in raw for k in keys.values()), path
