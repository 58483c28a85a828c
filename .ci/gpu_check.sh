#!/usr/bin/env bash
# The GPU checks for a session lent a CUDA machine (not CI: CI has no GPU). Run from the repository root
# there (OUT: a folder for logs; the machine has no network, so torchmux installs without dependencies into
# the image's own torch): the gpu-marked tests, the Triton code generator's bandwidth, a package exported and
# loaded on CUDA, and the bench on CUDA. Each step has its own time limit (seconds, environment variables).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/torchmux-gpu-check}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
S=$(date +%s); t() { echo "[$(( $(date +%s) - S ))s] $*"; }
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 || echo "install failed"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e tests/plugins/torchmux-example-plugin >> "$OUT/install.log" 2>&1
t gpu tests
timeout "${GPU_TESTS_S:-300}" python3 -m pytest -q -p no:randomly -m gpu -rs tests > "$OUT/gpu_tests.log" 2>&1; echo "rc=$?"
grep -E "passed|failed" "$OUT/gpu_tests.log" | tail -1; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20
t triton bandwidth
timeout "${BANDWIDTH_S:-90}" python3 -m torchmux.bench.scripts.triton_bandwidth --json "$OUT/bw.json" > "$OUT/bw.log" 2>&1; tail -14 "$OUT/bw.log"
t export on cuda
timeout "${EXPORT_S:-180}" python3 - <<'PY' 2>&1 | grep -v Warning | tail -12
import time, warnings
import torch
import torchmux
from torchmux.bench import zoo
warnings.simplefilter("ignore")
for name in ("mlp", "resnet"):
    m, args = zoo.build(name, 8)
    m, args = m.cuda(), tuple(a.cuda() for a in args)
    t0 = time.time()
    path = torchmux.export(m, args, backend="auto").save(f"/tmp/{name}.tmux")
    t1 = time.time()
    loaded = torchmux.load(path)
    with torch.no_grad():
        err = (loaded(*args) - m(*args)).abs().max().item()
    print(name, "export s", round(t1 - t0, 1), "load s", round(time.time() - t1, 2), "ran", loaded.backend, "err", err)
PY
t bench
timeout "${BENCH_S:-400}" torchmux bench --device cuda --models "${BENCH_MODELS:-resnet,bert}" --batch-size 8 --latency-only \
  --rounds 10 --timeout 390 --no-progress --systems "${BENCH_SYSTEMS:-eager,inductor,aoti,torchmux:auto,torchmux-export:auto}" \
  --out "$OUT/bench" > "$OUT/bench.log" 2>&1; echo "rc=$?"; grep -v "Warning\|warn\|self\._" "$OUT/bench.log" | tail -40
t done
