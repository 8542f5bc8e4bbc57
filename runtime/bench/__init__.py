"""The benchmarks: `warmstart bench` (in-process, one model), `make bench-peers`
(warmstart against llama-server and hearth-llm, side by side, in one run) and `make
bench-soak` (a household's load on a real server for half an hour, a crash amid it).

Names load on first use: the timed child processes run ``python -m`` on a module of
this package, which must not be imported before it runs as ``__main__``.
"""

from typing import TYPE_CHECKING

from .._lazy import on_first_use as _on_first_use

if TYPE_CHECKING:
    from ._bench import run_bench
    from ._paste import render_paste, run_paste
    from ._replies import render_replies, run_replies

__all__ = [
    "render_paste",
    "render_replies",
    "run_bench",
    "run_paste",
    "run_replies",
]

_WHERE = {
    "run_bench": "._bench",
    "run_paste": "._paste",
    "render_paste": "._paste",
    "run_replies": "._replies",
    "render_replies": "._replies",
}

__getattr__ = _on_first_use(__name__, _WHERE)
