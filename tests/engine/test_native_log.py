"""llama.cpp's log through logging: lines assembled from pieces, cut short, rate-limited
(issue 23: a refused grammar put 80 kB on stderr per request)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from warmstart.runtime.engine._native_log import (
    GGML_CONT,
    GGML_ERROR,
    GGML_INFO,
    GGML_WARN,
    NativeLog,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _log(caplog: pytest.LogCaptureFixture, **kw: object) -> tuple[NativeLog, Clock]:
    caplog.set_level(logging.DEBUG, logger="test.native")
    clock = Clock()
    return NativeLog(logging.getLogger("test.native"), clock=clock, **kw), clock  # type: ignore[arg-type]


def _messages(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records]


def test_pieces_make_one_line_at_the_level_they_began_with(
    caplog: pytest.LogCaptureFixture,
) -> None:
    native, _ = _log(caplog)
    native.write(GGML_WARN, "loading")
    for _ in range(3):
        native.write(GGML_CONT, ".")
    native.write(GGML_CONT, " done\nfailed to parse grammar\n")
    native.write(GGML_ERROR, "two\n100% lines\n")
    assert _messages(caplog) == [
        (logging.INFO, "loading... done"),
        (logging.INFO, "failed to parse grammar"),
        (logging.WARNING, "two"),
        (logging.WARNING, "100% lines"),
    ]


def test_a_long_line_is_cut_and_says_how_much(caplog: pytest.LogCaptureFixture) -> None:
    native, _ = _log(caplog, line_chars=10)
    native.write(GGML_ERROR, "x" * 8)
    native.write(GGML_CONT, "y" * 80_000)
    native.write(GGML_CONT, "\n")
    assert _messages(caplog) == [
        (logging.WARNING, "xxxxxxxxyy [79998 more characters]"),
    ]


def test_a_flood_is_rate_limited_and_the_dropped_lines_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    native, clock = _log(caplog, burst=5, rate_per_s=1.0)
    native.write(GGML_ERROR, "flood\n" * 1000)
    assert len(caplog.records) == 5 and native.suppressed == 995
    clock.now = 2.0  # two lines' worth of tokens
    native.write(GGML_ERROR, "later\n" * 3)
    assert _messages(caplog)[5:] == [
        (logging.WARNING, "995 log lines suppressed"),
        (logging.WARNING, "later"),
        (logging.WARNING, "later"),
    ]
    assert native.suppressed == 1


def test_lines_below_the_loggers_level_are_dropped_without_a_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    native, _ = _log(caplog, burst=1, rate_per_s=0.0)
    logging.getLogger("test.native").setLevel(logging.WARNING)
    native.write(GGML_INFO, "chatter\n" * 100)
    native.write(GGML_ERROR, "what matters\n")
    assert _messages(caplog) == [(logging.WARNING, "what matters")]


@pytest.mark.slow
def test_llama_cpp_logs_only_through_logging(model_path: Path) -> None:
    """A process that loads the model and has llama.cpp refuse a grammar: nothing
    reaches stderr but the log records (llama.cpp logs the refusal itself)."""
    script = f"""
import logging, sys
import llama_cpp.llama_cpp as ll
logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(message)s")
from pathlib import Path
from warmstart.runtime.engine._llama import LlamaModel
model = LlamaModel(Path({str(model_path)!r}), 0)
for _ in range(20):
    grammar = b'root ::= a\\na ::= a "x" | "y"\\n'  # left recursive: refused
    assert not ll.llama_sampler_init_grammar(model.vocab, grammar, b"root")
model.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    lines = done.stderr.splitlines()
    assert lines and all(line.startswith("LOG llama.cpp ") for line in lines), done.stderr
    assert any("left recursion" in line for line in lines)
    assert len(done.stderr) < 4000


def test_a_decode_stopped_on_purpose_is_not_reported_as_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    native, _ = _log(caplog)
    native.write(
        GGML_ERROR, "graph_compute: ggml_backend_sched_graph_compute_async failed with error 1\n"
    )
    native.write(GGML_ERROR, "process_ubatch: failed to compute graph, compute status: 1\n")
    native.write(GGML_ERROR, "llama_decode: failed to decode, ret = 2\n")
    native.write(GGML_ERROR, "llama_decode: failed to decode, ret = -3\n")
    levels = [level for level, _ in _messages(caplog)]
    assert levels == [logging.DEBUG] * 3 + [logging.WARNING]
