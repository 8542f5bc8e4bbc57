"""How may this machine load this model: mmap, CUDA's pinned staging, offload?

On the one GPU machine tried so far, llama.cpp died by SIGSEGV inside
``llama_model_load_from_file`` with layers offloaded (README, GPU section). Which of
the loader's paths kills it depends on the machine (a sandbox under CUDA, the
driver), so a child process proves the choice first: it loads the model with it and
decodes a few tokens (``python -m ...engine._loader MODEL CHOICE``). If the child
dies by a signal, the next choice is tried, each one step safer than the last:

1. what the settings ask (llama.cpp's mmap choice, pinned staging, ``n_gpu_layers``);
2. the file read instead of mapped (``load_mode`` none);
3. and CUDA's pinned staging buffers off (``GGML_CUDA_NO_PINNED=1``);
4. and no layer offloaded.

Only the choices left on ``auto`` in the settings change. The first choice that
lives is cached per (machine, GPU, model digest, llama.cpp build, settings), as the
extra-buffers verdict (engine._smoke) is, in its own file. A CPU-only llama.cpp build
has nothing to offload and runs no child: the extra-buffers smoke already loaded the
model there the default way. If every choice dies, loading fails with ModelError
naming each death, instead of the serving process dying with it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from ..errors import ModelError
from ._smoke import (
    SMOKE_TIMEOUT_S,
    VerdictCache,
    _signal_name,
    decode_a_few,
    machine_key,
    no_core_file,
)

log = logging.getLogger(__name__)

NO_PINNED_ENV = "GGML_CUDA_NO_PINNED"  # read by ggml-cuda at each host allocation

Setting = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class LoaderChoice:
    """The loader's choices for this machine and model, and why (``doctor`` prints both).

    ``mmap`` None leaves llama.cpp's own choice (it maps where every device can).
    """

    mmap: bool | None = None
    pinned: bool = True
    n_gpu_layers: int = -1
    reason: str = "not checked"

    def describe(self) -> str:
        mmap = {None: "auto", True: "on", False: "off"}[self.mmap]
        layers = "all" if self.n_gpu_layers < 0 else str(self.n_gpu_layers)
        pinned = "on" if self.pinned else "off"
        return f"mmap {mmap}, pinned staging {pinned}, layers offloaded {layers}"

    def env(self) -> dict[str, str]:
        """What a process's environment must say before it loads the model so."""
        return {} if self.pinned else {NO_PINNED_ENV: "1"}

    def child_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) as a child loading so needs it."""
        env = dict(os.environ if base is None else base)
        if self.pinned:
            env.pop(NO_PINNED_ENV, None)
        env.update(self.env())
        return env

    def apply_env(self) -> None:
        """This process's environment as the choice needs it (ggml-cuda reads it at
        each pinned allocation, so it counts from here on)."""
        if self.pinned:
            os.environ.pop(NO_PINNED_ENV, None)
        os.environ.update(self.env())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderChoice:
        mmap = data["mmap"]
        return cls(
            mmap=None if mmap is None else bool(mmap),
            pinned=bool(data["pinned"]),
            n_gpu_layers=int(data["n_gpu_layers"]),
            reason=str(data["reason"]),
        )


AS_SET: LoaderChoice = LoaderChoice(reason="not checked: loaded as set")
LoaderCommand = Callable[[Path, LoaderChoice, bool], list[str]]


def default_command(model: Path, choice: LoaderChoice, extra_buffers: bool) -> list[str]:
    """The real smoke child: this module, run as a script on ``model``."""
    spec = json.dumps({**choice.to_dict(), "extra_buffers": extra_buffers})
    return [sys.executable, "-X", "faulthandler", "-m", __name__, str(model), spec]


def requested(mmap: Setting, pinned: Setting, n_gpu_layers: int) -> LoaderChoice:
    """The choice the settings ask for (auto: llama.cpp's mmap choice, pinned on)."""
    return LoaderChoice(
        mmap=None if mmap == "auto" else mmap == "on",
        pinned=pinned != "off",
        n_gpu_layers=n_gpu_layers,
        reason="as set",
    )


def fallbacks(first: LoaderChoice, mmap: Setting, pinned: Setting) -> list[LoaderChoice]:
    """``first`` and each safer choice after it; a choice set on/off never changes."""
    chain = [first]
    if mmap == "auto":
        chain.append(replace(chain[-1], mmap=False))
    if pinned == "auto":
        chain.append(replace(chain[-1], pinned=False))
    if first.n_gpu_layers != 0:
        chain.append(replace(chain[-1], n_gpu_layers=0))
    return chain


def gpu_key() -> str:
    """What the loader verdict depends on beyond engine._smoke's machine key: the
    kernel (a sandbox reports its own), the GPUs the driver lists, the visible ones."""
    parts = [platform.release(), os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")]
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        with contextlib.suppress(OSError):
            parts += [ln for ln in info.read_text().splitlines() if ln.startswith("Model")]
    return "|".join(parts)


# the child ----------------------------------------------------------------------------------
def smoke_load(
    model: Path,
    choice: LoaderChoice,
    extra_buffers: bool,
    command: LoaderCommand = default_command,
    timeout_s: float = SMOKE_TIMEOUT_S,
) -> tuple[str | None, bool]:
    """Runs the child with ``choice``: ``(None, True)`` when it lived, else what killed
    it and whether that is an answer worth caching (a death by a signal is)."""
    started = time.perf_counter()
    cmd = command(model, choice, extra_buffers)
    env = choice.child_env()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"hung for {timeout_s:.0f} s", False
    if proc.returncode == 0:
        return None, True
    if proc.returncode < 0:
        return f"died by {_signal_name(-proc.returncode)}", True
    tail = " ".join(proc.stderr.strip().splitlines()[-2:])[-300:]
    took = time.perf_counter() - started
    return f"failed (exit {proc.returncode} after {took:.1f} s: {tail or 'no message'})", False


def prove(
    chain: list[LoaderChoice],
    model: Path,
    extra_buffers: bool,
    command: LoaderCommand = default_command,
) -> tuple[LoaderChoice, bool]:
    """The first choice of ``chain`` whose child lives, with its reason, and whether
    the verdict is worth caching. An ordinary failure (exit status, not a signal: a
    missing file, no memory) stops the chain: the real load then says what is wrong."""
    deaths: list[str] = []
    conclusive = True
    for choice in chain:
        what, answer = smoke_load(model, choice, extra_buffers, command)
        if what is None:
            why = "a smoke load and decode passed"
            if deaths:
                why += " after " + "; ".join(deaths)
            return replace(choice, reason=why), conclusive
        deaths.append(f"{choice.describe()} {what}")
        log.warning("loader smoke: %s %s", choice.describe(), what)
        if not answer and not what.startswith("hung"):
            return replace(choice, reason=f"smoke load {what}; the load will say why"), False
        conclusive = conclusive and answer
    raise ModelError(
        f"every way to load {model.name} killed the smoke child ({'; '.join(deaths)}); "
        "set CUDA_VISIBLE_DEVICES= to run on the CPU, and see `installers/gpu/diagnose.py`"
    )


def choose_loader(
    *,
    mmap: Setting,
    pinned: Setting,
    n_gpu_layers: int,
    model: Path,
    digest: str,
    extra_buffers: bool,
    cache_file: Path,
    gpu_offload: bool,
    command: LoaderCommand | None = None,
) -> LoaderChoice:
    """The loader's choice for ``model``: as set when there is nothing to prove (a
    CPU-only build, or no choice on auto), else the cached verdict, else the chain."""
    first = requested(mmap, pinned, n_gpu_layers)
    # with nothing offloaded, the extra-buffers smoke already loaded it the default way
    if not gpu_offload:
        return replace(
            first, reason="a CPU-only llama.cpp build: nothing offloaded, nothing to prove"
        )
    if n_gpu_layers == 0:
        return replace(first, reason="no layer offloaded: nothing to prove")
    chain = fallbacks(first, mmap, pinned)
    cache = VerdictCache(cache_file)
    key = f"{machine_key()}/{gpu_key()}/{digest}/{first.describe()}/extra={extra_buffers}"
    entry = cache.entry(key)
    if entry is not None:
        try:
            return LoaderChoice.from_dict(entry)
        except (KeyError, TypeError, ValueError):
            pass  # an older or foreign entry: prove it again
    log.info("proving the model loader's choices in a child process (once)")
    choice, conclusive = prove(chain, model, extra_buffers, command or default_command)
    if conclusive:
        try:
            cache.put_entry(key, choice.to_dict())
        except OSError as exc:  # a read-only data dir costs a smoke load next time
            log.warning("cannot store the loader verdict in %s: %s", cache_file, exc)
    return choice


def gpu_offload_supported() -> bool:
    """Whether the loaded llama.cpp build can offload layers at all."""
    from ._llama import ll  # (and its exit hook that closes llama_cpp's /dev/null files)

    return bool(ll.llama_supports_gpu_offload())


def _child(model_path: Path, spec: dict[str, Any]) -> int:
    """Loads ``model_path`` as ``spec`` says and decodes a prompt batch and a few
    single tokens: an offloaded decode can die where the load did not."""
    from ._llama import LlamaModel

    no_core_file()
    choice = LoaderChoice.from_dict({**spec, "reason": ""})
    model = LlamaModel(
        model_path,
        choice.n_gpu_layers,
        extra_buffers=bool(spec.get("extra_buffers")),
        mmap=choice.mmap,
    )
    return decode_a_few(model)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'loader'} MODEL.gguf JSON")
    sys.exit(_child(Path(sys.argv[1]), json.loads(sys.argv[2])))
