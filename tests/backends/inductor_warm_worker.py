"""Compiles a small model with ``backend="inductor"`` under ``no_grad`` (a frozen graph), calls it,
changes a weight in place and calls it again; prints what Inductor's FX graph cache and torchmux's
trial child did, as one JSON line.

    python tests/backends/inductor_warm_worker.py

Run twice with the same TORCHMUX_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR, the second run is a warm
start (tests/backends/test_inductor.py).
"""

from __future__ import annotations

import gc
import json

import torch
from torch._dynamo.utils import counters

import torchmux
from torchmux.autotune import isolate
from torchmux.autotune.freeze import FrozenCall
from torchmux.autotune.runner import GraphRunner


def main() -> None:
    torch.manual_seed(0)  # the same weights in both runs: the trial verdicts (keyed by them) are on disk
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 12)).eval()
    x = torch.randn(5, 24)
    compiled = torchmux.compile(model, backend="inductor", options={"isolate": "all"})
    with torch.no_grad():
        first = compiled(x)
        torch.testing.assert_close(first, model(x))
        hits = counters["inductor"]["fxgraph_cache_hit"]
        model[0].weight.add_(0.5)  # noticed before the next call: refrozen, built again on the new weights
        torch.testing.assert_close(compiled(x), model(x))
    runners = [r for r in gc.get_objects() if type(r) is GraphRunner]
    print(
        json.dumps(
            {
                "frozen": [isinstance(fn, FrozenCall) for r in runners for fn in r._fns.values()],
                "backends": [d.backend for r in runners for d in r.placements()],
                "first_call": {
                    "hit": hits,
                    **{
                        k.removeprefix("fxgraph_cache_"): v
                        for k, v in counters["inductor"].items()
                        if k.startswith("fxgraph_cache_") and k != "fxgraph_cache_hit"
                    },
                },
                "after_change_hits": counters["inductor"]["fxgraph_cache_hit"] - hits,
                "trials": isolate._SERVER.trials,
                "child_starts": isolate._SERVER.starts,
            }
        )
    )


if __name__ == "__main__":
    main()
