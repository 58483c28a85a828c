"""Start-up of a deployed model: load + first call in a fresh process, torchmux's package against the
library used directly.

    python -m torchmux.bench.scripts.package_load --model bert --batch-size 8 --threads 1 --repeats 5
        [--systems onnxruntime,torchmux-export:onnxruntime]

Builds, once, in this process: the ``.onnx`` file ``torch.onnx.export(model, args, dynamo=True,
optimize=True)`` writes, the AOTInductor package ``aoti_compile_and_package(torch.export.export(...))``
writes, and torchmux packages of the same model with ``backend="onnxruntime"`` and
``backend="inductor"``. Then, ``--repeats`` times each (after one untimed round that writes the bytecode
cache, as an installed package has it), a fresh Python process times two things:

- ``torch s``: importing torch (and the model's output types) and reading the inputs: what a program
  that holds torch tensors has done anyway. ONNX Runtime used directly needs no torch: 0.
- ``ready s``: from there to the first answer: importing the library that runs the model, opening the
  artifact, one call. ``onnxruntime``: ``import onnxruntime`` + ``InferenceSession(path)`` + ``run``;
  ``aoti``: ``from torch._inductor import aoti_load_package`` + ``aoti_load_package(path)`` + a call;
  ``torchmux-export:<backend>``: ``import torchmux`` + ``torchmux.load(path)`` + a call.

The ratio ``vs direct`` is torchmux's ``ready s`` over the direct library's (the comparison the issue
asks for: what opening the deployed artifact costs); ``total s`` adds the torch import, which ONNX
Runtime's own users do not pay (NumPy they import before the clock starts, as torch's users have it).
Each child's file system caches are warm (the parent wrote the files); AOTInductor's loader extracts
its library into a temporary folder per load. Medians, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

# Each child prints two figures: seconds to import torch (and the model's output types), then seconds from
# there to the first answer: importing the library that runs the model, opening its artifact, one call.
# ONNX Runtime used directly needs no torch: its first figure is 0.
CHILD = {
    "onnxruntime": """
import time, sys
import numpy as np
x = [np.load(p) for p in sys.argv[2:]]
t0 = time.perf_counter()
import onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = {threads}
so.add_session_config_entry("session.intra_op.allow_spinning", "0")
s = ort.InferenceSession(sys.argv[1], sess_options=so, providers=["CPUExecutionProvider"])
s.run(None, {{i.name: a for i, a in zip(s.get_inputs(), x)}})
print(0.0, time.perf_counter() - t0)
""",
    "aoti": """
import time, sys
t0 = time.perf_counter()
import torch
{extra_import}
torch.set_num_threads({threads})
x = [torch.load(p, weights_only=True) for p in sys.argv[2:]]
t1 = time.perf_counter()
from torch._inductor import aoti_load_package
m = aoti_load_package(sys.argv[1])
with torch.no_grad():
    m(*x)
print(t1 - t0, time.perf_counter() - t1)
""",
    "torchmux": """
import time, sys
t0 = time.perf_counter()
import torch
{extra_import}
torch.set_num_threads({threads})
x = [torch.load(p, weights_only=True) for p in sys.argv[2:]]
t1 = time.perf_counter()
import torchmux
m = torchmux.load(sys.argv[1])
with torch.no_grad():
    m(*x)
print(t1 - t0, time.perf_counter() - t1)
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
    # bytecode cached as an installed package has it (pip compiles it; this machine's PYTHONDONTWRITEBYTECODE
    # would make every child compile torchmux's sources again)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    cmd = [sys.executable, "-c", code, str(path), *inputs]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
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
    p.add_argument(
        "--systems",
        default="onnxruntime,aoti,torchmux-export:onnxruntime,torchmux-export:inductor",
        help="which to time (comma-separated; AOTInductor's take seconds each)",
    )
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    folder = Path(tempfile.mkdtemp(prefix="torchmux-package-load-"))
    wanted = a.systems.split(",")
    paths = {s: path for s, path in build(a.model, a.batch_size, folder).items() if s in wanted}
    times: dict[str, list[tuple[float, float]]] = {s: [] for s in paths}
    for system, path in paths.items():  # untimed: writes the bytecode cache
        child(system, path, folder, a.threads, a.model)
    for _ in range(a.repeats):  # interleaved: the machine's noise falls on every system alike
        for system, path in paths.items():
            times[system].append(child(system, path, folder, a.threads, a.model))
    rows: dict[str, dict[str, float | None]] = {
        s: {"torch_s": statistics.median(i for i, _ in t), "ready_s": statistics.median(v for _, v in t)}
        for s, t in times.items()
    }
    base = {"torchmux-export:onnxruntime": "onnxruntime", "torchmux-export:inductor": "aoti"}
    print(f"{a.model}, batch {a.batch_size}, {a.threads} thread(s), median of {a.repeats} fresh processes")
    print(f"{'system':<30}{'torch s':>9}{'ready s':>9}{'vs direct':>11}{'total s':>9}{'size MB':>9}")
    for s, r in rows.items():
        load, imp = float(r["ready_s"] or 0.0), float(r["torch_s"] or 0.0)
        ratio = load / float(rows[base[s]]["ready_s"] or 1.0) if s in base and base[s] in rows else None
        size = paths[s].stat().st_size / 1e6
        r["size_mb"] = size
        r["vs_direct"] = ratio
        print(f"{s:<30}{imp:>9.3f}{load:>9.3f}{(f'{ratio:.2f}x' if ratio else '-'):>11}{imp + load:>9.3f}{size:>9.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
