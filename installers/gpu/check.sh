#!/usr/bin/env bash
# make gpu-check: on a machine with an NVIDIA GPU, nvcc, PyTorch and Python 3.12 and no
# network. Installs the carried wheels and a CUDA build of llama-cpp-python (built from
# the carried, trimmed sdist, or reused from an earlier run) into a folder of its own
# on PYTHONPATH (the image's PyTorch stays visible), then runs installers/gpu/gpu_check.py:
# one JSON report in $GPU_CHECK_OUT/gpu-check.json. Prepare .gpu-carry/ first with
# `make gpu-carry` where pip reaches PyPI. Under 10 minutes on 16 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-.gpu-carry}
OUT_DIR=${GPU_CHECK_OUT:-gpu-check}
SITE=${GPU_CHECK_SITE:-/tmp/warmstart-gpu-site}
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
SDIST="$CARRY/llama_cpp_python-$VERSION-trimmed.tar.gz"

fail() { echo "gpu-check: $*" >&2; exit 2; }
command -v nvcc >/dev/null || fail "nvcc not found: CUDA's compiler builds llama.cpp's CUDA backend"
[ -f "$SDIST" ] || fail "$SDIST missing: run 'make gpu-carry' where pip reaches PyPI"
"$PYTHON" -c 'import torch' 2>/dev/null || echo "gpu-check: no torch: copies are not measured" >&2

started=$(date +%s)
mkdir -p "$SITE" "$CARRY/built" "$OUT_DIR"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
offline() {
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$@"
}
offline "$CARRY"/wheels/*.whl

wheel=$(ls "$CARRY"/built/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
    echo "gpu-check: building llama-cpp-python $VERSION with CUDA on $(nproc) cores ..." >&2
    # no build isolation: the build tools (scikit-build-core, cmake, ninja) come from
    # the image; mtmd (multimodal) is not needed; the GPU present picks the architecture
    CMAKE_ARGS="-DGGML_CUDA=on -DLLAVA_BUILD=off -DCMAKE_CUDA_ARCHITECTURES=native ${GPU_CMAKE_ARGS:-}" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        "$PYTHON" -m pip wheel -q --no-index --no-deps --no-build-isolation \
        -w "$CARRY/built" "$SDIST"
    wheel=$(ls "$CARRY"/built/llama_cpp_python-"$VERSION"-*.whl | head -n1)
fi
built=$(date +%s)
offline "$wheel"
# warmstart itself is pure Python: its two packages linked where pip --target would
# put them (no build backend needed offline; edits here are seen there at once)
mkdir -p "$SITE/warmstart"
ln -sfn "$PWD/runtime" "$SITE/warmstart/runtime"
ln -sfn "$PWD/app" "$SITE/warmstart/app"
echo "gpu-check: installed in $((built - started)) s (llama-cpp-python build included)" >&2

# the machine's own config stays out: an empty one of ours (a named file must exist)
export WARMSTART_CONFIG="$OUT_DIR/no-config.toml"
: >"$WARMSTART_CONFIG"
"$PYTHON" installers/gpu/gpu_check.py --out "$OUT_DIR/gpu-check.json" --work "${GPU_CHECK_WORK:-/tmp/warmstart-gpu-check}" \
    --install-seconds "$((built - started))" "$@"
