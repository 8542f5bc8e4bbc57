#!/usr/bin/env bash
# The install step of `make gpu-check` (installers/gpu/device_run.sh), on a machine with
# an NVIDIA GPU, nvcc, PyTorch and Python 3.12 and no network: the carried wheels and a
# CUDA build of llama-cpp-python (built from the carried, trimmed sdist, or reused from
# an earlier run) go into a folder of their own ($GPU_CHECK_SITE), which the caller puts
# on PYTHONPATH (the image's PyTorch stays visible). Prepare .gpu-carry/ first with
# `make gpu-carry` where pip reaches PyPI. Prints the seconds it took on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-.gpu-carry}
SITE=${GPU_CHECK_SITE:-/tmp/warmstart-gpu-site}
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
SDIST="$CARRY/llama_cpp_python-$VERSION-trimmed.tar.gz"
# Hopper (H100/H200) only, no multimodal library (LLAVA_BUILD, llama-cpp-python's
# CMakeLists): one architecture instead of llama.cpp's list of six, well under the
# 263 s the first build took with every one
CUDA_CMAKE_ARGS=${GPU_CMAKE_ARGS:--DGGML_CUDA=on -DLLAVA_BUILD=OFF -DCMAKE_CUDA_ARCHITECTURES=90}

fail() { echo "gpu-check: $*" >&2; exit 2; }
command -v nvcc >/dev/null || fail "nvcc not found: CUDA's compiler builds llama.cpp's CUDA backend"
[ -f "$SDIST" ] || fail "$SDIST missing: run 'make gpu-carry' where pip reaches PyPI"
"$PYTHON" -c 'import torch' 2>/dev/null || echo "gpu-check: no torch: copies are not measured" >&2

started=$(date +%s)
mkdir -p "$SITE" "$CARRY/built"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
offline() {
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$@"
}
offline "$CARRY"/wheels/*.whl

# a wheel built beforehand (`make gpu-wheel`, or an earlier run here) is used when it loads
# here with GPU offload; one that does not (other system libraries, another CUDA) is put
# aside, and the build runs as if there were none
wheel=$(ls "$CARRY"/built/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$wheel" ]; then
    offline "$wheel"
    if "$PYTHON" -c 'import sys, llama_cpp.llama_cpp as ll
sys.exit(0 if ll.llama_supports_gpu_offload() else 1)' >&2; then
        echo "gpu-check: the carried wheel loads with GPU offload: $wheel" >&2
    else
        echo "gpu-check: the carried wheel does not load with GPU offload here: building" >&2
        mkdir -p "$CARRY/unusable"
        mv "$wheel" "$CARRY/unusable/"
        rm -rf "$SITE"/llama_cpp "$SITE"/llama_cpp_python-*
        wheel=
    fi
fi
if [ -z "$wheel" ]; then
    echo "gpu-check: building llama-cpp-python $VERSION ($CUDA_CMAKE_ARGS) on $(nproc) cores ..." >&2
    # no build isolation: the build tools (scikit-build-core, cmake, ninja) come from the image
    CMAKE_ARGS="$CUDA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        "$PYTHON" -m pip wheel -q --no-index --no-deps --no-build-isolation \
        -w "$CARRY/built" "$SDIST"
    wheel=$(ls "$CARRY"/built/llama_cpp_python-"$VERSION"-*.whl | head -n1)
    offline "$wheel"
fi
# warmstart itself is pure Python: its two packages linked where pip --target would
# put them (no build backend needed offline; edits here are seen there at once)
mkdir -p "$SITE/warmstart"
ln -sfn "$PWD/runtime" "$SITE/warmstart/runtime"
ln -sfn "$PWD/app" "$SITE/warmstart/app"
echo "gpu-check: installed in $(($(date +%s) - started)) s (llama-cpp-python build included)" >&2
echo "$(($(date +%s) - started))"
