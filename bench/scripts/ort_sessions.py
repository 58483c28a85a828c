"""Do ONNX Runtime sessions in one process slow each other? Side by side, one subprocess per setting.

    python -m torchmux.bench.scripts.ort_sessions [--threads 2] [--calls 300] [--rounds 5]

The zoo's MLP (batch 1) is exported once (weights as initializers) and run by session A: alone, then
with a second session B alive and idle, then called alternately with B (a model with a graph break,
or two input shapes, lives like that: torchmux opens a session per graph and per shape). Settings:

- ``per-session, spinning``: ONNX Runtime's defaults (each session its own intra-op pool, whose
  threads spin after a run waiting for the next one);
- ``per-session, no spinning``: what torchmux set before freezing came in;
- ``global pool``: one process-wide pool shared by every session (``use_per_session_threads=False`` +
  ``set_global_thread_pool_sizes``). From Python the global pool's spinning cannot be turned off
  (the session's ``allow_spinning`` entry does not reach it), so it spins.

What this showed on a shared 2-core machine: spinning is the cause (an idle session's threads spin
after each run and take the cores from the other session). torchmux keeps per-session pools with
spinning off (backends/onnxruntime/session.py); the global pool, spinning, did not pay.

Figures are the best of ``--rounds`` bursts of ``--calls`` calls, best of ``--passes`` processes per
setting (the settings take turns), in microseconds per call (alternating: per call of A or B).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SETTINGS = ("per-session, spinning", "per-session, no spinning", "global pool")


def _child(setting: str, model_path: str, threads: int, calls: int, rounds: int) -> dict[str, float]:
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state as C

    shared = setting.startswith("global")
    if shared:
        C.set_global_thread_pool_sizes(threads, 1)

    def session() -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if shared:
            so.use_per_session_threads = False
        else:
            so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if "no spinning" not in setting else "0")
        return ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])

    name = None
    x = None

    def burst(s: ort.InferenceSession, other: ort.InferenceSession | None) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            s.run(None, {name: x})
            if other is not None:
                other.run(None, {name: x})
        return (time.perf_counter() - t0) / calls

    a = session()
    name = a.get_inputs()[0].name
    x = (
        np.random.default_rng(0)
        .standard_normal([d if isinstance(d, int) else 1 for d in a.get_inputs()[0].shape])
        .astype(np.float32)
    )
    for _ in range(3):  # warm-up: first runs page in the weights and settle the allocator
        burst(a, None)
    alone = min(burst(a, None) for _ in range(rounds))
    b = session()
    b.run(None, {name: x})
    idle, both = [], []
    for _ in range(rounds):  # interleaved: machine noise hits both alike
        idle.append(burst(a, None))
        both.append(burst(a, b) / 2)
    return {"alone": alone * 1e6, "b idle": min(idle) * 1e6, "alternating": min(both) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=2, help="processes per setting, taking turns; best kept")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a.child, a.model, a.threads, a.calls, a.rounds)))
        return

    import torch

    from torchmux.bench.zoo import build

    model, args = build("mlp", 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp.onnx")
        with torch.no_grad():
            torch.onnx.export(model, args, path, dynamo=True, optimize=True, verbose=False)
        rows: dict[str, dict[str, float]] = {}
        for setting in [s for _ in range(a.passes) for s in SETTINGS]:  # settings take turns: noise hits all
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torchmux.bench.scripts.ort_sessions",
                    "--child",
                    setting,
                    "--model",
                    path,
                    "--threads",
                    str(a.threads),
                    "--calls",
                    str(a.calls),
                    "--rounds",
                    str(a.rounds),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            new = json.loads(out.stdout.strip().splitlines()[-1])
            rows[setting] = {k: min(v, rows.get(setting, new)[k]) for k, v in new.items()}
    print(
        f"MLP batch 1, {a.threads} intra-op threads, us per call (best burst of {a.rounds} x {a.calls}, "
        f"best of {a.passes} processes; alternating: per call of A or B)"
    )
    print(f"{'setting':28s} {'A alone':>9s} {'B alive':>9s} {'A,B alternating':>16s}")
    for setting, r in rows.items():
        print(f"{setting:28s} {r['alone']:9.1f} {r['b idle']:9.1f} {r['alternating']:16.1f}")


if __name__ == "__main__":
    main()
