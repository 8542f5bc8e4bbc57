"""A quick start: the KV layout is measured once, with the calibration, and a fresh
`warmstart ask` of a repeated question reaches its first token without a probe decode."""

from __future__ import annotations

from pathlib import Path

import pytest
from warmstart.runtime.bench import _ask as bench
from warmstart.runtime.engine._engine import LlamaEngine
from warmstart.runtime.serving._factory import layout_from_json, layout_to_json

from tests.conftest import chat, small_settings, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_settings")]


def test_a_calibrated_start_measures_no_kv_layout(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warmstart.runtime.serving._factory import open_runtime

    settings = small_settings(tmp_path, model_path, prewarm_sessions=0)
    question = chat("Name a colour. One word.", max_tokens=4)
    with open_runtime(settings, prewarm=False) as rt:  # calibrates, measuring the layout
        measured = rt.engine.layout
        first, _ = rt.generate(question).text()
        rt.wait_idle()

    def probe(_self: LlamaEngine) -> object:
        raise AssertionError("a calibrated start must not decode to measure the KV layout")

    monkeypatch.setattr(LlamaEngine, "_measure_layout", probe)
    with open_runtime(settings, prewarm=False) as rt:
        # the same layout, with this context's own stream count (calibration: 1 stream)
        assert rt.engine.layout == measured and rt.engine.layout.ident == measured.ident
        assert rt.engine.layout.n_stream == settings.resident_sequences
        again, report = rt.generate(question).text()
    # chunks written before restore through the kept layout: the same greedy reply
    assert report.restored["disk"] > 0 and again == first


def test_the_layout_survives_json(tmp_path: Path, model_path: Path) -> None:
    import json

    from warmstart.runtime.serving._factory import build_runtime

    with build_runtime(small_settings(tmp_path, model_path)) as rt:
        caches = rt.engine.layout.caches
    back = layout_from_json(json.loads(json.dumps(layout_to_json(caches))))
    assert back == caches and repr(back) == repr(caches)  # the ident hashes the repr


def test_cli_args_reproduce_the_settings(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warmstart.runtime.cli._flags import settings_from
    from warmstart.runtime.cli._parser import build_parser

    settings = small_settings(
        tmp_path, model_path, cors_origins=("http://a", "http://b"), no_cache=True
    )
    if "exact_replies" in type(settings).model_fields:  # a boolean whose default is True
        settings = settings.model_copy(update={"exact_replies": False})
    flags, env = bench._cli_args(settings)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["ask", "q", *flags])
    assert settings_from(args) == settings


def test_a_fresh_ask_of_a_repeated_question(tmp_path: Path, model_path: Path) -> None:
    settings = small_settings(tmp_path, model_path, prewarm_sessions=0)
    asks = bench.repeated_ask(settings)
    first, repeat = asks["first"], asks["repeat"]
    assert "from disk" in repeat["summary"] and "TTFT" in repeat["summary"]
    assert "from disk" not in first["summary"]
    # the figure itself is printed by `warmstart bench --json`; on a shared, loaded
    # machine only its order of magnitude is a fair assertion
    assert 0 < repeat["process_start_to_first_token_s"] < min(first["process_wall_s"], 60)
    print(f"process start to first token: {repeat['process_start_to_first_token_s']:.2f} s")


def test_a_first_server_answers_before_it_calibrates(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server on a fresh data dir answers at once (a 1B model calibrated for 35 s
    before its first request), on the policy's estimates and the safe choice for what
    only the calibration proves (no merged batches, no batch tile: the same greedy
    reply as --no-cache); it calibrates between requests, for the next start."""
    import json

    from warmstart.runtime.serving import _factory

    measured: list[str] = []  # the calibration's measurements, as they start
    for name in ("time_prefill", "time_state_roundtrip", "invariant_units", "batch_kinds"):
        real = getattr(_factory._CalibrationTarget, name)

        def spy(self, *args, _real=real, _name=name):  # type: ignore[no-untyped-def]
            measured.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(_factory._CalibrationTarget, name, spy)
    settings = small_settings(tmp_path / "data", model_path, prewarm_sessions=0)
    settings = settings.model_copy(update={"merge_batch_tokens": None, "batch_tile": None})
    question = chat("Name a colour. One word.", max_tokens=6)
    with _factory.open_runtime(settings, prewarm=False, calibrate_later=True) as rt:
        first, _ = rt.generate(question).text()
        assert measured == []  # nothing was measured before the reply
        assert rt.tuning.merge_batch_tokens == 0 and rt.tuning.batch_tile == 0
        assert "not measured" in rt.tuning.reasons["batch_tile"]
        kept = settings.data_dir / "calibration.json"
        assert wait_for(kept.exists, 600)  # measured between requests, then kept
    oracle = _factory.build_runtime(small_settings(tmp_path / "oracle", model_path, no_cache=True))
    with oracle:
        assert oracle.generate(question).text()[0] == first
    (entry,) = json.loads(kept.read_text())["entries"].values()
    assert entry["background"] and measured[0] == "time_prefill"
    with _factory.open_runtime(settings, prewarm=False, calibrate_later=True) as rt:
        assert "not measured" not in rt.tuning.reasons["batch_tile"]  # the next start's


def test_a_request_during_the_decode_probe_is_answered_before_the_probe_ends(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background calibration's decode probe decodes in a context of its own (a
    prefill, then up to 8 streams in lockstep: minutes on a loaded 2-core machine).
    A request that comes meanwhile stops it within one graph node, as it stops the
    other measurements, and it runs again once the worker is idle: the request is
    answered first, and the calibration still ends with the probe's verdict. Counted
    (the order of events), not timed."""
    import json
    import threading

    from warmstart.runtime.engine import _decode_probe
    from warmstart.runtime.errors import EngineError
    from warmstart.runtime.serving import _factory

    events: list[str] = []
    real_fill, real_probe = _decode_probe._Lockstep._fill, _decode_probe.probe_decode
    settings = small_settings(tmp_path / "data", model_path, prewarm_sessions=0)
    question = chat("Name a colour. One word.", max_tokens=6)

    def answer() -> None:
        rt.generate(question).text()
        events.append("request answered")

    def fill(self: _decode_probe._Lockstep) -> None:
        if "request sent" not in events:  # the first probe has begun: a request comes
            events.append("request sent")
            threading.Thread(target=answer, daemon=True).start()
            assert wait_for(lambda: len(rt.worker.waiting) > 0, 60)
        real_fill(self)

    def probe(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            out = real_probe(*args, **kwargs)
        except EngineError:
            events.append("probe stopped")
            raise
        events.append("probe done")
        return out

    monkeypatch.setattr(_decode_probe._Lockstep, "_fill", fill)
    monkeypatch.setattr(_decode_probe, "probe_decode", probe)
    with _factory.open_runtime(settings, prewarm=False, calibrate_later=True) as rt:
        kept = settings.data_dir / "calibration.json"
        assert wait_for(kept.exists, 900)
    assert events[:3] == ["request sent", "probe stopped", "request answered"]
    assert events[3:] == ["probe done"]  # run again, to its end, once the worker was idle
    (entry,) = json.loads(kept.read_text())["entries"].values()
    assert entry["decode_batch"] >= 2 or entry["decode_batch_note"]


def test_the_background_calibration_waits_after_a_request_not_after_its_own_steps() -> None:
    """``_OnWorker.quiet`` (before each measurement and each progress step) waits
    ``IDLE_S`` of idle worker after the start and after a request, not again after the
    calibration's own steps: those waits were most of a background calibration's time.
    Counted: the waits it asks for, with a worker that is always idle."""
    import threading
    from types import SimpleNamespace

    from warmstart.runtime.serving._factory import _OnWorker

    waits: list[float | None] = []
    worker = SimpleNamespace(arrivals=0, wait_idle=lambda _timeout: True)

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout)
            if len(waits) == 2:  # a request comes during this wait: it waits again
                worker.arrivals += 1
            return False

    target = SimpleNamespace(fingerprint="f", kv_bytes_per_token=1)
    on = _OnWorker(target, SimpleNamespace(worker=worker), Stop())  # type: ignore[arg-type]
    on.quiet()
    assert waits == [_OnWorker.IDLE_S]  # after the start
    on.quiet()
    on.quiet("zstd levels on real KV", 0.85)
    assert len(waits) == 1  # one step after another
    worker.arrivals += 1  # a request came and was answered
    on.quiet()
    assert len(waits) == 3  # after it, and again after the one during that wait
    on.quiet()
    assert len(waits) == 3
