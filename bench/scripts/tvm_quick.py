"""Quick latency check of the tvm backend, untuned and tuned, against eager, Inductor and ONNX Runtime.

    python bench/scripts/tvm_quick.py [--models mlp,resnet,bert,gpt2] [--batch 2] [--rounds 20] [--tune-seconds 20] [--threads 1]

Each model runs as: eager (the nn.Module as is), Inductor (``torch.compile`` default),
``torchmux.compile(backend="onnxruntime")`` (if that backend is available), ``backend="tvm"`` and
``backend="tvm", mode="max-autotune"`` with a short MetaSchedule budget per graph. After warm-up all
run in interleaved rounds (machine noise hits them alike); the table shows median milliseconds and the
ratio to eager (below 1 is faster), and the seconds the first tvm call took (import, build, tuning).
The tuning cache is a fresh temporary folder, so the tuned column measures this run's budget only.
``--threads`` sets torch's, TVM's (``TVM_NUM_THREADS`` and the target's ``num-cores``) and ONNX Runtime's
threads alike (1 by default: TVM's and ONNX Runtime's pool threads spin after each call, and on a small
shared machine spinning threads of one system slow the next one in an interleaved round).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import torchmux
from torchmux.bench import zoo
from torchmux.core.registry import get_registry


def _samples_ms(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[k].append((time.perf_counter() - t0) * 1e3)
    return samples


def _first_call(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _host_target(threads: int) -> dict[str, Any]:
    """The tvm backend's default target with ``num-cores`` set to ``threads``."""
    import tvm

    target: dict[str, Any] = {"kind": "llvm", "num-cores": threads}
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    if mcpu and mcpu != "generic":
        target["mcpu"] = mcpu
    return target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,resnet,bert,gpt2")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tune-seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=1)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    os.environ["TVM_NUM_THREADS"] = str(a.threads)  # read when TVM's thread pool starts
    os.environ.setdefault("TORCHMUX_CACHE_DIR", tempfile.mkdtemp(prefix="tvm-bench-"))
    with_ort = get_registry().availability("onnxruntime").ok if "onnxruntime" in get_registry().names else False
    tune = {"tvm.tune_seconds": a.tune_seconds, "tvm.trials_per_round": 8}
    tvm_opts = {"tvm.target": _host_target(a.threads)}
    print(
        f"batch {a.batch}, {a.rounds} interleaved rounds, threads {a.threads} (torch, tvm, onnxruntime), "
        f"tuning budget {a.tune_seconds:.0f} s per graph; median ms, ratio to eager"
    )
    cols = ["eager", "inductor"] + (["onnxruntime"] if with_ort else []) + ["tvm", "tvm-tuned"]
    print(
        f"{'model':<8}"
        + "".join(f"{c:>12}" for c in cols)
        + "".join(f"{c + '/eager':>18}" for c in cols[1:])
        + f"{'tvm 1st s':>11}{'tuned 1st s':>12}"
    )
    for name in a.models.split(","):
        model, args = zoo.build(name, a.batch)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fns: dict[str, Callable[[], Any]] = {"eager": lambda: model(*args)}
            inductor = torch.compile(model)
            fns["inductor"] = lambda: inductor(*args)
            if with_ort:
                ort = torchmux.compile(
                    model, backend="onnxruntime", options={"onnxruntime.intra_op_num_threads": a.threads}
                )
                fns["onnxruntime"] = lambda: ort(*args)
            tvm_model = torchmux.compile(model, backend="tvm", options=tvm_opts)
            first = _first_call(lambda: tvm_model(*args))
            fns["tvm"] = lambda: tvm_model(*args)
            tuned_model = torchmux.compile(model, backend="tvm", mode="max-autotune", options={**tune, **tvm_opts})
            tuned_first = _first_call(lambda: tuned_model(*args))
            fns["tvm-tuned"] = lambda: tuned_model(*args)
            for fn in fns.values():  # warm up (Inductor and ONNX Runtime compile here)
                fn()
                fn()
            s = _samples_ms(fns, a.rounds)
        med = {k: statistics.median(v) for k, v in s.items()}
        print(
            f"{name:<8}"
            + "".join(f"{med[c]:12.3f}" for c in cols)
            + "".join(f"{med[c] / med['eager']:18.2f}" for c in cols[1:])
            + f"{first:11.1f}{tuned_first:12.1f}"
        )
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
