"""The benchmarks: `warmstart bench` (in-process, one model) and `make bench-peers`
(warmstart against llama-server and hearth-llm, side by side, in one run)."""

from ._bench import run_bench

__all__ = [
    "run_bench",
]
