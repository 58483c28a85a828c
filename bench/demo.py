"""``torchmux demo``: compile a real model with backend="auto" and show what ran where and how fast."""

from __future__ import annotations

import statistics
import time
import warnings

import torch


def _median_ms(fn, args, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(*args)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def run_demo(model_name: str = "bert", batch: int = 8, rounds: int = 30) -> int:
    import torchmux
    from torchmux.api.explain import compile_recorded, last_measurements, report
    from torchmux.bench.zoo import ZOO, build, tensors_of
    from torchmux.core.registry import format_backends

    warnings.simplefilter("ignore")
    print("Backends on this machine:\n")
    print(format_backends(torchmux.list_backends()))
    entry = ZOO[model_name]
    print(f"\nModel: {model_name} ({entry.description}), batch {batch}\n")
    model, args = build(model_name, batch)
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled, recorder = compile_recorded(model, backend="auto")
        got = tensors_of(compiled(*args))  # first call: capture, compile every candidate, measure, choose
        first_call = time.perf_counter() - t0
        expected = tensors_of(model(*args))
        same = all(torch.allclose(g, e, atol=1e-4, rtol=1e-4) for g, e in zip(got, expected))
        explained = report(recorder)
        print(explained)
        print("\nWhat each backend measured, per graph (median of interleaved rounds; failures with their reason):")
        eager_ms, mux_ms = [], []
        for _ in range(3):  # interleave eager and torchmux so machine noise hits both alike
            eager_ms += _median_ms(model, args, rounds // 3)
            mux_ms += _median_ms(compiled, args, rounds // 3)
    for line in last_measurements(explained):
        print("  " + line)
    e, m = statistics.median(eager_ms), statistics.median(mux_ms)
    print(f"\nfirst call (capture + compile + autotune): {first_call:.1f} s")
    print(f"eager:    {e:8.3f} ms   (median of {len(eager_ms)})")
    print(f"torchmux: {m:8.3f} ms   -> {e / m:.2f}x eager; outputs {'match' if same else 'DIFFER FROM'} eager")
    return 0 if same else 1
