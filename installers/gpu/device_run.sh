#!/usr/bin/env bash
# make gpu-check: the whole GPU check in ONE device call, each step under its own
# timeout and inside one budget for the call (a device command may run 600 s), each
# writing into $OUT as it goes, so a crash or a timeout keeps everything before it:
#   facts      uname, nvidia-smi, nvcc, CPU flags                    $OUT/facts.out
#   install    carried wheels + llama-cpp-python built for sm_90     $OUT/install.err
#   diagnose   installers/gpu/diagnose.py, the load crash, case by case  $OUT/diagnosis/
#   figures-*  installers/gpu/gpu_check.py on the default model's geometry, then the 8B's
#              (verdicts, equivalence, batched decode on the small one, bench's own
#              figures, restore/recompute sweep, serve, loads)      $OUT/gpu-check-*.json
#   bench-small `warmstart bench --quick` whole (its peers and fresh processes too)
#   summary    $OUT/summary.md (rewritten after every step), steps in $OUT/steps.tsv
#
# GPU_CHECK_STEPS="figures-small ..." runs only those of the measuring steps (a second call
# on a machine still warm, say); facts and install always run.
# GPU_CHECK_OUT names the results' folder (else $OUT, else gpu-check). The device tool
# brings back at most 8 files from its $OUT: there, give GPU_CHECK_OUT a folder of the
# machine's own and GPU_CHECK_PACK=$OUT/gpu-check.tgz; after every step the folder is
# packed into that one file and summary.md is copied beside it.
#
#   bash installers/gpu/device_run.sh         # on the GPU machine (after `make gpu-carry` here)
#   bash installers/gpu/device_run.sh --cpu   # here, with the venv's CPU build: the same
#                                             # steps on tiny models, no install
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=gpu
[ "${1:-}" = "--cpu" ] && MODE=cpu
OUT=${GPU_CHECK_OUT:-${OUT:-gpu-check}}
PACK=${GPU_CHECK_PACK:-}
WORK=${GPU_CHECK_WORK:-/tmp/warmstart-gpu-check}
BUDGET=${GPU_RUN_BUDGET_S:-540}  # the run tool's 600 s per call, less a margin
if [ "$MODE" = cpu ] && [ -x .venv/bin/python ]; then PYTHON=${PYTHON:-.venv/bin/python}; fi
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
START=$(date +%s)
: >"$OUT/steps.tsv"

left() { echo $((BUDGET - ($(date +%s) - START))); }

# step NAME LIMIT_S CMD...: CMD under `timeout` (its limit, or what the budget has left
# less a margin for the rest), stdout and stderr in $OUT/NAME.{out,err}, its exit status
# (124: timed out; 128+N: signal N) and seconds in steps.tsv, then the summary again
step() {
    local name=$1 limit=$2 rest t0 rc
    shift 2
    if [ -n "${GPU_CHECK_STEPS:-}" ] && [ "$name" != facts ] && [ "$name" != install ] &&
        [[ " $GPU_CHECK_STEPS " != *" $name "* ]]; then
        printf '%s\tnot asked\t0\n' "$name" >>"$OUT/steps.tsv"
        return 0
    fi
    rest=$(($(left) - 10))
    if [ "$rest" -lt 15 ]; then
        printf '%s\tskipped\t0\n' "$name" >>"$OUT/steps.tsv"
        return 0
    fi
    [ "$limit" -gt "$rest" ] && limit=$rest
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" >>"$OUT/steps.tsv"
    "$PYTHON" installers/gpu/summary.py "$OUT" >"$OUT/summary.md.tmp" 2>>"$OUT/summary.err" &&
        mv "$OUT/summary.md.tmp" "$OUT/summary.md"
    pack
    return 0
}

# pack: the results folder as one file, and the summary beside it (GPU_CHECK_PACK)
pack() {
    [ -n "$PACK" ] || return 0
    tar -czf "$PACK.tmp" -C "$OUT" . && mv "$PACK.tmp" "$PACK"
    cp "$OUT/summary.md" "$(dirname "$PACK")/summary.md" 2>/dev/null
    return 0
}

# cuda_lib_dirs: folders holding CUDA's runtime and cuBLAS of CUDA $CUDA_MAJOR (a wheel
# built with it needs both) that the dynamic linker does not already know,
# colon-separated: the toolkit's and PyTorch's NVIDIA wheels'
CUDA_MAJOR=${CUDA_MAJOR:-13}
cuda_lib_dirs() {
    ldconfig -p 2>/dev/null | grep -q "libcublas\.so\.$CUDA_MAJOR " && return 0
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        $("$PYTHON" -c 'import glob, site
print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null); do
        [ -e "$d/libcublas.so.$CUDA_MAJOR" ] && printf '%s:' "$d"
    done
    return 0
}

facts() {
    uname -a
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    nproc
    free -g 2>/dev/null
    grep -m1 '^model name' /proc/cpuinfo
    grep -m1 -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u
    nvidia-smi 2>&1 | head -20
    nvcc --version 2>&1 | tail -2
    "$PYTHON" --version
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1 | tail -1
    command -v cuda-gdb || echo "no cuda-gdb"
}
export -f facts
export PYTHON

if [ "$MODE" = gpu ]; then
    BIG=${GPU_BIG:-llama-8b} SMALL=${GPU_SMALL:-smollm2-135m}
    SWEEP=256,512,1024,2048,4096,8192,12288,16384
    SMALL_SWEEP=64,256,1024,2048,4096
    # bench's own figures child by child (--ours: a hang costs one child's timeout, and the
    # figures before it stay); `warmstart bench` whole, with its peers, last
    BIG_BENCH=(--ours --ours-timeout 100 --no-bench)
    SMALL_BENCH=(--ours --ours-timeout 50 --no-bench --quick)
    WHOLE_BENCH=(--quick --bench-timeout 80)
    DIAG=(--timeout-s 60 --budget-s 140)
else
    BIG=tiny SMALL=tiny SWEEP=16,64,256 SMALL_SWEEP=16,64
    BIG_BENCH=(--ours --no-bench --quick) SMALL_BENCH=(--ours --no-bench --quick)
    WHOLE_BENCH=(--quick)
    DIAG=(--timeout-s 60 --budget-s 120)
fi

step facts 30 bash -c facts
if [ "$MODE" = gpu ]; then
    SITE=${GPU_CHECK_SITE:-/tmp/warmstart-gpu-site}
    LIBS=$(cuda_lib_dirs)
    export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:-}"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH (added: ${LIBS:-nothing})" >>"$OUT/facts.out"
    step install 300 env GPU_CHECK_SITE="$SITE" PYTHON="$PYTHON" bash installers/gpu/install.sh
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    # a wheel built there comes back when it is small enough: a second call skips the build
    if [ -n "$PACK" ] && ! grep -q 'carried wheel loads' "$OUT/install.err" 2>/dev/null; then
        for wheel in "${CARRY:-.gpu-carry}"/built/llama_cpp_python-*.whl; do
            [ -f "$wheel" ] && [ "$(stat -c %s "$wheel")" -lt 16000000 ] &&
                cp "$wheel" "$(dirname "$PACK")/"
        done
    fi
fi
# the machine's own warmstart config stays out: one of ours (a named file must exist). On
# the GPU the RAM pool is capped: the policy would pin half of RAM at every start, tens of
# seconds of the call each time, and the figures need a few GB of it
export WARMSTART_CONFIG="$OUT/no-config.toml"
: >"$WARMSTART_CONFIG"
[ "$MODE" = gpu ] && echo "ram_pool_bytes = ${GPU_CHECK_POOL_BYTES:-8589934592}" >"$WARMSTART_CONFIG"
step diagnose 200 "$PYTHON" installers/gpu/diagnose.py --out "$OUT/diagnosis" --work "$WORK" \
    --big "$BIG" "${DIAG[@]}"
# the small model first: quick, and a canary for the big one
step figures-small 120 "$PYTHON" installers/gpu/gpu_check.py --out "$OUT/gpu-check-small.json" \
    --work "$WORK" --geometry "$SMALL" --sweep "$SMALL_SWEEP" --equivalence --batched-decode \
    --serve --no-loads "${SMALL_BENCH[@]}"
step figures-big 240 "$PYTHON" installers/gpu/gpu_check.py --out "$OUT/gpu-check-big.json" \
    --work "$WORK" --geometry "$BIG" --sweep "$SWEEP" --equivalence --serve "${BIG_BENCH[@]}"
step bench-small 100 "$PYTHON" installers/gpu/gpu_check.py --out "$OUT/gpu-check-bench.json" \
    --work "$WORK" --geometry "$SMALL" --no-loads "${WHOLE_BENCH[@]}"
pack
cat "$OUT/summary.md" 2>/dev/null
