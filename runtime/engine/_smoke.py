"""May this machine load models with llama.cpp's extra buffer types?

llama.cpp's CPU backend offers "extra buffer types" (``use_extra_bufts``): weights
repacked for AMX or AVX-512 kernels. On some machines they kill the process: on
Intel AMX CPUs (Sapphire Rapids and later) the AMX kernels die with SIGILL at the
first decode (a worker thread lacks the XTILEDATA permission; upstream issue open).
A signal cannot be caught inside the process, so a child process loads the model
with them on and decodes a few tokens (``python -m ...engine._smoke MODEL``). If the
child dies by a signal, warmstart loads models with them off and says why.

The verdict is cached per (machine, model digest, llama.cpp version and build) in a
small JSON file, so the child runs once. The child's command is a parameter: tests
replace it with one that dies by a real signal.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SMOKE_TIMEOUT_S = 300.0  # loading and repacking a large model on a slow CPU takes a while
_KEEP_ENTRIES = 16
_PROMPT_TOKENS = 16
_STEPS = 3

Setting = Literal["auto", "on", "off"]
SmokeCommand = Callable[[Path], list[str]]


@dataclass(frozen=True)
class ExtraBuffers:
    """The choice for this machine and model, and why (``doctor`` prints both)."""

    enabled: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


NOT_CHECKED: ExtraBuffers = ExtraBuffers(False, "not checked: off to be safe")


def default_command(model: Path) -> list[str]:
    """The real smoke child: this module, run as a script on ``model``."""
    return [sys.executable, "-m", __name__, str(model)]


def machine_key() -> str:
    """What the verdict depends on besides the model: the CPU (model, every flag,
    cores), the architecture and the llama.cpp build (version and backend)."""
    from ..hardware import LlamaBackendSource

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # not Linux: the platform module is what we have
        cpuinfo = ""
    model = next((ln for ln in cpuinfo.splitlines() if ln.lower().startswith("model name")), "")
    flags = next((ln for ln in cpuinfo.splitlines() if ln.lower().startswith("flags")), "")
    parts = [
        platform.machine(),
        platform.processor(),
        model,
        " ".join(sorted(flags.split())),
        str(os.cpu_count()),
        LlamaBackendSource().backend(),
        _llama_cpp_version(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _llama_cpp_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return "unknown"


# the child ----------------------------------------------------------------------------------
def smoke_test(
    model: Path, command: SmokeCommand = default_command, timeout_s: float = SMOKE_TIMEOUT_S
) -> tuple[ExtraBuffers, bool]:
    """Runs the smoke child on ``model``: ``(choice, worth caching)``.

    A death by a signal turns extra buffers off (cached: it will die again). A
    timeout or another failure turns them off too, to be safe, without caching: the
    next start tries again.
    """
    started = time.perf_counter()
    # extra buffer types are the CPU's: with no GPU visible, a death here is theirs and
    # not CUDA's (engine._loader proves the GPU's paths in a child of its own)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    try:
        proc = subprocess.run(
            command(model), capture_output=True, text=True, timeout=timeout_s, env=env
        )
    except subprocess.TimeoutExpired:
        return ExtraBuffers(
            False, f"a smoke decode with llama.cpp's extra buffer types hung for {timeout_s:.0f} s"
        ), False
    took = time.perf_counter() - started
    if proc.returncode == 0:
        return ExtraBuffers(
            True, f"a smoke decode with llama.cpp's extra buffer types passed ({took:.1f} s)"
        ), True
    if proc.returncode < 0:
        name = _signal_name(-proc.returncode)
        hint = " (Intel AMX?)" if name == "SIGILL" else ""
        return ExtraBuffers(
            False, f"a smoke decode with llama.cpp's extra buffer types died by {name}{hint}"
        ), True
    tail = " ".join(proc.stderr.strip().splitlines()[-2:])[-300:]
    return ExtraBuffers(
        False,
        f"a smoke decode with llama.cpp's extra buffer types failed "
        f"(exit {proc.returncode}: {tail or 'no message'})",
    ), False


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def no_core_file() -> None:
    """A smoke child's death is an expected answer, not something to leave a core for."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):  # Windows has no resource module
        pass


def decode_a_few(model: Any, all_cores: bool = False) -> int:
    """In a smoke child: a small context on ``model`` decodes a prompt batch and a few
    single tokens (``all_cores``: with every core, where a fault shows only on worker
    threads). 0 when it passed, 1 (with the reason on stderr) when llama.cpp refused."""
    import llama_cpp.llama_cpp as ll

    params = ll.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 64
    if all_cores:
        params.n_threads = params.n_threads_batch = os.cpu_count() or 1
    ctx = ll.llama_init_from_model(model.ptr, params)
    if not ctx:
        print("llama.cpp could not create a context", file=sys.stderr)
        return 1
    ids = (model.tokenize("The smoke test decodes a few tokens. " * 4, add_special=True) * 4)[
        :_PROMPT_TOKENS
    ]
    for step in range(1 + _STEPS):
        part = ids if step == 0 else ids[step : step + 1]
        arr = (ll.llama_token * len(part))(*part)
        ret = ll.llama_decode(ctx, ll.llama_batch_get_one(arr, len(part)))
        if ret != 0:
            print(f"llama_decode failed with code {ret}", file=sys.stderr)
            return 1
    ll.llama_free(ctx)
    model.close()
    return 0


def _child(model_path: Path) -> int:
    """Loads ``model_path`` with extra buffer types on, all layers on the CPU (where the
    extra buffer types live), and decodes a prompt batch and a few single tokens with
    every core: AMX's fault shows only on worker threads."""
    from ._llama import LlamaModel

    no_core_file()
    return decode_a_few(LlamaModel(model_path, n_gpu_layers=0, extra_buffers=True), True)


# the verdict cache --------------------------------------------------------------------------
class VerdictCache:
    """``{key: {"enabled", "reason", "measured_at"}}`` in one JSON file (0600, atomic).

    A corrupt or foreign file reads as empty: the smoke test simply runs again.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _entries(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT_VERSION or not isinstance(data.get("entries"), dict):
                raise ValueError(f"unknown format {data.get('format')!r}")
            return dict(data["entries"])
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("verdicts %s unusable (%s); testing again", self.path, exc)
            return {}

    def get(self, key: str) -> ExtraBuffers | None:
        entry = self.entry(key)
        try:
            return ExtraBuffers(bool(entry["enabled"]), str(entry["reason"])) if entry else None
        except (KeyError, TypeError):
            return None

    def put(self, key: str, verdict: ExtraBuffers) -> None:
        self.put_entry(key, verdict.to_dict())

    def entry(self, key: str) -> dict[str, Any] | None:
        """The dict stored under ``key`` (engine._loader's verdicts share the format)."""
        entry = self._entries().get(key)
        return entry if isinstance(entry, dict) else None

    def put_entry(self, key: str, value: dict[str, Any]) -> None:
        entries = self._entries()
        entries[key] = {**value, "measured_at": time.time()}
        newest = sorted(entries.items(), key=lambda kv: kv[1].get("measured_at", 0), reverse=True)
        payload = {"format": FORMAT_VERSION, "entries": dict(newest[:_KEEP_ENTRIES])}
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)  # a crash mid-write leaves the old file or the new one


def choose_extra_buffers(
    setting: Setting,
    model: Path,
    digest: str,
    cache_file: Path,
    command: SmokeCommand | None = None,
) -> ExtraBuffers:
    """The choice for ``model``: the setting when it says on/off, else the cached verdict
    of the smoke test, else a fresh smoke test (cached when conclusive)."""
    if setting != "auto":
        return ExtraBuffers(setting == "on", f"set by extra_buffers={setting}")
    cache = VerdictCache(cache_file)
    key = f"{machine_key()}/{digest}"
    known = cache.get(key)
    if known is not None:
        return known
    log.info("testing llama.cpp's extra buffer types in a child process (once)")
    verdict, conclusive = smoke_test(model, command or default_command)
    if not verdict.enabled:
        # a fact about this machine, not a failure: the model runs without them (doctor
        # and doctor --json state it with the reason)
        log.info("extra buffer types: off (%s)", verdict.reason)
    if conclusive:
        try:
            cache.put(key, verdict)
        except OSError as exc:  # a read-only data dir costs a smoke test next time
            log.warning("cannot store the extra-buffer verdict in %s: %s", cache_file, exc)
    return verdict


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'smoke'} MODEL.gguf")
    sys.exit(_child(Path(sys.argv[1])))
