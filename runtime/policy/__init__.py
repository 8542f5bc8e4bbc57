"""The policy: pure functions from the machine and the model to the runtime's thresholds."""

from runtime.policy._choose import choose
from runtime.policy._decide import Decision, decide_restore, estimate_recompute_ms
from runtime.policy._fixed import fixed_tuning
from runtime.policy._rates import choose_zstd_level, estimate_rates, rates_from
from runtime.policy._types import ModelGeometry, Rates, Tuning

__all__ = [
    "Decision",
    "ModelGeometry",
    "Rates",
    "Tuning",
    "choose",
    "choose_zstd_level",
    "decide_restore",
    "estimate_rates",
    "estimate_recompute_ms",
    "fixed_tuning",
    "rates_from",
]
