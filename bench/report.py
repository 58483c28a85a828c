"""How ``torchmux bench`` shows its results: terminal tables and a PNG chart (bench.json is the data).

Two tables: the details (one row per model and system: latency, speedups, compile times, memory,
output check) and the summary (speedup over eager per model and system, with a geomean row), which
is the one the README quotes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _f(x: float | None, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _threads(env: dict[str, Any]) -> str:
    return f"{env['threads']} thread{'' if env['threads'] == 1 else 's'}"


def _grid(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


def _speed(x: float | None) -> str:
    return _f(x, ".2f") + "x" if x is not None else "-"


def details(report: dict[str, Any]) -> list[str]:
    gpu = report["environment"]["device"] == "cuda"
    separate = report["settings"].get("cold", True)  # compile times from their own processes, or in the latency one
    header = [
        "model",
        "system",
        "median ms",
        "q1-q3 ms",
        "vs eager",
        "vs inductor",
        "compile cold s" if separate else "compile s (latency process)",
        "warm s",
        "GPU peak MB (+)" if gpu else "peak RSS MB (+)",
        "matches eager",
    ]
    rows: list[list[str]] = []
    failures: list[str] = []
    notes: list[str] = []
    for model, m in report["models"].items():
        for i, (system, r) in enumerate(m["systems"].items()):
            name = model if i == 0 else ""
            mem = r.get("memory_mb")
            mem_s = f"{mem['peak']:.0f} (+{mem['delta']:.0f})" if mem else "-"
            cold, warm = r["compile_s"]["cold" if separate else "in_bench"], r["compile_s"]["warm"]
            if system == "eager":
                cold = warm = None  # nothing to compile
            mark = f" [{len(notes) + 1}]" if r.get("notes") else ""
            if r.get("notes"):
                notes.append(f"[{len(notes) + 1}] {model} / {system}: " + " | ".join(r["notes"])[:300])
            if not r["ok"]:
                failures.append(f"{model} / {system}: {r['error']}")
                rows.append(
                    [
                        name,
                        system + mark,
                        "failed",
                        f"see [x{len(failures)}]",
                        "-",
                        "-",
                        _f(cold, ".1f"),
                        _f(warm, ".1f"),
                        mem_s,
                        "-",
                    ]
                )
                continue
            lat = r["latency_ms"]
            match = "ref" if system == "eager" else ("yes" if r["matches_eager"] else f"NO ({r['max_abs_diff']:.2g})")
            rows.append(
                [
                    name,
                    system + mark,
                    f"{lat['median']:.3f}",
                    f"{lat['q1']:.3f}-{lat['q3']:.3f}",
                    _speed(r["speedup_vs_eager"]),
                    _speed(r["speedup_vs_inductor"]),
                    _f(cold, ".1f"),
                    _f(warm, ".1f"),
                    mem_s,
                    match,
                ]
            )
    out = _grid(header, rows, right={2, 3, 4, 5, 6, 7, 8})
    if failures:
        out += ["", "failed:"] + [f"  [x{i + 1}] {f}" for i, f in enumerate(failures)]
    if notes:
        out += ["", "fallbacks (the backend could not run part of the model; torchmux ran that part another way):"]
        out += ["  " + n for n in notes]
    for system in ("torchmux:auto", "torchmux:auto-split"):
        auto = [
            (model, m["systems"][system]["auto_choices"])
            for model, m in report["models"].items()
            if m["systems"].get(system, {}).get("auto_choices")
        ]
        if auto:
            out += ["", f"what {system} chose per graph:"]
            out += [f"  {model}: " + ", ".join(f"{g} -> {b}" for g, b in choices.items()) for model, choices in auto]
    return out


def summary(report: dict[str, Any]) -> list[str]:
    systems = [s for s in report["settings"]["systems"] if s != "eager"]
    header = ["speedup vs eager"] + systems
    rows = []
    for model, m in report["models"].items():
        cells = []
        for s in systems:
            r = m["systems"].get(s, {})
            if not r.get("ok"):
                cells.append("failed")
            else:
                cells.append(_speed(r["speedup_vs_eager"]) + ("" if r["matches_eager"] else " (wrong)"))
        eager = m["systems"].get("eager", {})
        label = f"{model} ({eager['latency_ms']['median']:.2f} ms)" if eager.get("ok") else model
        rows.append([label] + cells)
    geo = report["geomean"]
    rows.append(["geomean"] + [_speed(geo[s]["speedup_vs_eager"]) for s in systems])
    return _grid(header, rows, right=set(range(1, len(header))))


def auto_lines(report: dict[str, Any]) -> list[str]:
    """Each auto (``torchmux:auto``, ``torchmux-export:auto``) against the fastest single system."""
    out: list[str] = []
    for auto in ("torchmux:auto", "torchmux-export:auto"):
        if auto in report["settings"]["systems"]:
            out += ([""] if out else []) + _auto_lines(report, auto)
    return out


def _auto_lines(report: dict[str, Any], auto: str) -> list[str]:
    """Auto against the fastest single system, per model and geomean (results.auto_vs_best)."""
    from .results import auto_vs_best

    cmp = auto_vs_best(report, auto)
    rows = []
    for model, r in cmp["models"].items():
        if r is None:
            rows.append([model, "-", "-", "-", "-", "auto or every single system failed"])
            continue
        choices = ", ".join(sorted(set((r["auto_choices"] or {}).values()))) or "(remembered)"
        rows.append(
            [
                model,
                r["best"],
                f"{r['best_ms']:.3f}",
                f"{r['auto_ms']:.3f}",
                f"{r['auto_over_best']:.2f}x" + ("" if r["auto_over_best"] <= 1.03 else " SLOWER"),
                choices,
            ]
        )
    geo = cmp["auto_over_best_geomean"]
    rows.append(["geomean", "(per model)", "", "", f"{geo:.2f}x" if geo else "-", ""])
    for system, ratio in sorted(cmp["auto_over_system_geomean"].items(), key=lambda kv: -kv[1]):
        rows.append([f"geomean vs {system}", "", "", "", f"{ratio:.2f}x", ""])
    return [
        f"{auto} against the fastest single system (its latency / best; at most 1.03 is a win or a tie):",
        "",
    ] + _grid(
        ["model", "best single system", "best ms", "auto ms", "auto / best", "auto ran on"], rows, right={2, 3, 4}
    )


def auto_table(reports: dict[str, dict[str, Any]]) -> list[str]:
    """One line per model and setting (threads, batch): auto over the fastest single system."""
    from .results import auto_vs_best

    models = list(dict.fromkeys(m for r in reports.values() for m in r["models"]))
    cmps = {label: auto_vs_best(r) for label, r in reports.items()}
    rows = []
    for model in models:
        cells = []
        for cmp in cmps.values():
            r = cmp["models"].get(model)
            cells.append("-" if r is None else f"{r['auto_over_best']:.2f}x ({r['best']})")
        rows.append([model] + cells)
    rows.append(
        ["geomean auto / best per model"]
        + [f"{c['auto_over_best_geomean']:.2f}x" if c["auto_over_best_geomean"] else "-" for c in cmps.values()]
    )
    rows.append(
        ["geomean auto / closest system"]
        + [
            f"{c['auto_over_system_geomean'][c['best_single']]:.2f}x ({c['best_single']})" if c["best_single"] else "-"
            for c in cmps.values()
        ]
    )
    return ["auto latency / fastest single system's, per setting (below 1: auto is faster):", ""] + _grid(
        ["model"] + list(cmps), rows, right=set(range(1, len(cmps) + 1))
    )


def _processes(st: dict[str, Any]) -> str:
    if st.get("latency_processes") != "per-system":
        return ""
    k = int(st.get("processes_per_system") or 1)
    return ", one process per system" if k == 1 else f", {k} processes per system (samples pooled)"


def format_report(report: dict[str, Any]) -> str:
    env, st = report["environment"], report["settings"]
    head = (
        f"torchmux bench: {env['device_name']} ({env['device']}, {env['cpu_count']} cores, {_threads(env)}), "
        f"torch {env['torch']}, batch {st['batch_size']}, {st['rounds']} rounds"
        f"{_processes(st)}, "
        f"{report['wall_s'] / 60:.1f} min"
    )
    if not report.get("complete", True):
        head += f" (interrupted: {len(report['models'])} of {len(st['models'])} models)"
    lines = (
        [head, ""]
        + details(report)
        + ["", "eager latency in parentheses; geomean over models where the system ran and matched eager", ""]
    )
    lines += summary(report)
    if auto := auto_lines(report):
        lines += [""] + auto
    if st["skipped_systems"]:
        lines += ["", "left out:"] + [f"  {s}: {why}" for s, why in st["skipped_systems"].items()]
    return "\n".join(lines)


def write_chart(report: dict[str, Any], path: Path) -> Path | None:
    """A grouped bar chart of speedups over eager (log scale), one group per model plus the geomean.
    Returns the path, or None when matplotlib is missing (the [bench] extra brings it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return None
    systems = [s for s in report["settings"]["systems"] if s != "eager"]
    groups = list(report["models"]) + ["geomean"]
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 2 + len(groups) * (0.3 * len(systems) + 0.4))), 4.5))
    width = 0.8 / max(1, len(systems))
    values: list[float] = []
    for j, s in enumerate(systems):
        xs, ys, failed = [], [], []
        for i, g in enumerate(groups):
            x = i - 0.4 + width * (j + 0.5)
            v = (
                report["geomean"][s]["speedup_vs_eager"]
                if g == "geomean"
                else report["models"][g]["systems"].get(s, {}).get("speedup_vs_eager")
            )
            if v:
                xs.append(x)
                ys.append(v)
            else:
                failed.append(x)
        bars = ax.bar(xs, [y - 1.0 for y in ys], width, bottom=1.0, label=s)  # bars grow from 1x, up or down
        color = bars.patches[0].get_facecolor() if bars.patches else f"C{j}"
        for x, y in zip(xs, ys):
            ax.text(x, y, f"{y:.2g}", ha="center", va="bottom" if y >= 1 else "top", fontsize=6)
        for x in failed:
            ax.text(x, 1.0, "x", ha="center", va="center", color=color, fontsize=10, fontweight="bold")
        values += ys
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylim(min(values + [1.0]) / 1.4, max(values + [1.0]) * 1.4)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(
        matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:g}x" if v > 0 and round(v / 10 ** math.floor(math.log10(v)), 6) in (2, 5) else ""
        )
    )
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_ylabel("speedup over eager (log scale, higher is better)")
    env, st = report["environment"], report["settings"]
    ax.set_title(f"torchmux bench, batch {st['batch_size']}: {env['device_name'][:50]}, {_threads(env)}", fontsize=9)
    ax.legend(fontsize=8, ncol=2)
    fig.text(0.01, 0.01, "x: failed", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
