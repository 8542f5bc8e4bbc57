"""Builds a ready runtime from settings: probe the machine, load the model, calibrate
(once per machine and model), choose the thresholds, open the store, prewarm."""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._private import private_tree
from .._progress import ProgressLine
from ..engine import (
    CELL_BYTES,
    CacheLayout,
    EngineConfig,
    FakeEmbedder,
    FakeEngine,
    FakeOptions,
    LlamaEngine,
    fingerprint_of,
    gpu_offload_supported,
    on_own_thread,
)
from ..errors import EngineError
from ..hardware import (
    Calibration,
    HardwareProfile,
    cached_calibration,
    load_or_calibrate,
    probe,
)
from ..policy import (
    ModelGeometry,
    Rates,
    Tuning,
    choose,
    estimate_rates,
    fixed_tuning,
    rates_from,
)
from ..settings import Settings
from ._core import LocalRuntime
from ._embeddings import EmbeddingService
from ._load import LoadedModel, geometry_of, load_model

log = logging.getLogger(__name__)
Say = Callable[[str], None]
CALIBRATION_CTX = 4096  # tokens: enough for the longest calibration prefill
# the fake engine's "model": a small one, with a full (chunkable) cache
FAKE_GEOMETRY = ModelGeometry(
    n_ctx_train=2048,
    n_layer=1,
    kv_bytes_per_token=CELL_BYTES,
    model_bytes=0,
    swa=False,
    recurrent=False,
)


def layout_to_json(caches: tuple[CacheLayout, ...]) -> tuple[dict[str, Any], ...]:
    """The KV caches' layout as the calibration file keeps it."""
    return tuple(dataclasses.asdict(c) for c in caches)


def layout_from_json(data: tuple[dict[str, Any], ...]) -> tuple[CacheLayout, ...]:
    """Inverse of :func:`layout_to_json`, with the exact types (the layout's ident, which
    every chunk carries, is a hash of their repr)."""
    return tuple(
        CacheLayout(
            meta_bytes=int(c["meta_bytes"]),
            v_trans=bool(c["v_trans"]),
            n_layer=int(c["n_layer"]),
            k=tuple((int(t), int(row)) for t, row in c["k"]),
            v=tuple((int(t), int(size), int(n)) for t, size, n in c["v"]),
        )
        for c in data
    )


class _CalibrationTarget:
    """The loaded model seen by the calibration; a small context is made only if the
    calibration actually runs (a cached one needs no context at all)."""

    def __init__(self, loaded: LoadedModel, settings: Settings) -> None:
        self._loaded, self._settings = loaded, settings
        self.fingerprint = fingerprint_of(
            loaded.model, loaded.digest, settings.type_kv, settings.flash_attn
        )
        self.kv_bytes_per_token = loaded.model.kv_bytes_per_token_estimate(settings.type_kv)
        self.kv_layout: tuple[dict[str, Any], ...] | None = None
        self._engine: LlamaEngine | None = None

    def _get(self) -> LlamaEngine:
        if self._engine is None:
            config = engine_config(
                self._settings, self._loaded, CALIBRATION_CTX, 1, self._settings.n_gpu_layers
            )
            self._engine = LlamaEngine(config, model=self._loaded.model)
            self.kv_bytes_per_token = self._engine.kv_bytes_per_token
            if self._engine.chunkable:
                self.kv_layout = layout_to_json(self._engine.layout.caches)
        return self._engine

    def time_prefill(self, n_tokens: int) -> float:
        return self._get().time_prefill(n_tokens)

    def time_state_roundtrip(self, n_tokens: int) -> tuple[bytes, float, float]:
        return self._get().time_state_roundtrip(n_tokens)

    def invariant_units(self, total: int, units: Sequence[int]) -> tuple[int, ...]:
        return self._get().invariant_units(total, units)

    def batch_kinds(self, tile: int) -> bool:
        return self._get().batch_kinds(tile)

    def batched_decode(self, counts: Sequence[int]) -> tuple[int, str]:
        return self._get().batched_decode(counts)

    def engine(self) -> LlamaEngine:
        return self._get()

    def clear(self) -> None:
        """Empties every sequence of its context (after a measurement stopped midway)."""
        if self._engine is not None:
            for res in self._engine.residents:
                self._engine.evict(res, counted=False)
                self._engine.ctx.seq_rm(res.seq)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close(close_model=False)


@dataclass(frozen=True)
class Plan:
    profile: HardwareProfile
    calibration: Calibration | None  # None: not measured yet (see ``plan``'s ``later``)
    reused: bool
    tuning: Tuning


def plan(
    settings: Settings,
    loaded: LoadedModel,
    progress: ProgressLine | None = None,
    later: bool = False,
) -> Plan:
    """Probe, calibration (cached per machine and model) and the policy's choice.
    ``later``: a calibration not cached yet is not measured now (see
    :func:`start_calibration`); the policy then chooses from the machine's profile and
    the model's geometry, and takes the safe choice for what only a measurement proves
    (no merged batches, no batch tile: every batch is computed alone, as measured or
    not, a cold run computes it)."""
    cache_dir = settings.effective_cache_dir
    try:
        cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:  # the store says it once and runs from RAM; calibration copes
        log.debug("cannot create %s: %s", cache_dir, exc)
    profile = probe(cache_dir)
    target = _CalibrationTarget(loaded, settings)
    geometry = geometry_of(loaded.model, settings.type_kv)
    if later and not settings.recalibrate:
        found = cached_calibration(profile, target.fingerprint, _calibration_file(settings))
        if found is None:
            return Plan(profile, None, False, choose(profile, None, geometry, settings))
    try:
        calibration, reused = on_own_thread(
            lambda: load_or_calibrate(
                target,
                profile,
                _calibration_file(settings),
                settings.recalibrate,
                progress,
                cache_dir,
            )
        )
    finally:
        target.close()
    return Plan(profile, calibration, reused, choose(profile, calibration, geometry, settings))


def _calibration_file(settings: Settings) -> Path:
    return settings.data_dir / "calibration.json"


def open_runtime(
    settings: Settings,
    progress: Say | None = None,
    prewarm: bool = True,
    calibrate_later: bool = False,
) -> LocalRuntime:
    """The runtime, ready. ``calibrate_later`` (a server): on a machine and model not
    calibrated yet it answers at once, on the policy's estimates, and calibrates in
    the background (:func:`start_calibration`); otherwise the calibration comes first."""
    say = progress or (lambda msg: log.info("%s", msg))
    tighten(settings)
    say(f"loading model {settings.model} ...")
    loaded = load_model(settings)
    chosen = plan(settings, loaded, ProgressLine(sys.stderr) if progress else None, calibrate_later)
    geometry = geometry_of(loaded.model, settings.type_kv)
    if chosen.calibration is None:
        say("not calibrated yet: serving on estimates, calibrating in the background")
        rates = estimate_rates(chosen.profile, geometry).rates
    else:
        if not chosen.reused:
            say("calibrated this machine for this model (cached for next time)")
        rates = rates_from(chosen.calibration, chosen.tuning.zstd_level)
    kept = chosen.calibration.kv_layout if chosen.calibration is not None else None
    layout = layout_from_json(kept) if kept is not None else None
    rt = build_runtime(settings, loaded, chosen.tuning, rates, layout)
    if chosen.calibration is None:
        start_calibration(rt, settings, loaded, chosen.profile)
    if prewarm and rt.store is not None and rt.tuning.prewarm_sessions > 0:
        start_prewarm(rt, rt.tuning.prewarm_sessions)
    return rt


def engine_config(
    settings: Settings,
    loaded: LoadedModel,
    n_ctx: int,
    resident_sequences: int,
    n_gpu_layers: int,
    kv_layout: tuple[CacheLayout, ...] | None = None,
) -> EngineConfig:
    """The llama.cpp engine's configuration: the runtime's and the calibration's."""
    s = settings
    return EngineConfig(
        model_path=loaded.path,
        model_digest=loaded.digest,
        n_ctx=n_ctx,
        resident_sequences=resident_sequences,
        n_threads=s.n_threads or 0,
        decode_threads=s.decode_threads or 0,
        n_gpu_layers=n_gpu_layers,
        flash_attn=s.flash_attn,
        type_kv=s.type_kv,
        kv_layout=kv_layout,
        step_replies=_step_replies(s, n_gpu_layers),
    )


def _step_replies(settings: Settings, n_gpu_layers: int) -> bool:
    """Stepping through replies pays where a re-prefill is dear (a CPU) and a decode
    step not much dearer than a prefilled token; on a GPU it is the other way round."""
    if settings.step_replies is not None:
        return settings.step_replies
    return n_gpu_layers == 0 or not gpu_offload_supported()


def build_runtime(
    settings: Settings,
    loaded: LoadedModel | None = None,
    tuning: Tuning | None = None,
    rates: Rates | None = None,
    kv_layout: tuple[CacheLayout, ...] | None = None,
) -> LocalRuntime:
    """The runtime on the llama.cpp engine. ``loaded``, ``tuning``, ``rates`` and
    ``kv_layout`` come from :func:`open_runtime` (probe, calibration, policy); left
    out (tests, tools), the model is loaded here, fixed defaults are used and the
    engine measures its KV layout."""
    loaded = loaded or load_model(settings)
    tuning = tuning or fixed_tuning(settings, geometry_of(loaded.model, settings.type_kv))
    config = engine_config(
        settings,
        loaded,
        tuning.n_ctx,
        tuning.resident_sequences,
        loaded.model.n_gpu_layers,
        kv_layout,
    )
    engine = LlamaEngine(config, model=loaded.model)
    model_id = loaded.path.stem if settings.model != "default" else "default"
    embeddings = EmbeddingService.for_settings(settings, loaded.model, model_id)
    return LocalRuntime(
        settings, engine, embeddings, tuning, rates, model_id=model_id, loader=loaded.loader
    )


def open_fake_runtime(
    settings: Settings,
    options: FakeOptions | None = None,
    runtime_class: type[LocalRuntime] = LocalRuntime,
) -> LocalRuntime:
    """The same runtime over the fake engine (runtime/engine/_fake.py): no model file,
    no probe, no calibration; the settings' thresholds or fixed defaults.
    ``runtime_class``: a subclass of LocalRuntime (tests that watch or break one)."""
    options = options or FakeOptions()
    tuning = fixed_tuning(settings, FAKE_GEOMETRY)
    if options.n_ctx is not None:
        reasons = {**tuning.reasons, "n_ctx": "the fake engine's option"}
        tuning = dataclasses.replace(tuning, n_ctx=options.n_ctx, reasons=reasons)
    engine = FakeEngine(tuning.n_ctx, tuning.resident_sequences, options)
    embeddings = FakeEmbedder(options, tuning.n_ctx)
    return runtime_class(settings, engine, embeddings, tuning, model_id=options.model_id)


# What warmstart keeps in the data dir and in a cache dir (see docs/security.md)
DATA_ENTRIES = ("sessions*.db*", "*.json*", "cache", "models")
CACHE_ENTRIES = ("index.db*", "blobs")


def tighten(settings: Settings) -> None:
    """Makes what warmstart keeps in the data and cache directories private before
    anything reads it (see runtime/_private.py); the directories themselves are
    checked where they are opened."""
    data, cache = settings.data_dir, settings.effective_cache_dir
    changed = private_tree(data, DATA_ENTRIES)
    if cache != data / "cache":  # a cache dir of its own: its entries too
        changed += private_tree(cache, CACHE_ENTRIES)
    if changed:
        log.warning(
            "made %d files and folders of %s private: others could read them", changed, data
        )


def model_opener(settings: Settings, progress: Say | None = None) -> Callable[[Path], LocalRuntime]:
    """Opens another model file with the same settings (the server's model switch)."""

    def open_model(path: Path) -> LocalRuntime:
        switched = settings.model_copy(update={"model": str(path)})
        return open_runtime(switched, progress, calibrate_later=not settings.calibrate_first)

    return open_model


class _OnWorker:
    """The calibration's target, measured on the runtime's worker thread between
    requests: a measurement never runs beside a request's decode (each would slow the
    other, and the figures would be wrong), and waits while any request is in flight
    or for ``IDLE_S`` after one (and after the start), so that a client's next request
    finds the worker free; one measurement after another does not wait again. A request
    that comes meanwhile stops the measurement at once (``Worker.stoppable``), which is
    measured again once the worker is idle."""

    IDLE_S = 2.0

    def __init__(self, target: _CalibrationTarget, rt: LocalRuntime, stop: threading.Event):
        self._target, self._rt, self._stop = target, rt, stop
        self.fingerprint = target.fingerprint
        self.kv_bytes_per_token = target.kv_bytes_per_token
        self.kv_layout: tuple[dict[str, Any], ...] | None = None
        self._seen = -1  # the worker's arrivals when it was last found quiet (-1: never)

    def quiet(self, *_progress: object) -> None:
        """Returns once the worker is idle and no request came in the last ``IDLE_S``
        (none since it was last found so: no second wait); the calibration's progress
        callback too, so that its measurements without the model (RAM, disk, zstd:
        seconds of a core each) start only while no client waits either."""
        worker = self._rt.worker
        while not self._stop.is_set():
            idle = worker.wait_idle(0.5)
            if idle and worker.arrivals == self._seen:
                return
            seen = worker.arrivals
            quiet = idle and not self._stop.wait(self.IDLE_S) and worker.wait_idle(0)
            if quiet and worker.arrivals == seen:
                self._seen = seen
                return
        raise _Stopped

    def _run(self, fn: Callable[[], Any]) -> Any:
        while True:
            self.quiet()
            out, stopped = self._rt.on_worker(lambda: self._measure(fn))
            if not stopped:
                # measured on the context the target makes for them (see the protocol)
                self.kv_bytes_per_token = self._target.kv_bytes_per_token
                self.kv_layout = self._target.kv_layout
                return out

    def _measure(self, fn: Callable[[], Any]) -> tuple[Any, bool]:
        """On the worker thread: ``fn`` as work a request stops (and nothing left of it)."""
        out, stopped = self._rt.worker.stoppable(self._target.engine(), fn)
        if stopped:
            self._target.clear()
        return out, stopped

    def time_prefill(self, n_tokens: int) -> float:
        return self._run(lambda: self._target.time_prefill(n_tokens))  # type: ignore[no-any-return]

    def time_state_roundtrip(self, n_tokens: int) -> tuple[bytes, float, float]:
        return self._run(lambda: self._target.time_state_roundtrip(n_tokens))  # type: ignore[no-any-return]

    def invariant_units(self, total: int, units: Sequence[int]) -> tuple[int, ...]:
        return self._run(lambda: self._target.invariant_units(total, units))  # type: ignore[no-any-return]

    def batch_kinds(self, tile: int) -> bool:
        return self._run(lambda: self._target.batch_kinds(tile))  # type: ignore[no-any-return]

    def batched_decode(self, counts: Sequence[int]) -> tuple[int, str]:
        return self._run(lambda: self._target.batched_decode(counts))  # type: ignore[no-any-return]


class _Stopped(Exception):
    """The runtime closed before the background calibration ended."""


def start_calibration(
    rt: LocalRuntime, settings: Settings, loaded: LoadedModel, profile: HardwareProfile
) -> threading.Thread:
    """Calibrates this machine for this model in the background, on the worker thread
    between requests (see ``_OnWorker``), and keeps the result (calibration.json) for
    the next start, whose policy chooses from it; this one then restores by the rates
    measured. Nothing exact rests on it meanwhile (see :func:`plan`)."""
    stop = threading.Event()

    def run() -> None:
        target = _CalibrationTarget(loaded, settings)
        try:
            on_worker = _OnWorker(target, rt, stop)
            cal, _ = load_or_calibrate(
                on_worker,
                profile,
                _calibration_file(settings),
                progress=on_worker.quiet,
                cache_dir=settings.effective_cache_dir,
                background=True,
            )
            rates = rates_from(cal, rt.tuning.zstd_level)
            rt.on_worker(lambda: setattr(rt.env, "rates", rates))
            log.info("calibrated in the background in %.1f s; its thresholds apply from the "
                     "next start", cal.seconds)  # fmt: skip
        except (_Stopped, EngineError):
            log.info("the background calibration stopped with the runtime")
        except Exception:  # a failed calibration leaves the estimates: never the runtime
            log.exception("the background calibration failed")
        finally:
            try:
                rt.on_worker(target.close)  # its context is freed where it was used
            except EngineError:  # the worker has ended: nothing else uses the model now
                target.close()

    thread = threading.Thread(target=run, name="calibration", daemon=True)
    rt.add_background(thread, stop)
    thread.start()
    return thread


def start_prewarm(rt: LocalRuntime, n: int) -> threading.Thread:
    """Promotes the most recent conversations from disk to RAM in the background:
    the first request never waits for it (the store's locks keep both consistent).
    The runtime's close() stops it and waits for it before closing the store."""
    stop = threading.Event()

    def run() -> None:
        try:
            tokens = rt.prewarm_recent(n, stop)
            log.info("prewarmed %d tokens of the %d most recent conversations", tokens, n)
        except Exception:  # prewarm is an optimisation: never take the runtime down
            if not stop.is_set():  # closing under it is expected, not a failure
                log.exception("prewarm failed")

    thread = threading.Thread(target=run, name="prewarm", daemon=True)
    rt.add_background(thread, stop)
    thread.start()
    return thread
