"""Start-up of a deployed model: load + first call in a fresh process, torchmux's package against the
library used directly.

    python -m torchmux.bench.scripts.package_load --model bert --batch-size 8 --threads 1 --repeats 5

Builds, once, in this process: the ``.onnx`` file ``torch.onnx.export(model, args, dynamo=True,
optimize=True)`` writes, the AOTInductor package ``aoti_compile_and_package(torch.export.export(...))``
writes, and torchmux packages of the same model with ``backend="onnxruntime"`` and
``backend="inductor"``. Then, ``--repeats`` times each, a fresh Python process imports what it needs
(timed apart: ``import``), then opens the artifact and answers once (``load + first call``):

- ``onnxruntime``: ``InferenceSession(path)`` + ``run`` (needs only ``onnxruntime`` and NumPy);
- ``aoti``: ``aoti_load_package(path)`` + a call;
- ``torchmux-export:<backend>``: ``torchmux.load(path)`` + a call.

Each child's file system caches are warm (the parent wrote the files); AOTInductor's loader extracts
its library into a temporary folder per load. The table gives medians (seconds) and the ratio of
torchmux's load + first call to the direct library's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

CHILD = {
    "onnxruntime": """
import time, sys, numpy as np
t0 = time.perf_counter()
import onnxruntime as ort
t1 = time.perf_counter()
so = ort.SessionOptions(); so.intra_op_num_threads = {threads}
so.add_session_config_entry("session.intra_op.allow_spinning", "0")
s = ort.InferenceSession(sys.argv[1], sess_options=so, providers=["CPUExecutionProvider"])
x = [np.load(p) for p in sys.argv[2:]]
s.run(None, {{i.name: a for i, a in zip(s.get_inputs(), x)}})
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
""",
    "aoti": """
import time, sys
t0 = time.perf_counter()
import torch
from torch._inductor import aoti_load_package
{extra_import}
t1 = time.perf_counter()
torch.set_num_threads({threads})
x = [torch.load(p, weights_only=True) for p in sys.argv[2:]]
m = aoti_load_package(sys.argv[1])
with torch.no_grad():
    m(*x)
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
""",
    "torchmux": """
import time, sys
t0 = time.perf_counter()
import torch
import torchmux
{extra_import}
t1 = time.perf_counter()
torch.set_num_threads({threads})
x = [torch.load(p, weights_only=True) for p in sys.argv[2:]]
m = torchmux.load(sys.argv[1])
with torch.no_grad():
    m(*x)
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
""",
}


def build(model_name: str, batch: int, folder: Path) -> dict[str, Path]:
    import numpy as np
    from torch._inductor import aoti_compile_and_package

    import torchmux
    from torchmux.bench import zoo

    model, args = zoo.build(model_name, batch)
    for i, a in enumerate(args):
        torch.save(a, folder / f"in{i}.pt")
        np.save(folder / f"in{i}.npy", a.numpy())
    with torch.no_grad():
        onnx_program = torch.onnx.export(model, args, dynamo=True, optimize=True, verbose=False)
        assert onnx_program is not None
        onnx_program.save(str(folder / "model.onnx"))
        aoti_compile_and_package(torch.export.export(model, args), package_path=str(folder / "model.pt2"))
    out = {"onnxruntime": folder / "model.onnx", "aoti": folder / "model.pt2"}
    for backend in ("onnxruntime", "inductor"):
        exported = torchmux.export(model, args, backend=backend)
        if exported.backend == backend:
            out[f"torchmux-export:{backend}"] = exported.save(folder / f"{backend}.tmux")
    return out


def child(system: str, path: Path, folder: Path, threads: int, model_name: str) -> tuple[float, float]:
    kind = "torchmux" if system.startswith("torchmux") else system
    ext = ".npy" if kind == "onnxruntime" else ".pt"
    inputs = sorted(str(p) for p in folder.glob(f"in*{ext}"))
    extra = "import transformers.modeling_outputs" if model_name in ("bert", "gpt2", "t5_encoder", "vit") else ""
    code = CHILD[kind].format(threads=threads, extra_import=extra)
    out = subprocess.run([sys.executable, "-c", code, str(path), *inputs], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{system}: {out.stderr[-2000:]}")
    imp, load = (float(v) for v in out.stdout.split()[-2:])
    return imp, load


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bert")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    folder = Path(tempfile.mkdtemp(prefix="torchmux-package-load-"))
    paths = build(a.model, a.batch_size, folder)
    times: dict[str, list[tuple[float, float]]] = {s: [] for s in paths}
    for _ in range(a.repeats):  # interleaved: the machine's noise falls on every system alike
        for system, path in paths.items():
            times[system].append(child(system, path, folder, a.threads, a.model))
    rows: dict[str, dict[str, float | None]] = {
        s: {"import_s": statistics.median(i for i, _ in t), "load_first_call_s": statistics.median(v for _, v in t)}
        for s, t in times.items()
    }
    base = {"torchmux-export:onnxruntime": "onnxruntime", "torchmux-export:inductor": "aoti"}
    print(f"{a.model}, batch {a.batch_size}, {a.threads} thread(s), median of {a.repeats} fresh processes")
    print(f"{'system':<30}{'import s':>10}{'load+call s':>13}{'vs direct':>11}{'size MB':>10}")
    for s, r in rows.items():
        load, imp = float(r["load_first_call_s"] or 0.0), float(r["import_s"] or 0.0)
        ratio = load / float(rows[base[s]]["load_first_call_s"] or 1.0) if s in base and base[s] in rows else None
        size = paths[s].stat().st_size / 1e6
        r["size_mb"] = size
        r["vs_direct"] = ratio
        print(f"{s:<30}{imp:>10.3f}{load:>13.3f}{(f'{ratio:.2f}x' if ratio else '-'):>11}{size:>10.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
