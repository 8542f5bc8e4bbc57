"""Restore or recompute: the one decision made on every request (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from ._types import Rates


@dataclass(frozen=True)
class Decision:
    restore: bool
    reason: str
    restore_ms: float
    recompute_ms: float


def estimate_recompute_ms(tokens: int, rates: Rates) -> float:
    return 1000.0 * tokens / max(rates.prefill_tps, 1e-6)


def estimate_restore_ms(nbytes: int, tier: str, rates: Rates) -> float:
    gbps = rates.tier_gbps.get(tier, 0.0)
    if gbps <= 0:
        return float("inf")
    return rates.fixed_ms.get(tier, 0.0) + 1000.0 * nbytes / (gbps * 1e9)


def decide_restore(
    tokens: int, nbytes: int, tier: str, threshold_tokens: int, rates: Rates, live: int = 0
) -> Decision:
    """Restore ``tokens`` cached tokens (``nbytes`` of KV, slowest source ``tier``)
    only when they reach the swap-in threshold and restoring is estimated faster
    than recomputing them. ``live``: how many tokens before them the sequence already
    holds; a restore loads them too (a blob replaces what a sequence holds), so
    ``nbytes`` covers all of it, and the reason says how many tokens are loaded."""
    restore_ms = estimate_restore_ms(nbytes, tier, rates)
    recompute_ms = estimate_recompute_ms(tokens, rates)
    loaded = f"{live + tokens} tokens" + (f" ({tokens} beyond the {live} live)" if live else "")
    if tokens <= 0:
        return Decision(False, "no cached prefix", restore_ms, recompute_ms)
    if tokens < threshold_tokens:
        return Decision(
            False,
            f"{tokens} cached tokens is below the swap-in threshold of {threshold_tokens}",
            restore_ms,
            recompute_ms,
        )
    if restore_ms >= recompute_ms:
        return Decision(
            False,
            f"restoring {loaded} from {tier} (~{restore_ms:.1f} ms) is not faster "
            f"than recomputing {tokens} (~{recompute_ms:.1f} ms)",
            restore_ms,
            recompute_ms,
        )
    return Decision(
        True,
        f"restore {loaded} from {tier} (~{restore_ms:.1f} ms) "
        f"instead of recomputing {tokens} (~{recompute_ms:.1f} ms)",
        restore_ms,
        recompute_ms,
    )
