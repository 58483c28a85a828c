"""What isolated trials cost on a cold start: auto's first call with ``isolate="off"`` and ``"all"``.

Each run is a fresh process with fresh caches (torchmux's and Inductor's), so every candidate is
built from nothing; the two settings alternate, run after run, so a busy machine slows both alike.
Then the warm starts (a second process on the same caches): auto's after an ``"all"`` run (the
verdicts and the decision are on disk, so no child is started and no trial run), and, for
reference, ``torch.compile``'s; ``warm/cold`` is auto's warm start over its cold one.

    python -m torchmux.bench.scripts.isolation_cold_start --models mlp,resnet --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys, time, warnings
import torch, torchmux
from torchmux.autotune import isolate
from torchmux.bench import zoo
torch.set_num_threads(1)
model, args = zoo.build(sys.argv[1], 8)
t0 = time.perf_counter()
with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    compiled = torch.compile(model) if sys.argv[2] == "torch.compile" else torchmux.compile(model, backend="auto")
    compiled(*args)
print(json.dumps({"seconds": time.perf_counter() - t0, "trials": isolate._SERVER.trials}))
"""


def first_call(model: str, isolation: str, cache: str) -> dict[str, float]:
    env = dict(
        os.environ,
        TORCHMUX_CACHE_DIR=os.path.join(cache, "torchmux"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
        TORCHMUX_ISOLATE=isolation if isolation != "torch.compile" else "off",
    )
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, model, isolation], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,resnet")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    print(
        f"{'model':10} {'torch.compile':>13} {'auto off':>9} {'auto all':>9} {'all/off':>8} {'all/tc':>7} "
        f"{'warm all':>9} {'warm/cold':>9} {'warm tc':>8} {'trials':>7} {'warm trials':>11}"
        "   (seconds, first call)"
    )
    for model in a.models.split(","):
        tc, off, on, warm, warm_tc, trials, warm_trials = [], [], [], [], [], 0, 0
        for _ in range(a.repeats):
            with tempfile.TemporaryDirectory() as c0, tempfile.TemporaryDirectory() as c1:
                with tempfile.TemporaryDirectory() as c2:
                    tc.append(first_call(model, "torch.compile", c0)["seconds"])
                    off.append(first_call(model, "off", c1)["seconds"])
                    r = first_call(model, "all", c2)
                    on.append(r["seconds"])
                    trials = int(r["trials"])
                    r = first_call(model, "all", c2)
                    warm.append(r["seconds"])
                    warm_trials = int(r["trials"])
                    warm_tc.append(first_call(model, "torch.compile", c0)["seconds"])
        t, o, n, w, wt = (statistics.median(v) for v in (tc, off, on, warm, warm_tc))
        print(
            f"{model:10} {t:13.2f} {o:9.2f} {n:9.2f} {n / o:8.2f} {n / t:7.2f} {w:9.2f} {w / n:9.2f} {wt:8.2f} "
            f"{trials:7d} {warm_trials:11d}",
            flush=True,
        )


if __name__ == "__main__":
    main()
