"""The varying-shape workload: one model called with 50 sizes, total time including every compile.

    python bench/scripts/varying_shapes.py [--models mlp,bert,gpt2] [--calls 50] [--seed 13]
                                           [--systems eager,torch.compile,auto,onnxruntime,inductor]

Sizes are drawn from a fixed seed: batch sizes 2..128 for the MLP (zoo ``mlp``), sequence lengths
2..127 (batch 1) for the tiny BERT and GPT-2 (zoo ``bert``, ``gpt2``). Each system gets a fresh
compile of the same model and runs the same sequence once, from its first call (capture, compile,
tuning) to its last; the table shows the total seconds, the ratio to ``torch.compile`` on the same
sequence (default options: Inductor, ``dynamic=None``), how many graphs each torchmux backend compiled
(``Backend.compile`` calls; a graph a backend places in several regions counts once per region), and
whether every call matched eager. The decision cache and Inductor's cache are fresh temporary
folders, so nothing remembered hides a compile or a tuning. Timings on a shared machine are noisy: compare ratios within
one run.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch


def _sizes(model: str, calls: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(2, 128) if model == "mlp" else rng.randint(2, 127) for _ in range(calls)]


def _inputs(model: str, n: int, g: torch.Generator) -> tuple[Any, ...]:
    if model == "mlp":
        return (torch.randn(n, 256, generator=g),)
    return (torch.randint(0, 1000, (1, n), generator=g),)


def _count_compiles() -> dict[str, int]:
    from torchmux.core.registry import get_registry

    counts: dict[str, int] = {}
    for backend in get_registry().available():
        real = backend.compile

        def counted(request: Any, real: Callable[..., Any] = real, name: str = backend.name) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return real(request)

        backend.compile = counted  # type: ignore[method-assign]
    return counts


def run(models: list[str], systems: list[str], calls: int, seed: int) -> None:
    import torchmux
    from torchmux.bench import zoo

    counts = _count_compiles()
    print(
        f"{'model':6} {'system':13} {'total s':>8} {'vs torch.compile':>16}  compiles per backend         matches eager"
    )
    for name in models:
        model, _ = zoo.build(name, 1)
        sizes = _sizes(name, calls, seed)
        g = torch.Generator().manual_seed(seed)
        inputs = [_inputs(name, n, g) for n in sizes]
        with torch.no_grad():
            expected = [zoo.tensors_of(model(*a)) for a in inputs]
        totals: dict[str, float] = {}
        for system in systems:
            torch._dynamo.reset()
            counts.clear()
            if system == "eager":
                fn: Callable[..., Any] = model
            elif system == "torch.compile":
                fn = torch.compile(model)
            else:
                fn = torchmux.compile(model, backend="auto" if system == "auto" else system)
            ok = True
            with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                warnings.simplefilter("always")
                t0 = time.perf_counter()
                outs = [zoo.tensors_of(fn(*a)) for a in inputs]
                totals[system] = time.perf_counter() - t0
            for got, want in zip(outs, expected):
                for a, b in zip(got, want):
                    ok = ok and torch.allclose(a, b, rtol=1e-3, atol=1e-3)
            fallbacks = sum(1 for w in caught if "Fallback" in w.category.__name__)
            ratio = totals[system] / totals["torch.compile"] if "torch.compile" in totals else float("nan")
            compiled = (
                ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                if system not in ("eager", "torch.compile")
                else "-"
            )
            print(
                f"{name:6} {system:13} {totals[system]:8.2f} {ratio:16.2f}  {compiled:28} {'yes' if ok else 'NO'}"
                + (f"  ({fallbacks} fallback warnings)" if fallbacks else ""),
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,bert")
    parser.add_argument("--systems", default="eager,torch.compile,auto,onnxruntime,inductor")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    os.environ.setdefault("TORCHMUX_CACHE_DIR", tempfile.mkdtemp(prefix="torchmux-varying-"))
    # Inductor's own on-disk cache too (torch.compile and torchmux's inductor both use it): cold for all
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torchmux-varying-inductor-"))
    systems = args.systems.split(",")
    if "torch.compile" in systems:  # the reference first, so every other row has its ratio
        systems.remove("torch.compile")
        systems.insert(0, "torch.compile")
    run(args.models.split(","), systems, args.calls, args.seed)


if __name__ == "__main__":
    main()
