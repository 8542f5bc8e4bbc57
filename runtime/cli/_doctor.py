"""``warmstart doctor``: the probe, the calibration and every chosen value with its reason.

:func:`doctor_report` builds the one JSON object ``--json`` prints;
:func:`render_doctor` turns that object into text for people. Both are pure:
the CLI does the probing, the calibrating and the printing.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from typing import Any

from .._progress import ProgressLine
from ..engine import ExtraBuffers, LoaderChoice, llama_build_info
from ..hardware import Calibration, HardwareProfile
from ..kvstore import directory_problem
from ..models import load_catalogue, model_name
from ..policy import Tuning
from ..serving import load_model, plan
from ..settings import Settings
from ._stats_text import size

_BYTES_SETTINGS = frozenset({"ram_pool_bytes", "disk_budget_bytes", "memory_floor_bytes"})


def doctor_report(
    profile: HardwareProfile,
    calibration: Calibration | None,
    tuning: Tuning,
    *,
    calibration_reused: bool | None = None,
    extra_buffers: ExtraBuffers | None = None,
    llama_build: dict[str, Any] | None = None,
    loader: LoaderChoice | None = None,
    model: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The object ``doctor --json`` prints.

    ``{"hardware": {...}, "calibration": {...} | None, "settings": {NAME:
    {"value": ..., "reason": "..."}}}``. ``calibration_reused`` (when known)
    lands in ``calibration["reused"]``; the extra-buffer choice (when known) in
    ``settings["extra_buffers"]`` (value ``"on"`` or ``"off"``); the loader's choices
    (mmap, pinned staging, offload) in ``settings["loader"]``; what the loaded
    llama.cpp library says of itself in ``hardware["llama_cpp"]``; the model (when
    known: ``{"name", "path"}``, its name as the CLI and the API call it) in
    ``model``. Everything in it is JSON-serialisable.
    """
    cal: dict[str, Any] | None = None
    if calibration is not None:
        cal = calibration.to_dict()
        cal["zstd"] = [dict(p) for p in cal["zstd"]]
        if calibration_reused is not None:
            cal["reused"] = calibration_reused
    settings = tuning.report()
    if extra_buffers is not None:
        settings["extra_buffers"] = {
            "value": "on" if extra_buffers.enabled else "off",
            "reason": extra_buffers.reason,
        }
    if loader is not None:
        settings["loader"] = {"value": loader.describe(), "reason": loader.reason}
    hardware = profile.to_dict()
    if llama_build is not None:
        hardware["llama_cpp"] = llama_build
    report = {"hardware": hardware, "calibration": cal, "settings": settings}
    return {"model": model, **report} if model is not None else report


def _hardware_lines(hw: dict[str, Any]) -> list[str]:
    cpu, mem, disk = hw["cpu"], hw["memory"], hw["disk"]
    lines = [
        f"  CPU      {cpu['model'] or '?'}: {cpu['physical_cores']} cores, "
        f"{cpu['logical_cores']} threads, {' '.join(cpu['flags']) or 'no notable flags'}",
        f"  RAM      {size(mem['total'])} total, {size(mem['available'])} available, "
        f"swap {size(mem['swap_total'])} ({size(mem['swap_free'])} free)",
    ]
    for i, gpu in enumerate(hw["gpus"]):
        if gpu.get("unified"):
            lines.append(
                f"  GPU {i}    {gpu['name']}: unified memory with the CPU "
                f"({size(gpu['vram_total'])}, {size(gpu['vram_free'])} free), no PCIe link"
            )
            continue
        link = gpu.get("pcie")
        where = "PCIe unknown"
        if link:
            where = (
                f"PCIe gen {link['gen_current']}/{link['gen_max']} "
                f"x{link['width_current']}/{link['width_max']} (~{link['gbps']:.1f} GB/s)"
            )
        lines.append(
            f"  GPU {i}    {gpu['name']}: {size(gpu['vram_total'])} VRAM, "
            f"{size(gpu['vram_free'])} free, {where}"
        )
    if not hw["gpus"]:
        lines.append("  GPU      none (CPU inference)")
    lines.append(
        f"  disk     {disk['path']}: {disk['kind']} {disk['device'] or ''}, "
        f"{size(disk['free'])} free of {size(disk['total'])}"
    )
    lines.append(f"  llama.cpp backend: {hw['backend']}   machine id {hw['machine_id']}")
    build = hw.get("llama_cpp")
    if build:
        offload = "can offload layers to a GPU" if build["gpu_offload"] else "no GPU offload"
        lines.append(f"  llama.cpp loaded: {', '.join(build['backends']) or '?'} ({offload})")
    lines += [f"  note     {note}" for note in hw.get("notes", ())]
    return lines


def _model_lines(report: dict[str, Any]) -> list[str]:
    """The model, and the extra-buffer choice as the fact it is (a smoke decode that
    died here turned them off, and the model runs without them)."""
    model = report.get("model")
    lines = ["Model", f"  {model['name']}  {model['path']}"] if model else []
    extra = report["settings"].get("extra_buffers")
    if lines and extra is not None:
        lines.append(f"  extra buffer types: {extra['value']} ({extra['reason']})")
    return [*lines, ""] if lines else []


def _calibration_lines(cal: dict[str, Any] | None, name: str = "model") -> list[str]:
    if cal is None:
        return ["  not measured (thresholds below use cautious estimates)"]
    reused = cal.get("reused")
    origin = "" if reused is None else ("reused from cache" if reused else "measured now")
    if reused and cal.get("background"):
        origin = (
            "measured in the background by the first `warmstart serve`, which answered "
            "meanwhile on estimates (no merged batches, no batch tile)"
        )
    lines = [
        f"  {name} (fingerprint {cal['fingerprint'][:16]})  {cal['seconds']:.1f} s  "
        f"{origin}".rstrip(),
        f"  prefill          {cal['prefill_tps']:.0f} tok/s "
        f"({cal['prefill_short_tokens']} tok in {cal['prefill_short_s']:.3f} s, "
        f"{cal['prefill_long_tokens']} in {cal['prefill_long_s']:.3f} s)",
        f"  KV state         get {cal['state_get_gbps']:.2f} GB/s, set {cal['state_set_gbps']:.2f}"
        f" GB/s, {cal['state_fixed_ms']:.2f} ms fixed, {cal['kv_bytes_per_token']} B/token",
        f"  RAM copy         {cal['ram_copy_gbps']:.2f} GB/s",
    ]
    for kind in ("pinned", "pageable"):
        h2d, d2h = cal.get(f"h2d_{kind}_gbps"), cal.get(f"d2h_{kind}_gbps")
        if h2d is not None and d2h is not None:
            lines.append(f"  {kind:<9}        H2D {h2d:.2f} GB/s, D2H {d2h:.2f} GB/s")
    warm = "" if cal["disk_read_cold"] else " (read may come from the page cache)"
    lines.append(
        f"  disk             write {cal['disk_write_gbps']:.2f} GB/s, read "
        f"{cal['disk_read_gbps']:.2f} GB/s, {cal['disk_fixed_ms']:.2f} ms a record{warm}"
    )
    for p in cal["zstd"]:
        lines.append(
            f"  zstd -{p['level']:<2}         ratio {p['ratio']:.3f}, compress "
            f"{p['compress_gbps']:.2f} GB/s, decompress {p['decompress_gbps']:.2f} GB/s"
        )
    return lines


_REASON_COLUMN = 53  # where a setting's reason starts: after its name and value


def _settings_lines(settings: dict[str, dict[str, Any]], width: int | None) -> list[str]:
    lines = []
    for name, entry in settings.items():
        value = entry["value"]
        shown = f"{value} ({size(value)})" if name in _BYTES_SETTINGS else str(value)
        lines += _wrap(f"  {name:<25} {shown:<24} {entry['reason']}", width, _REASON_COLUMN)
    return lines


def _wrap(line: str, width: int | None, indent: int) -> list[str]:
    """``line`` cut at spaces to ``width`` columns, the rest indented by ``indent``
    (less on a narrow terminal, so that 40 columns are left for the words)."""
    if width is None or len(line) <= width:
        return [line]
    hang = " " * max(0, min(indent, width - 40))
    return textwrap.wrap(  # the first line keeps its own indent
        line,
        width,
        subsequent_indent=hang,
        break_on_hyphens=False,
        break_long_words=False,  # a path stays whole, on a line of its own
    )


def _cache_dir_lines(report: dict[str, Any]) -> list[str]:
    cache = report["hardware"].get("cache_dir")
    if not cache:
        return []
    if cache["problem"] is None:
        return [f"  cache dir: {cache['path']} (writable)"]
    return [f"  cache dir: NOT USABLE, the cache runs from RAM only: {cache['problem']}"]


def render_doctor(report: dict[str, Any], width: int | None = None) -> str:
    """The report from :func:`doctor_report` as text, one figure or threshold a line;
    with ``width``, a longer line goes on over the next ones, indented."""
    name = (report.get("model") or {}).get("name", "model")
    head = ["Hardware", *_hardware_lines(report["hardware"]), *_cache_dir_lines(report)]
    head += ["", "Calibration", *_calibration_lines(report["calibration"], name), ""]
    parts = [w for line in [*_model_lines(report), *head] for w in _wrap(line, width, 11)]
    parts += ["Settings", *_settings_lines(report["settings"], width)]
    return "\n".join(parts) + "\n"


def doctor(settings: Settings, as_json: bool = False) -> int:
    """`warmstart doctor`: every figure and every threshold, with its reason."""
    # at once: loading, a first smoke test and a calibration take a minute on a small box
    print(
        f"warmstart doctor: loading {settings.model}, then measuring this machine",
        file=sys.stderr,
        flush=True,
    )
    loaded = load_model(settings)
    try:
        progress = None if as_json else ProgressLine(sys.stderr, lines=True)
        chosen = plan(settings, loaded, progress)
    finally:
        loaded.model.close()
    report = doctor_report(
        chosen.profile,
        chosen.calibration,
        chosen.tuning,
        calibration_reused=chosen.reused,
        extra_buffers=loaded.extra_buffers,
        loader=loaded.loader,
        llama_build=llama_build_info(),
        model={"name": model_name(loaded.path, load_catalogue()), "path": str(loaded.path)},
    )
    report["settings"]["durable_after_s"] = {
        "value": settings.durable_after_s,
        "reason": settings.durability_reason(),
    }
    cache_dir = settings.effective_cache_dir
    report["hardware"]["cache_dir"] = {
        "path": str(cache_dir),
        "problem": directory_problem(cache_dir),  # None: the disk tier can write there
    }
    print(json.dumps(report, indent=2) if as_json else render_doctor(report, _width()))
    return 0


def _width() -> int:
    """The terminal's width, or 100 columns into a file or a pipe."""
    return shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 100
