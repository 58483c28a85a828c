#!/bin/bash
# The GPU machine's checks in one run: the Triton bandwidth figures, the bench on CUDA (alone on the machine,
# it is timed), then the `gpu`-marked tests with the AOTInductor probe beside them. Run from the repository root on a machine with a CUDA GPU and PyTorch, Triton and pluggy
# installed (nothing is fetched): logs go to $OUT (default ./gpu-out), one file per step, and the bench's
# folder as bench.tar.gz. Each step has its own time limit so that one that hangs leaves the others.
#
#   OUT=/tmp/gpu [STEPS="bandwidth bench tests aoti"] [AOTI_VARIANTS=fresh_load,constants_outside,torchmux_auto] [AOTI_FLAGS=--ld-debug] [SYSTEMS=...] [BATCH=1,8] [DEVICE=cuda] [LATENCY=per-system] bash bench/scripts/gpu_checks.sh [tests-seconds] [bench-seconds] [bench models]
#
# Each failing test is written to $OUT/fails.txt as it fails (tests/conftest.py, TORCHMUX_FAIL_LOG).
# At most eight files come back from a device call: steps, env, bandwidth, tests, fails, bench.txt,
# bench.tar.gz (every bench.json and log) and aoti.txt (the probe's verdicts and a failing child's tail).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
T_TESTS=${1:-150}
T_BENCH=${2:-150}
MODELS=${3:-mlp,resnet,bert}
PY=${PY:-python3}
STEPS=${STEPS:-bandwidth bench tests aoti}
# aoti: AOTInductor as its docs show, each variant in a child with faulthandler (bench/scripts/aoti_probe.py):
# where the bench's `aoti` system dies of SIGSEGV on CUDA; AOTI_SECONDS is each variant's limit
AOTI_SECONDS=${AOTI_SECONDS:-100}
# on the H200 (torch 2.11, 2026-11-28) no AOTInductor CUDA package loaded, in any process (README, "It is
# AOTInductor's loader"): fresh_load is the check that a new torch fixed it
AOTI_VARIANTS=${AOTI_VARIANTS:-fresh_load,constants_outside,torchmux_auto}
AOTI_FLAGS=${AOTI_FLAGS:---ld-debug}
BATCH=${BATCH:-1,8}
DEVICE=${DEVICE:-cuda}
# each system timed in a process of its own: one that crashes (AOTInductor as its docs show died of SIGSEGV on
# the H200, torch 2.11) costs its own row, not a rerun of every other system in a new shared process
LATENCY=${LATENCY:-per-system}
# each system's limit in the bench (an export of BERT with its graphed candidates compiles for over a minute)
SYSTEM_SECONDS=${SYSTEM_SECONDS:-100}
SYSTEMS=${SYSTEMS:-eager,inductor,inductor-freezing,inductor-reduce-overhead,aoti,torchmux:auto,torchmux:cudagraphs,torchmux-export:auto,torchmux-export:inductor}
step() { echo "== $1 $(date +%T)" | tee -a "$OUT/steps.txt"; }

step env
{ nvidia-smi -L; $PY -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())"; } >"$OUT/env.txt" 2>&1
# an offline install: the entry points register the built-in backends
$PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$OUT/env.txt" 2>&1 || $PY -m pip install -q --no-deps --no-build-isolation --no-index . >>"$OUT/env.txt" 2>&1
$PY -c "import torchmux
for r in torchmux.list_backends(): print(r)" >>"$OUT/env.txt" 2>&1

case " $STEPS " in *" bandwidth "*)
step triton_bandwidth
timeout 90 $PY -m torchmux.bench.scripts.triton_bandwidth --rows 8192 --cols 4096 >"$OUT/bandwidth.txt" 2>&1
echo "rc=$?" >>"$OUT/bandwidth.txt" ;;
esac

case " $STEPS " in *" bench "*)
step bench
timeout "$T_BENCH" $PY -m torchmux bench --device "$DEVICE" --models "$MODELS" --batch-size "$BATCH" --latency-only --rounds 10 \
    --latency-processes "$LATENCY" --timeout "$SYSTEM_SECONDS" --systems "$SYSTEMS" \
    --out "$OUT/bench" >"$OUT/bench.txt" 2>&1
echo "rc=$?" >>"$OUT/bench.txt"
tar czf "$OUT/bench.tar.gz" -C "$OUT" bench 2>/dev/null && rm -rf "$OUT/bench" ;;
esac
case " $STEPS " in *" aoti "*)
step aoti_probe
# beside the tests (neither is timed): the probe's compiles take minutes on their own
$PY -m torchmux.bench.scripts.aoti_probe --device "$DEVICE" --out "${TMPDIR:-/tmp}/aoti-probe" --seconds "$AOTI_SECONDS" \
    --variants "$AOTI_VARIANTS" $AOTI_FLAGS >"$OUT/aoti.txt" 2>&1 &
AOTI_PID=$! ;;
esac
case " $STEPS " in *" tests "*)
step tests
N=$(( $(nproc) > 15 ? 14 : $(nproc) ))
TORCHMUX_FAIL_LOG="$OUT/fails.txt" timeout "$T_TESTS" $PY -m pytest -q -p no:randomly -p no:cacheprovider -p no:benchmark -m gpu -n "$N" --timeout 120 -rfE \
    tests/api/test_gpu.py tests/backends tests/conformance tests/bench >"$OUT/tests.txt" 2>&1
echo "rc=$?" >>"$OUT/tests.txt" ;;
esac

[ -n "${AOTI_PID:-}" ] && { wait "$AOTI_PID"; echo "rc=$?" >>"$OUT/aoti.txt"; }
step done
