"""One page of what `make gpu-check` found, from what its steps left in OUT.

Reads ``steps.tsv`` (installers/gpu/device_run.sh), ``diagnosis/diagnosis.md``
(diagnose.py) and ``gpu-check-*.json`` (gpu_check.py), whichever exist so far, and
prints markdown: the steps and how they ended, the diagnosis table, and per model
the figures the GPU issue asks for. A figure not measured (a step that failed, or no
GPU) shows as "-", never as a guess.

    python installers/gpu/summary.py OUT > OUT/summary.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# (label, path into the report, format)
FIGURES = (
    (
        "loader choice",
        ("verdicts", "loader"),
        "mmap {mmap}, pinned {pinned}, layers {n_gpu_layers}",
    ),
    ("loader verdict", ("verdicts", "loader", "reason"), "{}"),
    ("extra buffer types", ("verdicts", "extra_buffers", "enabled"), "{}"),
    ("cold TTFT (s)", ("bench", "cold_ttft_s"), "{:.3f}"),
    ("live hit (VRAM on a GPU) TTFT (s)", ("bench", "live_ttft_s"), "{:.3f}"),
    ("RAM pool hit TTFT (s)", ("bench", "ram_ttft_s"), "{:.3f}"),
    ("disk hit, fresh process, TTFT (s)", ("bench", "disk_ttft_s"), "{:.3f}"),
    ("restore GB/s (RAM hit)", ("bench", "restore_gbps"), "{:.2f}"),
    ("pinned host-to-device GB/s", ("copies", "h2d_pinned_gbps"), "{:.2f}"),
    ("PCIe link GB/s (nominal)", ("copies", "link_gbps"), "{:.2f}"),
    ("decode tok/s", ("bench", "decode_tok_s"), "{:.1f}"),
    ("policy's swap-in threshold (tokens)", ("sweep", "policy_threshold_tokens"), "{}"),
    ("measured threshold (tokens)", ("sweep", "measured_threshold_tokens"), "{}"),
    ("greedy cold = live = RAM = no cache", ("equivalence", "all_equal"), "{}"),
    ("greedy cold = RAM = disk (bench)", ("bench", "greedy_same_reply"), "{}"),
    ("`warmstart serve --n-gpu-layers -1` HTTP status", ("serve", "status"), "{}"),
)


def dig(report: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = report
    for key in path:
        if not isinstance(value, dict) or value.get(key) is None:
            return None
        value = value[key]
    return value


def figures(report: dict[str, Any]) -> list[str]:
    lines = ["| figure | value |", "|---|---|"]
    for label, path, fmt in FIGURES:
        value = dig(report, path)
        if value is None and path[0] == "bench":  # gpu_check --ours: the same figures
            value = dig(report, ("ours", *path[1:]))
        shown = (
            "-"
            if value is None
            else fmt.format(**value)
            if isinstance(value, dict)
            else fmt.format(value)
        )
        lines.append(f"| {label} | {shown} |")
    sweep = dig(report, ("sweep", "sweep")) or {}
    if sweep:
        lines += ["", "| prefix tokens | restore ms | recompute ms |", "|---|---|---|"]
        for n, row in sorted(sweep.items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {n} | {row['restore_ms']:.2f} | {row['recompute_ms']:.2f} |")
    for name, error in (report.get("errors") or {}).items():
        lines.append(f"- error in {name}: {error[-300:]}")
    return lines


def steps(out: Path) -> list[str]:
    path = out / "steps.tsv"
    if not path.is_file():
        return ["(no steps.tsv)"]
    lines = ["| step | exit | s |", "|---|---|---|"]
    for row in path.read_text().splitlines():
        name, rc, secs = [*row.split("\t"), "", ""][:3]
        said = {"0": "ok", "124": "124 (timed out)", "137": "137 (killed)"}.get(rc, rc)
        lines.append(f"| {name} | {said} | {secs} |")
    return lines


def render(out: Path) -> str:
    parts = ["# make gpu-check", "", *steps(out), ""]
    diagnosis = out / "diagnosis" / "diagnosis.md"
    parts += ["## Diagnosis", "", diagnosis.read_text() if diagnosis.is_file() else "(none)", ""]
    for path in sorted(out.glob("gpu-check-*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            parts += [f"## {path.name}", "", f"(unreadable: {exc})", ""]
            continue
        model = report.get("model") or {}
        title = f"## {path.name}: {model.get('geometry') or model.get('path', '?')}"
        gpus = dig(report, ("gpu", "gpus")) or []
        where = gpus[0].get("name", "?") if gpus else "no GPU"
        parts += [title, "", f"on {where}", "", *figures(report), ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(render(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
