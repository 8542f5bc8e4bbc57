"""What the soak run (`_soak`) looks at and what it reports: the server process's
memory and open files (from /proc), the cache folder's size against its budget, the
errors by kind, the restores after the kill and the sample checked against
``--no-cache``; the criteria, the printed report and its JSON."""

from __future__ import annotations

import collections
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._soak_load import Exchange

MiB = 1 << 20
RSS_GROWTH = 0.10  # the end's RSS may exceed the middle's by this much


@dataclass(frozen=True)
class ProcSample:
    """The server process at one moment: its resident memory and open descriptors."""

    label: str
    t_s: float  # seconds since the run began
    pid: int
    rss_bytes: int
    fds: int

    @classmethod
    def of(cls, pid: int, label: str, began: float) -> ProcSample:
        rss = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024  # kB
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return cls(label, round(time.monotonic() - began, 1), pid, rss, fds)


def log_errors(path: Path) -> list[str]:
    """The lines of a server's log that say something failed (a traceback, an error)."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return [line for line in text.splitlines() if "Traceback" in line or "ERROR" in line]


def folder_bytes(path: Path) -> int:
    """What a folder really occupies (allocated blocks of its files), walked."""
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


@dataclass
class Durable:
    """A chat answered more than ``durable_after_s`` before the kill, continued after
    the restart: it restored if its cached tokens cover its previous prompt's
    canonical chunks (those a cold prefill computed as whole aligned batches)."""

    user: str
    answered_before_kill_s: float
    previous_prompt: int
    needed: int
    cached: int
    status: int | None

    @property
    def restored(self) -> bool:
        return self.status == 200 and self.cached >= self.needed

    @property
    def telling(self) -> bool:
        """Whether its previous prompt had a whole chunk to restore (a shorter one
        restores nothing, stored or lost alike)."""
        return self.needed > 0


@dataclass
class Checked:
    """One sampled reply asked again of a ``--no-cache`` server."""

    user: str
    kind: str
    phase: str
    prompt_tokens: int
    cached_tokens: int
    same: bool
    cached_text: str
    no_cache_text: str


@dataclass
class Report:
    settings: dict[str, Any]
    minutes: float
    kill_at_s: float = 0.0
    samples: list[ProcSample] = field(default_factory=list)  # start, middle, end...
    timeline: list[dict[str, Any]] = field(default_factory=list)  # stats every few s
    disk_budget_bytes: int = 0
    disk_peak_bytes: int = 0
    disk_end_bytes: int = 0
    culled_chunks: int = 0  # chunks the disk budget evicted, both processes
    durable: list[Durable] = field(default_factory=list)
    checked: list[Checked] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)
    log_errors: dict[str, list[str]] = field(default_factory=dict)  # server log -> lines

    kill_mono: float = float("inf")  # the kill's time.monotonic()

    def point(self, label: str) -> ProcSample | None:
        return next((s for s in self.samples if s.label == label), None)

    def outcomes(self) -> dict[str, int]:
        """Requests by outcome: "200", other status codes, connection errors at the
        kill (sent before it, cut by it) and elsewhere, by exception."""
        out: collections.Counter[str] = collections.Counter()
        for ex in self.exchanges:
            if ex.status is not None:
                out[str(ex.status)] += 1
            elif ex.phase == "first" and ex.ended >= self.kill_mono:
                out["connection error at the kill"] += 1
            else:
                out[f"connection error ({ex.error.split(':')[0]})"] += 1
        return dict(sorted(out.items()))

    def criteria(self) -> dict[str, bool]:
        outcomes = self.outcomes()
        middle, end = self.point("middle (before the kill)"), self.point("end")
        rss_ok = bool(middle and end and end.rss_bytes <= middle.rss_bytes * (1 + RSS_GROWTH))
        others = [k for k in outcomes if k.startswith("connection error (")]
        return {
            "zero wrong replies in the sample": bool(self.checked)
            and all(c.same for c in self.checked),
            "zero 5xx": not any(k.startswith("5") for k in outcomes),
            "no connection error but at the kill": not others,
            f"RSS at the end within {RSS_GROWTH:.0%} of the middle": rss_ok,
            "disk within its budget": self.disk_peak_bytes <= self.disk_budget_bytes,
            "disk filled to its budget (chunks evicted)": self.culled_chunks > 0,
            "no error in the server logs": not any(self.log_errors.values()),
            "every durable conversation restored": any(d.telling for d in self.durable)
            and all(d.restored for d in self.durable),
        }


def _mib(n: int) -> str:
    return f"{n / MiB:,.1f} MiB"


def render(r: Report) -> str:
    """The report as text, criteria last."""
    kinds = collections.Counter(ex.kind for ex in r.exchanges if ex.ok)
    served = sum(kinds.values())
    lines = [
        f"soak: {r.minutes:g} minutes of load, the server SIGKILLed at {r.kill_at_s:.0f} s "
        "and restarted on the same data dir",
        "settings: " + ", ".join(f"{k} {v}" for k, v in r.settings.items()),
        f"requests served: {served} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})",
        "outcomes: " + ", ".join(f"{k}: {n}" for k, n in r.outcomes().items()),
        "server process (RSS, open fds):",
        *(
            f"  {s.label:28s} {_mib(s.rss_bytes):>12s}  {s.fds:4d} fds  at {s.t_s:7.1f} s"
            for s in r.samples
        ),
        f"disk: budget {_mib(r.disk_budget_bytes)}, most seen {_mib(r.disk_peak_bytes)}, "
        f"at the end {_mib(r.disk_end_bytes)}; {r.culled_chunks} chunks evicted by the budget",
    ]
    for name, errors in r.log_errors.items():
        lines += [f"{name}: {len(errors)} error lines, the first: {errors[0]}"] if errors else []
    lines += _durable_lines(r) + _checked_lines(r)
    lines.append("criteria:")
    lines += [f"  {'PASS' if ok else 'FAIL'}  {name}" for name, ok in r.criteria().items()]
    return "\n".join(lines)


def _durable_lines(r: Report) -> list[str]:
    telling = [d for d in r.durable if d.telling]
    restored = sum(d.restored for d in telling)
    out = [
        f"after the restart: {restored} of {len(telling)} conversations answered more than "
        "durable_after_s before the kill restored from disk when continued (cached tokens "
        f"covering their previous prompt's whole chunks); {len(r.durable) - len(telling)} "
        "more had a previous prompt shorter than one chunk (nothing to restore)"
    ]
    for d in r.durable:
        if not d.restored:
            out.append(
                f"  NOT restored: {d.user}'s, answered {d.answered_before_kill_s:.1f} s before "
                f"the kill, previous prompt {d.previous_prompt} tokens, needed {d.needed}, "
                f"cached {d.cached} (status {d.status})"
            )
    return out


def _checked_lines(r: Report) -> list[str]:
    same = sum(c.same for c in r.checked)
    out = [f"sample against --no-cache: {same} of {len(r.checked)} greedy replies identical"]
    for c in r.checked:
        mark = "same" if c.same else "DIFFERENT"
        out.append(
            f"  {mark:9s} {c.user:6s} {c.phase:7s} {c.kind:11s} prompt {c.prompt_tokens:5d}, "
            f"cached {c.cached_tokens:5d}"
        )
        if not c.same:
            out.append(f"    cached:   {c.cached_text[:200]!r}")
            out.append(f"    no-cache: {c.no_cache_text[:200]!r}")
    return out


def to_json(r: Report) -> dict[str, Any]:
    """The report as JSON (every exchange's outcome, not its text)."""
    return {
        "minutes": r.minutes,
        "settings": r.settings,
        "kill_at_s": r.kill_at_s,
        "outcomes": r.outcomes(),
        "served_by_kind": dict(collections.Counter(ex.kind for ex in r.exchanges if ex.ok)),
        "process": [asdict(s) for s in r.samples],
        "timeline": r.timeline,
        "disk": {
            "budget_bytes": r.disk_budget_bytes,
            "peak_bytes": r.disk_peak_bytes,
            "end_bytes": r.disk_end_bytes,
            "culled_chunks": r.culled_chunks,
        },
        "durable": [{**asdict(d), "restored": d.restored, "telling": d.telling} for d in r.durable],
        "checked": [asdict(c) for c in r.checked],
        "log_errors": r.log_errors,
        "criteria": r.criteria(),
    }
