"""Do ONNX Runtime sessions and torch's threads slow each other in one process? Side by side.

    python -m torchmux.bench.scripts.ort_sessions [--model mlp] [--batch 8] [--threads 2] [--rounds 7]

A zoo model is exported once (weights as initializers) and run by session A, one subprocess per
setting (a global pool and libgomp's spin count are fixed per process), the settings taking turns:

- ``spinning``: ONNX Runtime's default: each session's intra-op pool spins after a run, waiting for the next;
- ``no spinning``: ``session.intra_op.allow_spinning=0``: workers sleep between parallel sections,
  even inside a run;
- ``spin in run``: spinning on, ``session.force_spinning_stop=1``: workers spin between the parallel
  sections of a run and stop when it returns (torchmux's option ``allow_spinning``);
- ``global pool``: one process-wide pool for every session (``use_per_session_threads=False`` +
  ``set_global_thread_pool_sizes``); from Python its spinning cannot be turned off (the session's
  entries do not reach it, ``force_spinning_stop`` applies to per-session pools only);
- ``torchmux``: what backends/onnxruntime/session.py sets: no spinning, ``force_spinning_stop``, and
  every session on one process-wide CPU arena (``create_and_register_allocator`` +
  ``session.use_env_allocators=1``).

Columns: A alone; A with a second session B alive and idle; A and B called alternately (a model with
a graph break, or two input shapes, lives like that: a session per graph and per shape); A right after
a torch op that runs in parallel (torch's OpenMP threads spin after it: the eager ops between ONNX
Runtime regions, or the rest of a model); and the CPU time the process burns in the 20 ms after one
run of A while the main thread sleeps (idle threads spinning: cores taken from whatever runs next).
Latencies are medians over ``--rounds`` interleaved rounds of bursts, best of ``--passes``
processes, in microseconds per call of A. On a shared machine compare columns within a run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SETTINGS = ("spinning", "no spinning", "spin in run", "global pool", "torchmux")


def _child(setting: str, model_path: str, threads: int, calls: int, rounds: int) -> dict[str, float]:
    import numpy as np
    import onnxruntime as ort
    import torch

    torch.set_num_threads(threads)
    shared = setting == "global pool"
    if shared:
        from onnxruntime.capi import _pybind_state as C

        C.set_global_thread_pool_sizes(threads, 1)
    if setting == "torchmux":
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, None)

    def session() -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if shared:
            so.use_per_session_threads = False
        else:
            so.intra_op_num_threads = threads
        spin = setting in ("spinning", "spin in run", "global pool")
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        if setting in ("spin in run", "torchmux"):
            so.add_session_config_entry("session.force_spinning_stop", "1")
        if setting == "torchmux":
            so.add_session_config_entry("session.use_env_allocators", "1")
        return ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])

    a = session()
    feeds = {
        i.name: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32)
        if i.type == "tensor(float)"
        else np.zeros(i.shape, np.int64)
        for i in a.get_inputs()
    }
    big = torch.randn(384, 384)

    def burst(first: ort.InferenceSession, other: ort.InferenceSession | None = None) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            first.run(None, feeds)
            if other is not None:
                other.run(None, feeds)
        return (time.perf_counter() - t0) / calls / (2 if other is not None else 1)

    def after_torch_op() -> float:
        spent = 0.0
        for _ in range(calls):
            torch.mm(big, big)
            t1 = time.perf_counter()
            a.run(None, feeds)
            spent += time.perf_counter() - t1
        return spent / calls

    def idle_cpu() -> float:
        time.sleep(0.03)  # torch's OpenMP workers, spinning after the last torch op, go to sleep first
        a.run(None, feeds)
        c0 = time.process_time()
        time.sleep(0.02)
        return time.process_time() - c0

    for _ in range(3):  # warm-up: first runs page in the weights and settle the allocator
        burst(a)
    rows: dict[str, list[float]] = {"alone": [], "b idle": [], "alternating": [], "after torch op": [], "idle cpu": []}
    alone = [burst(a) for _ in range(rounds)]
    b = session()
    b.run(None, feeds)
    for _ in range(rounds):  # interleaved: machine noise hits every column alike
        rows["b idle"].append(burst(a))
        rows["alternating"].append(burst(a, b))
        rows["after torch op"].append(after_torch_op())
        rows["idle cpu"].append(idle_cpu())
    rows["alone"] = alone
    return {k: statistics.median(v) * 1e6 for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=2, help="processes per setting, taking turns; best kept")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a.child, a.path, a.threads, a.calls, a.rounds)))
        return

    import torch

    from torchmux.bench.zoo import build

    model, args = build(a.model, a.batch)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{a.model}.onnx")
        with torch.no_grad():
            program = torch.onnx.export(model.eval(), args, dynamo=True, optimize=True, verbose=False)
            assert program is not None
            program.save(path)
        rows: dict[str, dict[str, float]] = {}
        for setting in [s for _ in range(a.passes) for s in SETTINGS]:  # settings take turns: noise hits all
            cmd = [sys.executable, "-m", "torchmux.bench.scripts.ort_sessions", "--child", setting, "--path", path]
            cmd += ["--threads", str(a.threads), "--calls", str(a.calls), "--rounds", str(a.rounds)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            new = json.loads(out.stdout.strip().splitlines()[-1])
            rows[setting] = {k: min(v, rows.get(setting, new)[k]) for k, v in new.items()}
    print(
        f"{a.model} batch {a.batch}, {a.threads} intra-op threads (torch too), us per call of A: median of "
        f"{a.rounds} rounds of {a.calls} calls, best of {a.passes} processes"
    )
    print(
        f"{'setting':28s} {'A alone':>9s} {'B alive':>9s} {'A,B alternating':>16s} {'after torch op':>15s} {'idle CPU in 20 ms':>18s}"
    )
    for setting, r in rows.items():
        print(
            f"{setting:28s} {r['alone']:9.1f} {r['b idle']:9.1f} {r['alternating']:16.1f} "
            f"{r['after torch op']:15.1f} {r['idle cpu'] / 1e3:15.2f} ms"
        )


if __name__ == "__main__":
    main()
