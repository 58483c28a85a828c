"""Print the corpus's coverage per category, torchmux against torch._dynamo.explain.

    python tests/corpus/coverage.py                # the table per category, and capture times
    python tests/corpus/coverage.py --ablation     # also torchmux with mend off, and each half of the mend pass
    python tests/corpus/coverage.py -v             # one line per program and mode
    python tests/corpus/coverage.py -k legacy      # only programs whose name or category contains this

A program is *full-graph* when it gives one graph, no break and no skipped frame; its output is
*correct* when the captured run shows exactly what eager Python shows (outputs, printed text, log
records, warnings, exceptions). All runs use Dynamo with the eager backend. *Capture* is the first
call under ``torch.compile(backend="eager")``, with the mend pass before it or without: the capture
frontend alone (torchmux's graph normalization and backend choice are not in it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from catalog import ALL as PROGRAMS  # noqa: E402
from catalog import CATEGORIES  # noqa: E402
from harness import capture_pair, capture_seconds, run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ablation", action="store_true", help="also mend off, rewrites alone and Dynamo switches alone"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per program and mode")
    parser.add_argument("-k", default="", help="only programs whose name or category contains this")
    ns = parser.parse_args(argv)
    modes = ["torchmux", "dynamo"]
    if ns.ablation:
        modes[1:1] = ["torchmux-nomend", "rewrites-only", "switches-only"]
    programs = [p for p in PROGRAMS if ns.k in p.name or ns.k in p.category]
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    results = {mode: {p.name: run(p, mode) for p in programs} for mode in modes}
    capture_seconds(programs[0], True), capture_seconds(programs[0], False)  # warm Dynamo up
    seconds = {p.name: capture_pair(p) for p in programs}
    if ns.verbose:
        for mode in modes:
            for p in programs:
                r = results[mode][p.name]
                status = "ok" if r.correct else f"WRONG: {r.why[:100]}"
                print(f"  {mode:16} {p.name:28} graphs={r.graphs} breaks={r.breaks} {status}")
    print(f"corpus: {len(programs)} programs (tests/corpus), backend eager, torch {_torch_version()}")
    head = f"{'category':20}{'n':>4}" + "".join(f"{m[:14]:>24}" for m in modes) + f"{'capture mux/dyn (s)':>24}"
    print(head)
    print(f"{'':24}" + "".join(f"{'full  breaks  correct':>24}" for _ in modes))
    for cat in [c for c in CATEGORIES if any(p.category == c for p in programs)] + ["all"]:
        members = [p for p in programs if cat in ("all", p.category)]
        cells = ""
        for mode in modes:
            rs = [results[mode][p.name] for p in members]
            cells += f"{sum(r.full_graph for r in rs):>10}{sum(r.breaks for r in rs):>7}{sum(r.correct for r in rs):>7}"
        mux, dyn = sum(seconds[p.name][0] for p in members), sum(seconds[p.name][1] for p in members)
        print(f"{cat:20}{len(members):>4}{cells}{f'{mux:.2f}/{dyn:.2f}':>24}")
    ratios = [seconds[p.name][0] / max(seconds[p.name][1], 1e-9) for p in programs]
    worst = max(zip(ratios, (p.name for p in programs)))
    print(
        f"capture time torchmux/Dynamo: total {sum(s[0] for s in seconds.values()) / sum(s[1] for s in seconds.values()):.2f}x, "
        f"median per program {statistics.median(ratios):.2f}x, worst {worst[0]:.2f}x ({worst[1]})"
    )
    slow = [
        f"{p.name} {r:.1f}x ({'Dynamo: full graph' if results['dynamo'][p.name].full_graph else 'Dynamo: ' + str(results['dynamo'][p.name].graphs) + ' graphs, ' + str(results['dynamo'][p.name].breaks) + ' breaks'})"
        for r, p in sorted(zip(ratios, programs), key=lambda t: -t[0])
        if r > 2
    ]
    print(f"capture over 2x Dynamo's ({len(slow)}): {'; '.join(slow) or 'none'}")
    worse = [p.name for p in programs if results["torchmux"][p.name].breaks > results["dynamo"][p.name].breaks]
    print(f"programs where torchmux has more breaks than Dynamo: {worse or 'none'}")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    sys.exit(main())
