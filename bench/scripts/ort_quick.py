"""Quick latency check of the onnxruntime backend against eager and Inductor on zoo models.

    python bench/scripts/ort_quick.py [--models mlp,resnet,bert,gpt2] [--batch 8] [--rounds 30] [--threads 1]

Each model is compiled three ways: eager (the nn.Module as is), Inductor (``torch.compile`` default)
and ``torchmux.compile(backend="onnxruntime")``. After warm-up, the three run in interleaved rounds
(so machine noise hits them alike); the table shows median milliseconds and the ratio to eager
(below 1 is faster). ``--threads`` sets torch's and ONNX Runtime's intra-op threads alike (1 by
default: on a shared machine, a multi-threaded op waits for its slowest thread). It also times the hot path on a small graph: IOBinding on torch memory against
``session.run`` with NumPy arrays in and out.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import torchmux
from torchmux.bench import zoo


def _samples_ms(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[k].append((time.perf_counter() - t0) * 1e3)
    return samples


def models(names: list[str], batch: int, rounds: int, threads: int) -> None:
    print(f"batch {batch}, {rounds} interleaved rounds, torch and onnxruntime threads {threads}")
    print("median ms (min ms): on a shared machine the minimum is the better estimate of the work itself")
    print(
        f"{'model':<8} {'eager':>15} {'inductor':>15} {'onnxruntime':>15} {'inductor/eager':>15} {'ort/eager':>10} "
        f"{'ort/eager min':>14} {'ort compile s':>14}"
    )
    for name in names:
        model, args = zoo.build(name, batch)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inductor = torch.compile(model)
            ort_model = torchmux.compile(
                model, backend="onnxruntime", options={"onnxruntime.intra_op_num_threads": threads}
            )
            t0 = time.perf_counter()
            ort_model(*args)
            ort_compile = time.perf_counter() - t0
            fns = {"eager": lambda: model(*args), "inductor": lambda: inductor(*args), "ort": lambda: ort_model(*args)}
            for fn in fns.values():  # warm up (Inductor compiles here)
                fn()
                fn()
            s = _samples_ms(fns, rounds)
        med = {k: statistics.median(v) for k, v in s.items()}
        low = {k: min(v) for k, v in s.items()}
        cell = {k: f"{med[k]:.3f} ({low[k]:.3f})" for k in s}
        print(
            f"{name:<8} {cell['eager']:>15} {cell['inductor']:>15} {cell['ort']:>15} "
            f"{med['inductor'] / med['eager']:15.2f} {med['ort'] / med['eager']:10.2f} "
            f"{low['ort'] / low['eager']:14.2f} {ort_compile:14.2f}"
        )
        torch._dynamo.reset()


def hot_path(rounds: int, threads: int) -> None:
    from torchmux.core.registry import get_registry
    from torchmux.core.trace import trace

    x = torch.randn(64, 256)
    ir = trace(lambda x: torch.relu(x) + 1, [x])
    graph = (
        get_registry()
        .get("onnxruntime")
        .compile(torchmux.CompileRequest(ir, [x], options={"intra_op_num_threads": threads}))
    )
    session = graph.session  # type: ignore[attr-defined]  # the ONNX Runtime backend's compiled graph keeps its session
    name_in, name_out = session.get_inputs()[0].name, session.get_outputs()[0].name

    def numpy_round_trip() -> torch.Tensor:
        return torch.from_numpy(session.run([name_out], {name_in: x.numpy()})[0])

    s = _samples_ms({"iobinding": lambda: graph(x), "numpy": numpy_round_trip}, rounds * 20)
    print(
        f"hot path, relu(x)+1 on f32[64, 256], median (min): IOBinding {statistics.median(s['iobinding']) * 1e3:.1f} "
        f"({min(s['iobinding']) * 1e3:.1f}) us, session.run with NumPy {statistics.median(s['numpy']) * 1e3:.1f} "
        f"({min(s['numpy']) * 1e3:.1f}) us"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,resnet,bert,gpt2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    models(a.models.split(","), a.batch, a.rounds, a.threads)
    hot_path(a.rounds, a.threads)


if __name__ == "__main__":
    main()
