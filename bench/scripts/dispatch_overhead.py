"""What torchmux adds to every call: a tiny model where the work is small and the overhead shows.

    python bench/scripts/dispatch_overhead.py [--layers 10] [--calls 2000]

Ten 4x4 Linear layers on a 2x4 input: eager, ``torch.compile`` (Inductor) and
``torchmux.compile(backend="inductor")`` with the mend pass on (the default) and off. All four run
the same Inductor code or the same ATen ops; the difference is what happens around them: Dynamo's
guards and AOTAutograd's wrapper (torch.compile's cost), plus torchmux's (the Dynamo switches the
mend pass sets around each call, the runner's lookup of its decision). Each figure is the best of
five runs of ``--calls`` calls, in microseconds per call; one thread.
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import torchmux


class Stack(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    model, x = Stack(a.layers).eval(), torch.randn(2, 4)
    systems = {
        "eager": model,
        "torch.compile": torch.compile(model),
        "torchmux inductor": torchmux.compile(model, backend="inductor"),
        "torchmux inductor, mend off": torchmux.compile(model, backend="inductor", options={"mend": False}),
    }
    with torch.no_grad():
        for fn in systems.values():
            fn(x)  # compile
        figures = {name: per_call_us(functools.partial(fn, x), a.calls) for name, fn in systems.items()}
    base = figures["torch.compile"]
    print(f"{'system':30s} {'us/call':>8s} {'vs torch.compile':>17s}")
    for name, us in figures.items():
        print(f"{name:30s} {us:8.1f} {us - base:+16.1f}")


if __name__ == "__main__":
    main()
