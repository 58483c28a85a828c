"""The figures of ``torchmux bench``: how the child processes' results become one row per model and system.

A row holds latency statistics, speedups against eager and against torch.compile (Inductor), compile
times (cold, warm, and inside the latency process), memory, and whether the output matched eager's;
or, for a system that failed, what went wrong. :data:`MEASURES` says what each figure is; it is
written into bench.json so the file explains itself.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from .run import AUTO, AUTOS, EAGER, INDUCTOR
from .zoo import ZOO

#: what each figure is, written into bench.json so the file explains itself
MEASURES = {
    "latency_ms": "wall time per call in the latency process (CUDA synchronized); median, quartiles q1/q3, min, max "
    "over n rounds; every round times every system once, in a new (seeded random) order; the latency process is "
    "one for all systems, or one per system with settings.latency_processes 'per-system'",
    "warm_up_calls": "untimed calls before the rounds (the steady state of a loop; a torchmux system's verify "
    "checks of calls 1, 2, 4, ..., 256 fall among them, not in the rounds)",
    "speedup_vs_eager": "eager median latency / this system's median latency (same rounds)",
    "speedup_vs_inductor": "torch.compile (Inductor) median latency / this system's",
    "compile_s.cold": "first call (compile included) in a fresh process with empty compile caches",
    "compile_s.warm": "first call in a second fresh process on the caches the cold one filled",
    "compile_s.in_bench": "first call inside the latency process (caches hot, other systems compiled before)",
    "memory_mb": "CPU: peak resident set size (getrusage ru_maxrss) of the cold process, which imports torch, "
    "builds the model, compiles and runs it 3 times; delta = peak minus the peak before compiling "
    "(compiler and run memory; compiler subprocesses such as g++ are not counted). "
    "GPU: torch.cuda.max_memory_allocated, delta over memory allocated before compiling",
    "matches_eager": "every output tensor (tensors_of) within 5x torchmux's float tolerances of eager's "
    "(float32: rtol 1e-3, atol 1e-4 x max(1, max|eager|))",
}


def _stats(samples: list[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in samples]
    q1, _, q3 = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else (ms[0], ms[0], ms[0])
    return {"median": statistics.median(ms), "q1": q1, "q3": q3, "min": min(ms), "max": max(ms), "n": len(ms)}


def assemble(
    model: str, systems: list[str], cold: dict[str, dict], warm: dict[str, dict], latency: dict[str, Any], device: str
) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    measured = latency.get("systems", {})
    for s in systems:
        c, w, lat = cold.get(s, {}), warm.get(s, {}), measured.get(s, {})
        row: dict[str, Any] = {"ok": False, "error": None}
        if c and not c.get("ok"):
            row["error"] = f"compile failed: {c.get('error')}"
        elif latency.get("error"):
            row["error"] = f"the model failed before any system ran: {latency['error']}"
        elif lat.get("event") == "failed":
            row["error"] = lat["error"]
        elif "samples" in lat:
            row.update(
                ok=True,
                latency_ms=_stats(lat["samples"]),
                samples_ms=[x * 1e3 for x in lat["samples"]],
                calls_per_sample=lat["calls_per_sample"],
                warm_up_calls=lat.get("warm_up_calls", 0),
                matches_eager=lat["matches"],
                max_abs_diff=lat["max_abs_diff"],
                mismatch=lat["mismatch"],
            )
            if lat.get("process_medians"):  # --processes-per-system: each process's median, ms
                row["process_medians_ms"] = [x * 1e3 for x in lat["process_medians"]]
            if lat.get("auto_choices") or c.get("auto_choices"):
                row["auto_choices"] = lat.get("auto_choices") or c["auto_choices"]
        else:
            row["error"] = "not measured"
        row["compile_s"] = {
            "cold": c.get("first_call_s") if c.get("ok") else None,
            "warm": w.get("first_call_s") if w.get("ok") else None,
            "in_bench": lat.get("compile_s"),
        }
        if "peak_rss_mb" in c:
            if device == "cuda":
                row["memory_mb"] = {
                    "peak": c["gpu_peak_mb"],
                    "delta": c["gpu_peak_mb"] - c["gpu_before_mb"],
                    "kind": "gpu",
                }
            else:
                row["memory_mb"] = {
                    "peak": c["peak_rss_mb"],
                    "delta": c["peak_rss_mb"] - c["rss_before_mb"],
                    "kind": "rss",
                }
        row["notes"] = list(dict.fromkeys((c.get("notes") or []) + (lat.get("notes") or [])))
        rows[s] = row
    for base, key in ((EAGER, "speedup_vs_eager"), (INDUCTOR, "speedup_vs_inductor")):
        ref = rows.get(base, {})
        for row in rows.values():
            row[key] = (
                ref["latency_ms"]["median"] / row["latency_ms"]["median"] if ref.get("ok") and row["ok"] else None
            )
    return {"description": ZOO[model].description, "systems": rows}


def geomeans(models: dict[str, Any], systems: list[str]) -> dict[str, dict[str, Any]]:
    """Per system, the geometric mean of its speedups over the models where it ran and matched eager."""
    out = {}
    for s in systems:
        entry: dict[str, Any] = {}
        for key in ("speedup_vs_eager", "speedup_vs_inductor"):
            vals = [
                m["systems"][s][key]
                for m in models.values()
                if s in m["systems"] and m["systems"][s].get(key) and m["systems"][s].get("matches_eager")
            ]
            entry[key] = math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None
            entry[f"{key}_models"] = len(vals)
        out[s] = entry
    return out


def auto_vs_best(report: dict[str, Any], auto: str = AUTO) -> dict[str, Any]:
    """Auto against what a user would pick by hand: per model, the fastest single system (every system
    but torchmux's autos, eager included, among those that ran and matched eager) and auto's latency
    over its (above 1: auto is slower); per report, the geomean of those ratios, and per single system
    the geomean of auto's latency over its on the models where both ran and matched (``best_single``:
    the system auto is closest to losing against)."""
    rows: dict[str, Any] = {}
    for model, m in report["models"].items():
        ok = {s: r for s, r in m["systems"].items() if r.get("ok") and r.get("matches_eager")}
        single = {s: r["latency_ms"]["median"] for s, r in ok.items() if s not in AUTOS}
        if auto not in ok or not single:
            rows[model] = None
            continue
        best = min(single, key=single.__getitem__)
        rows[model] = {
            "best": best,
            "best_ms": single[best],
            "auto_ms": ok[auto]["latency_ms"]["median"],
            "auto_over_best": ok[auto]["latency_ms"]["median"] / single[best],
            "auto_choices": ok[auto].get("auto_choices"),
        }
    # geomeans only compare over the same models: each single system against auto where both matched
    vs: dict[str, float] = {}
    for s in {s for m in report["models"].values() for s in m["systems"]} - set(AUTOS):
        pairs = [
            (m["systems"][s]["latency_ms"]["median"], m["systems"][auto]["latency_ms"]["median"])
            for m in report["models"].values()
            if all(m["systems"].get(x, {}).get("ok") and m["systems"][x].get("matches_eager") for x in (s, auto))
        ]
        if pairs:
            vs[s] = math.exp(sum(math.log(a / b) for b, a in pairs) / len(pairs))  # auto latency / s latency
    ratios = [r["auto_over_best"] for r in rows.values() if r]
    closest = max(vs, key=vs.__getitem__) if vs else None
    return {
        "models": rows,
        "auto_over_best_geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
        "auto_over_system_geomean": vs,
        "best_single": closest,
    }
