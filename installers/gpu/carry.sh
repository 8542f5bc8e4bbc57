#!/usr/bin/env bash
# make gpu-carry: what `make gpu-check` needs on a machine that reaches no package
# registry, gathered here (where pip works) into .gpu-carry/ (ignored by git):
#   llama_cpp_python-<v>-trimmed.tar.gz  the sdist without vendor/llama.cpp's models,
#                                        docs, examples, tests and other tools
#                                        (77 MB -> about 10 MB; its .git is half of it), to build with CUDA there
#   wheels/                              Python 3.12 wheels of the runtime dependencies
#                                        a CUDA/PyTorch image usually lacks
# Everything together stays far below the 64 MiB a device machine takes along.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-.gpu-carry}
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
# runtime dependencies missing from a typical CUDA + PyTorch image (numpy, jinja2,
# psutil, httpx, xxhash, prometheus-client, nvidia-ml-py, pyyaml, tqdm are there)
WANTED="diskcache zstandard pydantic pydantic-core pydantic-settings annotated-types
typing-inspection typing-extensions python-dotenv platformdirs fastapi starlette uvicorn gguf
py-spy"  # py-spy: gpu_check.py dumps the stacks of a step that hangs

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$CARRY"

sdist="$CARRY/llama_cpp_python-$VERSION-trimmed.tar.gz"
if [ ! -f "$sdist" ]; then
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
    tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
    src="$work/llama_cpp_python-$VERSION"
    rm -rf "$src"/{docs,examples,tests,docker,.git,.github}
    (
        cd "$src/vendor/llama.cpp"
        # only what llama-cpp-python's CMakeLists builds: ggml, src, include, common,
        # vendor, cmake and tools/mtmd (LLAVA_BUILD)
        rm -rf models docs examples tests benches media pocs app scripts ci skills grammars \
            requirements gguf-py conversion .devops .github .git .gemini .pi ./*.py
        find tools -mindepth 1 -maxdepth 1 ! -name mtmd -exec rm -rf {} +
    )
    tar -czf "$sdist" -C "$work" "llama_cpp_python-$VERSION"
fi

rm -rf "$CARRY/wheels" "$work/all"
"$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$work/all" \
    diskcache "zstandard>=0.22" "pydantic>=2.7,<3" "pydantic-settings>=2.3,<3" platformdirs \
    "fastapi>=0.110" "uvicorn>=0.29" "gguf==0.19.0" py-spy
mkdir -p "$CARRY/wheels"
for name in $WANTED; do
    stem=$(echo "$name" | tr - _)
    cp "$work"/all/"$stem"-[0-9]*.whl "$CARRY/wheels/"
done
du -sh "$sdist" "$CARRY/wheels"
