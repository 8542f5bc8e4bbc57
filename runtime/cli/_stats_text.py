"""`warmstart cache stats` for people: the stats object (a server's, or what the files
hold when none answers) as a small table. ``--json`` prints the object itself.

Pure: any part the object lacks (the files know only the disk) is left out.
"""

from __future__ import annotations

from typing import Any

TIERS = ("live", "ram", "disk")


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _tier_rows(tiers: dict[str, Any]) -> list[str]:
    rows = [f"  {'tier':<6}{'tokens':>10}  {'used':>10}  {'capacity':>10}  note"]
    for name in TIERS:
        t = tiers.get(name)
        if t is None:
            continue
        cap = t.get("capacity_bytes")
        notes = []
        if t.get("chunks") is not None:
            notes.append(f"{t['chunks']:,} chunks")
        if t.get("sequences") is not None:
            notes.append(f"{t.get('resident', 0)} of {t['sequences']} sequences in use")
        if t.get("degraded"):
            notes.append(f"OFF: {t.get('degraded_reason') or 'degraded'}")
        if t.get("problem"):
            notes.append(str(t["problem"]))
        rows.append(
            f"  {name:<6}{t.get('tokens', 0):>10,}  {size(t.get('bytes', 0)):>10}  "
            f"{size(cap) if cap else '-':>10}  {'; '.join(notes)}".rstrip()
        )
    return rows


def _counter_rows(stats: dict[str, Any]) -> list[str]:
    rows = []
    if "requests" in stats:
        prompt, cached = stats.get("prompt_tokens", 0), stats.get("cached_tokens", 0)
        share = f" ({100 * cached / prompt:.0f}%)" if prompt else ""
        rows.append(
            f"  requests {stats['requests']:,}: prompt tokens {prompt:,}, from the cache "
            f"{cached:,}{share}; reply tokens {stats.get('completion_tokens', 0):,}"
        )
    hits = stats.get("hits")
    if isinstance(hits, dict):
        shown = ", ".join(f"{t} {hits.get(t, 0):,}" for t in TIERS)
        rows.append(
            f"  hits     {shown}; misses {stats.get('misses', 0):,}; "
            f"evictions {stats.get('evictions', 0):,}"
        )
    queue = stats.get("queue")
    if isinstance(queue, dict):
        rows.append(
            f"  queue    {queue.get('waiting', 0)} waiting, {queue.get('active', 0)} active "
            f"(at most {queue.get('max_queue', '?')} wait)"
        )
    if "sessions" in stats:
        rows.append(f"  sessions {stats['sessions']:,}")
    return rows


def render_stats(stats: dict[str, Any], origin: str) -> str:
    """``origin`` says whose figures these are (a server's URL, or the files)."""
    model = f", model {stats['model']}" if stats.get("model") else ""
    lines = [f"KV cache ({origin}{model})"]
    lines += _tier_rows(stats.get("tiers") or {})
    lines += _counter_rows(stats)
    return "\n".join(lines)
