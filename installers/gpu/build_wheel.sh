#!/usr/bin/env bash
# make gpu-wheel: the CUDA build of llama-cpp-python for `make gpu-check`, compiled HERE
# (no GPU needed) so that the device call spends none of its minutes compiling.
#
# CUDA's compiler, runtime, cuBLAS and CCCL come from NVIDIA's wheels on PyPI (one
# version, CUDA_VERSION below, laid out as a toolkit under $CUDA_HOME); the driver's
# libcuda is not among them, so a link-time stub of it is made from cuda.h (the real
# libcuda.so.1 comes with the GPU's driver where the wheel runs). The build is
# Hopper-only (sm_90), multimodal off, and its CPU backend is built for plain AVX2
# (GGML_NATIVE off): this machine's CPU is not the GPU machine's. The wheel lands in
# .gpu-carry/built/, where installers/gpu/install.sh takes it (and checks it loads
# there, building on the spot otherwise). On 2 cores it takes about an hour.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-.gpu-carry}
CUDA_VERSION=${CUDA_VERSION:-13.0}
CUDA_HOME=${CUDA_HOME:-$HOME/.cache/warmstart/cuda-$CUDA_VERSION}
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
SDIST="$CARRY/llama_cpp_python-$VERSION-trimmed.tar.gz"
[ -f "$SDIST" ] || PYTHON=$PYTHON bash installers/gpu/carry.sh

# the toolkit: CUDA 13.0's packages (the GPU machine's driver runs 13.0 code)
case "$CUDA_VERSION" in
13.0) PINS="nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
      nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.0.2.14 nvidia-cuda-cccl==13.0.85" ;;
*) echo "gpu-wheel: no pins for CUDA $CUDA_VERSION" >&2; exit 2 ;;
esac
TK="$CUDA_HOME/site/nvidia/cu13"
if [ ! -x "$TK/bin/nvcc" ]; then
    # shellcheck disable=SC2086
    "$PYTHON" -m pip install -q --target "$CUDA_HOME/site" $PINS
fi
# what CMake's FindCUDAToolkit and nvcc.profile look for: unversioned link names, lib64,
# and lib/stubs/libcuda.so (every cu* function of cuda.h, each returning 0; soname
# libcuda.so.1, so the wheel asks for the driver's library)
ln -sfn lib "$TK/lib64"
for lib in cudart cublas cublasLt; do ln -sfn "lib$lib.so.13" "$TK/lib/lib$lib.so"; done
if [ ! -f "$TK/lib/stubs/libcuda.so" ]; then
    mkdir -p "$TK/lib/stubs"
    gcc -E -P "$TK/include/cuda.h" | grep -oP '\bcu[A-Z][A-Za-z0-9_]*(?=\s*\()' | sort -u |
        sed 's/.*/int &(void) { return 0; }/' >"$TK/lib/stubs/libcuda-stub.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$TK/lib/stubs/libcuda.so" \
        "$TK/lib/stubs/libcuda-stub.c"
fi

mkdir -p "$CARRY/built"
rm -f "$CARRY"/built/llama_cpp_python-*.whl
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
PATH="$TK/bin:$PATH" CUDACXX="$TK/bin/nvcc" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    CMAKE_ARGS="-DGGML_CUDA=on -DLLAVA_BUILD=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF \
-DCUDAToolkit_ROOT=$TK -DCMAKE_CUDA_COMPILER=$TK/bin/nvcc" \
    "$PYTHON" -m pip wheel -q --no-deps -w "$work" "$SDIST"
echo "gpu-wheel: built in $(($(date +%s) - started)) s"
# each library once (installers/gpu/slim_wheel.py): 263 MB -> about 42 MB, within what a
# device call takes along beside the sdist and the wheels
for wheel in "$work"/llama_cpp_python-*.whl; do
    "$PYTHON" installers/gpu/slim_wheel.py "$wheel" "$CARRY/built/$(basename "$wheel")"
done
du -sh "$CARRY"
