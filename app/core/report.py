"""What the server said about one reply, and the sentences the app shows for it.

The server's ``x_warmstart`` block mirrors ``runtime.types.Report``; the app does not
import it (it is a client of the HTTP API), so this module reads the JSON tolerantly:
unknown keys are ignored, missing ones default, and a plain OpenAI server (``usage``
only) still yields a report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TIERS: tuple[str, ...] = ("live", "ram", "disk")
TIER_LABELS = {"live": "live context", "ram": "RAM", "disk": "disk", "none": "not cached"}


def _num(value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _int(value: Any) -> int:
    return int(_num(value))


@dataclass(frozen=True)
class ReplyReport:
    """Where one reply's prompt came from and what it cost. Times in milliseconds."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    restored: dict[str, int] = field(default_factory=dict)
    restore_ms: float = 0.0
    prefill_ms: float = 0.0
    ttft_ms: float | None = None
    total_ms: float | None = None
    finish_reason: str = "stop"
    decision: str = ""
    cached_tokens: int = 0
    warmstart: bool = False  # False: only the OpenAI ``usage`` was available
    # why the prompt reused less than its conversation's previous one (x_warmstart's
    # divergence text), "" when it did not
    divergence: str = ""

    @property
    def prefilled_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)

    @property
    def hit_tier(self) -> str:
        """The tier most of the restored prompt came from, or "none" for a miss."""
        best = max(TIERS, key=lambda t: self.restored.get(t, 0))
        return best if self.restored.get(best, 0) > 0 else "none"

    @classmethod
    def from_payload(
        cls,
        x_warmstart: dict[str, Any] | None,
        usage: dict[str, Any] | None,
        *,
        finish_reason: str | None = None,
        ttft_ms: float | None = None,
        total_ms: float | None = None,
    ) -> ReplyReport:
        """Build from a final chunk's ``x_warmstart`` and ``usage``; client-side timings
        fill in what the server did not say."""
        usage = usage if isinstance(usage, dict) else {}
        details = usage.get("prompt_tokens_details")
        usage_cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        if not isinstance(x_warmstart, dict):
            return cls(
                prompt_tokens=_int(usage.get("prompt_tokens")),
                completion_tokens=_int(usage.get("completion_tokens")),
                cached_tokens=usage_cached,
                finish_reason=finish_reason or "stop",
                ttft_ms=ttft_ms,
                total_ms=total_ms,
            )
        x = x_warmstart
        raw = x.get("restored")
        restored = {t: _int(raw.get(t)) for t in TIERS} if isinstance(raw, dict) else {}
        cached = _int(x["cached_tokens"]) if "cached_tokens" in x else sum(restored.values())
        return cls(
            prompt_tokens=_int(x.get("prompt_tokens", usage.get("prompt_tokens"))),
            completion_tokens=_int(x.get("completion_tokens", usage.get("completion_tokens"))),
            restored=restored,
            restore_ms=_num(x.get("restore_ms")),
            prefill_ms=_num(x.get("prefill_ms")),
            ttft_ms=_num(x["ttft_ms"]) if x.get("ttft_ms") is not None else ttft_ms,
            total_ms=_num(x["total_ms"]) if x.get("total_ms") is not None else total_ms,
            finish_reason=str(x.get("finish_reason") or finish_reason or "stop"),
            decision=str(x.get("decision") or ""),
            cached_tokens=cached,
            warmstart=True,
            divergence=_divergence(x.get("divergence")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "restored": dict(self.restored),
            "restore_ms": self.restore_ms,
            "prefill_ms": self.prefill_ms,
            "ttft_ms": self.ttft_ms,
            "total_ms": self.total_ms,
            "finish_reason": self.finish_reason,
            "decision": self.decision,
            "cached_tokens": self.cached_tokens,
            "warmstart": self.warmstart,
            "divergence": self.divergence,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplyReport:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def _divergence(value: Any) -> str:
    return str(value.get("text") or "") if isinstance(value, dict) else ""


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 1 else f"{value:.1f} ms"


def format_status(report: ReplyReport) -> str:
    """One line for the status bar, e.g.
    ``restored 1,812 tokens from RAM in 9 ms, prefilled 14 in 80 ms``."""
    if not report.warmstart:
        text = f"{report.prompt_tokens:,} prompt tokens"
        if report.cached_tokens:
            text += f" ({report.cached_tokens:,} cached by the server)"
        text += f", {report.completion_tokens:,} generated"
    else:
        pieces = [
            f"{report.restored[t]:,} {'tokens ' if i == 0 else ''}from {TIER_LABELS[t]}"
            for i, t in enumerate(t for t in TIERS if report.restored.get(t))
        ]
        if pieces:
            text = f"restored {' and '.join(pieces)} in {_ms(report.restore_ms)}, "
            text += f"prefilled {report.prefilled_tokens:,} in {_ms(report.prefill_ms)}"
        else:
            text = (
                f"no cache hit: prefilled {report.prefilled_tokens:,} tokens "
                f"in {_ms(report.prefill_ms)}"
            )
    if report.ttft_ms is not None:
        text += f" · first token after {_ms(report.ttft_ms)}"
    if report.finish_reason == "cancelled":
        text += " · stopped"
    elif report.finish_reason == "length":
        text += " · cut at max tokens"
    if report.divergence:
        text += f" · recomputed from {report.divergence}"
    return text


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"


def format_degraded(degraded: dict[str, str]) -> str:
    """The memory panel's warning while part of the cache is off, e.g. ``Disk tier off:
    the cache disk is full. Replies come from RAM only; the disk tier comes back by
    itself once it can write again.``; "" when all is well."""
    lines = []
    for part, why in degraded.items():
        label = TIER_LABELS.get(part, part)
        name = f"{label[:1].upper()}{label[1:]} tier off"
        if part == "disk":
            detail = (
                "Replies come from RAM only; the disk tier comes back by itself once it "
                "can write again."
            )
        else:
            detail = "The server runs without it for now."
        lines.append(f"{name}: {why.rstrip('.') or 'no reason given'}. {detail}")
    return "\n".join(lines)
