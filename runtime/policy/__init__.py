"""The policy: pure functions from the machine and the model to the runtime's thresholds."""

from ._choose import choose, host_reserve, vram_reserve
from ._decide import Decision, decide_restore, estimate_recompute_ms
from ._fixed import fixed_tuning
from ._rates import choose_zstd_level, estimate_rates, rates_from
from ._types import ModelGeometry, Rates, Tuning

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
    "host_reserve",
    "rates_from",
    "vram_reserve",
]
