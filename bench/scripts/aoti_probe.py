"""Where AOTInductor, used as its docs show, dies: the bench's ``aoti`` system died of SIGSEGV while compiling
the MLP, ResNet and tiny BERT on an H200 (torch 2.11, two GPU sessions), while ``torchmux-export:inductor``
(the same ``aoti_compile_and_package``, weights outside the library) ran.

    python -m torchmux.bench.scripts.aoti_probe [--model mlp] [--device cuda] [--out DIR] [--seconds 150]
        [--variants docs,no_grad,constants_outside]

Each variant runs in a child process of its own with ``faulthandler`` on (a crash prints the Python stack of
every thread: the line of torch that called into the native code that died), its output written to
``DIR/aoti-<variant>.txt`` line by line as it comes (a child killed at ``--seconds`` still leaves what it
said), and a summary line per variant on stdout (exit status or signal, seconds, the step it reached; under a failing one
the last lines its child wrote).

- ``docs``: ``torch.export.export(model, args)`` and ``aoti_compile_and_package(program, package_path=...)``
  as the docs show, then ``aoti_load_package`` and two calls;
- ``no_grad``: the same with the export and compile under ``torch.no_grad()`` (what the bench does);
- ``constants_outside``: ``aot_inductor.package_constants_in_so=False`` and the weights handed over with
  ``load_constants`` (what torchmux's ``inductor`` backend does);
- ``fresh_load``: the ``docs`` package, then loaded by two fresh processes that never compiled, one cold,
  one after the model's eager call (each one's end is a step line);
- ``torchmux_inductor`` / ``torchmux_auto``: ``torchmux.export(model, args, backend="inductor" / "auto")``
  under ``torch.no_grad()``, each candidate tried in the trial child first (a crash there is a plan row,
  printed), then saved, loaded back and called. On the H200 (torch 2.11, 2026-11-27) the named ``inductor``
  export's child died in ``aoti_load_package`` on every model tried while the same libraries loaded under
  ``auto`` in the bench: these two variants, on one model in one run, say whether the name alone decides.

On the H200 on 2026-11-28 (torch 2.11) every variant that loads a CUDA package died in ``_load_aoti``, and so
did a package built by one process and loaded by a fresh one, cold or after eager kernels and a cuBLAS handle:
AOTInductor's loader on that machine, not the way it is called (README, "It is AOTInductor's loader").

On a CPU it runs the same steps (they pass here: a regression check of the script, not of the crash).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

VARIANTS = ("docs", "no_grad", "constants_outside", "fresh_load", "torchmux_inductor", "torchmux_auto")
#: lines of a failing child's log printed under its summary line (a crash's stacks)
TAIL_LINES = 60


def _child(variant: str, model_name: str, device: str) -> None:
    import contextlib

    import torch
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    from torchmux.bench.zoo import build

    def step(text: str) -> None:
        print(f"step: {text}", flush=True)

    model, args = build(model_name, 8)
    model, args = model.to(device), tuple(a.to(device) for a in args)
    if variant.startswith("torchmux_"):
        _torchmux(variant.removeprefix("torchmux_"), model, args, step)
        return
    path = os.path.join(tempfile.mkdtemp(prefix="torchmux-aoti-probe-"), "model.pt2")
    configs = {"aot_inductor.package_constants_in_so": False} if variant == "constants_outside" else {}
    quiet = torch.no_grad() if variant != "docs" else contextlib.nullcontext()
    with quiet:
        step("torch.export.export")
        program = torch.export.export(model, args)
        step("aoti_compile_and_package")
        aoti_compile_and_package(program, package_path=path, inductor_configs=configs)
    if variant == "fresh_load":
        _fresh_loads(path, model_name, device, step)
        return
    step(f"aoti_load_package ({os.path.getsize(path)} bytes)")
    loaded = aoti_load_package(path)
    if variant == "constants_outside":
        step("load_constants")
        loaded.load_constants(dict(program.state_dict), check_full_update=False)
    for k in range(2):
        step(f"call {k + 1}")
        with torch.no_grad():
            out = loaded(*args)
            ref = model(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        got = out[0] if isinstance(out, (list, tuple)) else out
        step(f"call {k + 1} done, max |diff| against eager {float((got - ref).abs().max()):.3g}")
    step("ok")


def _fresh_loads(path: str, model_name: str, device: str, step: Callable[[str], None]) -> None:
    """The package this process built, loaded by fresh processes that never compiled: cold, and after the
    model's eager call (its kernels, a cuBLAS handle): whether a process's state decides the load."""
    code = (
        "import sys, torch; from torch._inductor import aoti_load_package; from torchmux.bench.zoo import build\n"
        "m, a = build(sys.argv[2], 8); m, a = m.to(sys.argv[3]), tuple(x.to(sys.argv[3]) for x in a)\n"
        "if sys.argv[4] == 'warm':\n    with torch.no_grad(): m(*a)\n"
        "with torch.no_grad(): out = aoti_load_package(sys.argv[1])(*a)\nprint('answered', flush=True)"
    )
    for warm in ("cold", "warm"):
        step(f"aoti_load_package in a fresh process ({warm})")
        run = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", code, path, model_name, device, warm],
            capture_output=True,
            text=True,
        )
        how = f"killed by {signal.Signals(-run.returncode).name}" if run.returncode < 0 else f"exit {run.returncode}"
        step(f"fresh process ({warm}): {how}; " + " | ".join((run.stdout + run.stderr).strip().splitlines()[-3:]))
    step("ok")


def _torchmux(backend: str, model: Any, args: tuple, step: Callable[[str], None]) -> None:
    import torch

    import torchmux

    with torch.no_grad():
        step(f"torchmux.export(backend={backend!r})")
        exported = torchmux.export(model, args, backend=backend)
        for c in exported.plan["candidates"]:
            step(f"candidate {c['backend']}: " + ("ok" if c["ok"] else f"failed ({c['reason']})"))
        path = exported.save(os.path.join(tempfile.mkdtemp(prefix="torchmux-aoti-probe-"), "model.tmux"))
        step(f"torchmux.load ({exported.backend})")
        loaded = torchmux.load(path)
        for k in range(2):
            got, ref = loaded(*args), model(*args)
            got, ref = (got[0], ref[0]) if isinstance(got, (list, tuple)) else (got, ref)
            step(f"call {k + 1} on {loaded.backend}, max |diff| against eager {float((got - ref).abs().max()):.3g}")
    step("ok")


def _print_unfinished(folder: Path, variant: str) -> None:
    """The last lines of the loader's trace of each process of ``variant`` that never reached its exit."""
    for trace in sorted(folder.glob(f"ld-{variant}.*")):
        lines = [line for line in trace.read_text(errors="replace").splitlines() if line.partition(":")[2].strip()]
        if lines and not any("calling fini" in line for line in lines[-200:]):
            print(f"    {trace.name} (no exit):")
            print("".join(f"      {line.strip()}\n" for line in lines[-12:]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=Path("aoti-probe"))
    p.add_argument("--seconds", type=float, default=150.0, help="each variant's limit")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument(
        "--ld-debug",
        action="store_true",
        help="run each variant (and the processes it starts) with the dynamic loader's trace (LD_DEBUG=files): "
        "under a process that did not exit (no 'calling fini'), its last lines: whether it died opening or "
        "initializing a library (the AOTInductor library's path is a temporary folder's), or after",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        _child(a.child, a.model, a.device)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    worst = 0
    for variant in [v.strip() for v in a.variants.split(",") if v.strip()]:
        if variant not in VARIANTS:
            p.error(f"--variants: {variant!r} is not one of {', '.join(VARIANTS)}")
        log = a.out / f"aoti-{variant}.txt"
        cmd = [sys.executable, "-X", "faulthandler", "-u", "-m", "torchmux.bench.scripts.aoti_probe"]
        cmd += ["--child", variant, "--model", a.model, "--device", a.device]
        t0 = time.perf_counter()
        with open(log, "w") as f:
            env = dict(os.environ)
            if a.ld_debug:
                env.update(LD_DEBUG="files", LD_DEBUG_OUTPUT=str(a.out / f"ld-{variant}"))
            child = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
            try:
                rc = child.wait(timeout=a.seconds)
                how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                rc, how = 124, f"still running after {a.seconds:.0f} s (killed)"
        steps = [
            line.removeprefix("step: ").strip() for line in log.read_text().splitlines() if line.startswith("step: ")
        ]
        print(f"{variant}: {how} after {time.perf_counter() - t0:.1f} s; last step: {steps[-1] if steps else 'none'}")
        if rc:  # what the child said last: faulthandler's stacks, the exception
            print("".join(f"    {line}\n" for line in log.read_text().splitlines()[-TAIL_LINES:]))
        if a.ld_debug:
            _print_unfinished(a.out, variant)
        worst = worst or rc
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
