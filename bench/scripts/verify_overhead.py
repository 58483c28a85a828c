# Steady-state cost of the checking policy, side by side: the same graph's GraphRunner under
# verify="first" (checks only the first call: the old behaviour) and verify="sparse" (the default),
# called alternately in bursts; no Dynamo in the loop (its guard lookup would differ between the two).
import statistics
import sys
import time

import torch

from torchmux.autotune import verify
from torchmux.autotune.runner import GraphRunner
from torchmux.bench import zoo
from torchmux.core.config import resolve
from torchmux.core.ir import GraphIR
from torchmux.core.trace import trace

backend = sys.argv[1] if len(sys.argv) > 1 else "onnxruntime"
for name in sys.argv[2:] or ("mlp", "bert"):
    model, args = zoo.build(name, batch=8)
    model.eval()
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names, n = list(state), len(state)

    def fn(*a, model=model, names=names, n=n):
        return torch.func.functional_call(model, dict(zip(names, a[:n])), tuple(a[n:]))

    flat = [t.detach() for t in state.values()] + list(args)
    traced = trace(fn, flat, name=name)
    ir = GraphIR(traced.gm, ["param"] * n + ["input"] * (len(flat) - n), name=name)
    runners = {p: GraphRunner(ir, resolve(backend, None, {"verify": p, "freeze": False})) for p in ("first", "sparse")}
    t: dict[str, list[float]] = {p: [] for p in runners}
    with torch.no_grad():
        for r in runners.values():
            r(*flat)
        N = 200
        for _ in range(11):  # 2200 calls each: the schedule's 12 checks (1..1024, 2048) all fall inside
            for p, r in runners.items():
                t0 = time.perf_counter()
                for _ in range(N):
                    r(*flat)
                t[p].append((time.perf_counter() - t0) / N)
    a, b = statistics.median(t["first"]), statistics.median(t["sparse"])
    tot_a, tot_b = sum(t["first"]), sum(t["sparse"])
    g = runners["sparse"]._fns[next(iter(runners["sparse"]._fns))]
    print(
        f"{name} on {backend}: median per call first {a * 1e6:.1f} us, sparse {b * 1e6:.1f} us (ratio {b / a:.4f}); "
        f"all 2200 calls incl. checks: ratio {tot_b / tot_a:.4f}; checks done {g.calls} calls, backend {g.backend}"
    )
    # the same figure by parts, each timed in this run: the per-call bookkeeping (input kind + schedule),
    # and one check, which steady state pays once per 1024 calls
    with torch.no_grad():
        g.s.calls = 5000
        t0 = time.perf_counter()
        for _ in range(2000):
            g._due(flat)
        due = (time.perf_counter() - t0) / 2000
        t0 = time.perf_counter()
        for _ in range(5):
            verify.check_call(ir, g.fn, flat)
        chk = (time.perf_counter() - t0) / 5
        t0 = time.perf_counter()
        for _ in range(200):
            g.fn(*flat)
        call = (time.perf_counter() - t0) / 200
    print(
        f"  by parts: call {call * 1e6:.1f} us, bookkeeping {due * 1e6:.2f} us/call, one check {chk * 1e3:.2f} ms "
        f"-> steady-state overhead {(due + chk / verify.SPARSE_EVERY) / call * 100:.2f}%"
    )
