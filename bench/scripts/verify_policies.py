# What each verify policy costs a user's call in steady state, and when a backend that turns wrong is
# caught (README "What verify promises", plugins.md section 2 quote these figures). For each zoo model:
# torchmux.compile(model, backend=B, options={"verify": P}) for P in off, sparse, always, one process,
# the three compiled models called in interleaved bursts of 200 calls (11 rounds, medians per call).
#   python -m torchmux.bench.scripts.verify_policies [backend] [model ...]   (default: onnxruntime mlp bert)
import statistics
import sys
import time
import warnings

import torch

import torchmux
from torchmux.autotune.verify import next_scheduled, scheduled
from torchmux.bench import zoo

backend = sys.argv[1] if len(sys.argv) > 1 else "onnxruntime"
warnings.simplefilter("ignore")
torch.set_num_threads(1)
for name in sys.argv[2:] or ("mlp", "bert"):
    model, args = zoo.build(name, batch=8)
    model.eval()
    compiled = {}
    with torch.no_grad():
        for policy in ("off", "sparse", "always"):
            torch._dynamo.reset()
            compiled[policy] = torchmux.compile(model, backend=backend, options={"verify": policy})
            for _ in range(300):  # past the sparse schedule's early checks (1, 2, 4, ..., 256)
                compiled[policy](*args)
        times: dict[str, list[float]] = {p: [] for p in compiled}
        for _ in range(11):
            for policy, fn in compiled.items():
                t0 = time.perf_counter()
                for _ in range(200):
                    fn(*args)
                times[policy].append((time.perf_counter() - t0) / 200)
    med = {p: statistics.median(t) for p, t in times.items()}
    print(
        f"{name} on {backend} (1 thread): per call off {med['off'] * 1e6:.0f} us, sparse {med['sparse'] * 1e6:.0f} us "
        f"({med['sparse'] / med['off']:.2f}x), always {med['always'] * 1e6:.0f} us ({med['always'] / med['off']:.2f}x)"
    )
# the schedule itself: a backend wrong from the user's call k on is caught at the first checked call >= k
for k in (3, 5, 100, 5000, 10000):
    caught = k if scheduled(k) else next_scheduled(k)
    print(f"wrong from call {k}: caught at call {caught}, {caught - k} wrong answers returned before it")
