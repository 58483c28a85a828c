"""``torchmux bench --workload varying-shapes``: one model called with many sizes, total time including
every compile.

Real programs change shape (a server batches whatever came in, a language model sees a new sequence
length every call). This workload draws ``--calls`` sizes from a fixed ``--seed``: batch sizes 2..128
for a model fed floats (zoo ``mlp``), sequence lengths 2..127 at batch 1 for a model fed token ids
(zoo ``bert``, ``gpt2``). Each system runs the same sequence once, in a child process of its own with
empty compile caches (TORCHMUX_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR), from its first
call (capture, compile, tuning) to its last, with Dynamo's default recompile limit, as a user would.

Per system the table shows: the total seconds; the ratio to ``torch.compile`` (Inductor, ``dynamic=None``:
system ``inductor``) on the same sequence; how many graphs Dynamo captured; how many graphs each
torchmux backend compiled (``Backend.compile`` calls; a graph a backend places in several regions
counts once per region); whether every call matched eager; and the torchmux fallback warnings seen.
Timings on a shared machine are noisy: compare ratios within one run. The results also go to
``varying.json`` in ``--out``.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .run import EAGER, INDUCTOR, ONNX_EXPORT, cache_env, make_compiled, short_error

__all__ = ["MODELS", "sizes", "workload", "varying_child", "run_varying", "format_varying", "varying_systems"]

#: the default models of this workload
MODELS = ("mlp", "bert", "gpt2")
#: systems that cannot serve a second shape (ONNX Runtime used directly exports one static model)
STATIC_ONLY = (ONNX_EXPORT,)
#: the largest size drawn: a batch, or a sequence length within the tiny transformers' 128 positions
MAX_BATCH, MAX_SEQ = 128, 127


def sizes(seq: bool, calls: int, seed: int) -> list[int]:
    """The sequence of sizes: a batch size per call (2..128), or a sequence length (2..127)."""
    rng = random.Random(seed)
    return [rng.randint(2, MAX_SEQ if seq else MAX_BATCH) for _ in range(calls)]


def workload(model: str, calls: int, seed: int, device: str) -> tuple[torch.nn.Module, list[tuple[Any, ...]]]:
    """The zoo model and its inputs at each drawn size: token ids vary their length (batch 1), other
    inputs their batch."""
    from .zoo import build

    m, (example,) = build(model, 1)
    seq = not example.dtype.is_floating_point
    g = torch.Generator().manual_seed(seed)
    inputs = []
    for n in sizes(seq, calls, seed):
        if seq:
            x = torch.randint(0, int(example.max()) + 1, (1, n), generator=g)
        else:
            x = torch.randn((n,) + tuple(example.shape[1:]), generator=g)
        inputs.append((x.to(device),))
    return m.to(device), inputs


def _count_compiles() -> dict[str, int]:
    """Count ``Backend.compile`` calls per torchmux backend in this process."""
    from ..core.registry import get_registry

    counts: dict[str, int] = {}
    for backend in get_registry().available():
        real = backend.compile

        def counted(request: Any, real: Callable[..., Any] = real, name: str = backend.name) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return real(request)

        backend.compile = counted  # type: ignore[method-assign]
    return counts


# ---------------------------------------------------------------------------------------- child
def varying_child(model: str, system: str, calls: int, seed: int, device: str, threads: int | None) -> dict[str, Any]:
    """Run the whole sequence on ``system`` in this fresh process: total seconds, compiles, answers."""
    from ..core.compare import mismatch
    from ..core.errors import TorchmuxFallbackWarning
    from .run import MATCH_SCALE
    from .zoo import tensors_of

    if threads:
        torch.set_num_threads(threads)
    m, inputs = workload(model, calls, seed, device)
    with torch.no_grad():
        expected = [[t.detach() for t in tensors_of(m(*a))] for a in inputs]
    counts = _count_compiles() if system.startswith("torchmux:") else {}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always", TorchmuxFallbackWarning)
        t0 = time.perf_counter()
        fn = make_compiled(system, m, threads)
        outs = []
        for a in inputs:
            outs.append(fn(*a))
        if device == "cuda":
            torch.cuda.synchronize()
        total = time.perf_counter() - t0
    wrong = [(i, w) for i, out in enumerate(outs) if (w := mismatch(tensors_of(out), expected[i], scale=MATCH_SCALE))]
    return {
        "ok": True,
        "total_s": total,
        "calls": len(inputs),
        "graphs_captured": int(torch._dynamo.utils.counters["stats"].get("unique_graphs", 0)),
        "compiles": dict(counts),
        "matches_eager": not wrong,
        "first_wrong": f"call {wrong[0][0]}: {wrong[0][1]}" if wrong else None,
        "fallback_warnings": [
            str(w.message).splitlines()[0][:300] for w in caught if issubclass(w.category, TorchmuxFallbackWarning)
        ],
    }


def child_main(model: str, system: str, calls: int, seed: int, device: str, threads: int | None, out: Path) -> int:
    try:
        result = varying_child(model, system, calls, seed, device, threads)
    except Exception as e:
        import traceback

        traceback.print_exc()
        result = {"ok": False, "error": short_error(e)}
    out.write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------- parent
def varying_systems(systems: list[str]) -> tuple[list[str], dict[str, str]]:
    """The systems this workload runs (torch.compile first, as every ratio is to it) and those left out."""
    left = {s: "exports one static model: it cannot serve a second shape" for s in systems if s in STATIC_ONLY}
    keep = [s for s in systems if s not in left]
    return sorted(keep, key=lambda s: (s != INDUCTOR, s != EAGER)), left


def run_varying(
    args: Any, models: list[str], systems: list[str], run_child: Callable[[list[str], dict[str, str], Path], str | None]
) -> dict[str, Any]:
    """Every (model, system) in a child process of its own, one at a time; ``varying.json`` is rewritten
    after each. ``run_child(cmd, env, log)`` runs one child: None, or why it failed."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="torchmux-varying-"))
    report: dict[str, Any] = {
        "workload": "varying-shapes",
        "settings": {"models": models, "systems": systems, "calls": args.calls, "seed": args.seed},
        "models": {},
    }
    for model in models:
        rows: dict[str, Any] = {}
        report["models"][model] = rows
        for system in systems:
            label = f"{model}.{system.replace(':', '-')}.varying"
            result, log = work / f"{label}.json", args.out / "logs" / f"{label}.log"
            cmd = [sys.executable, "-m", "torchmux.bench.cli", "--workload", "varying-shapes", "--_child", "varying"]
            cmd += ["--models", model, "--systems", system, "--calls", str(args.calls), "--seed", str(args.seed)]
            cmd += ["--device", args.device, "--_result", str(result)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            why = run_child(cmd, cache_env(work / "cache" / label), log)
            if why is None and result.exists():
                rows[system] = json.loads(result.read_text())
            else:
                rows[system] = {"ok": False, "error": why or "the process wrote no result", "log": str(log)}
            ref = rows.get(INDUCTOR, {})
            if rows[system].get("ok") and ref.get("ok"):
                rows[system]["vs_torch_compile"] = rows[system]["total_s"] / ref["total_s"]
            (args.out / "varying.json").write_text(json.dumps(report, indent=1))
    return report


def format_varying(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"varying shapes: {s['calls']} calls per model, sizes from seed {s['seed']}; total seconds include every "
        "compile; 'vs torch.compile' is total / torch.compile's total (lower is better)",
        f"{'model':8} {'system':22} {'total s':>8} {'vs torch.compile':>16} {'graphs':>6}  "
        f"{'compiles per backend':28} matches eager",
    ]
    for model, rows in report["models"].items():
        for system, r in rows.items():
            name = "torch.compile" if system == INDUCTOR else system
            if not r.get("ok"):
                lines.append(f"{model:8} {name:22} failed: {r.get('error', '')[:200]}")
                continue
            ratio = f"{r['vs_torch_compile']:.2f}" if "vs_torch_compile" in r else "-"
            compiles = ", ".join(f"{k}={v}" for k, v in sorted(r["compiles"].items())) or "-"
            fallbacks = f"  ({len(r['fallback_warnings'])} fallback warnings)" if r["fallback_warnings"] else ""
            answer = "yes" if r["matches_eager"] else f"NO ({r['first_wrong']})"
            lines.append(
                f"{model:8} {name:22} {r['total_s']:8.2f} {ratio:>16} {r['graphs_captured']:6}  {compiles:28} "
                f"{answer}{fallbacks}"
            )
    return "\n".join(lines)
