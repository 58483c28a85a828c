"""Print the corpus's full-graph rate and correct-output rate, for torchmux and torch._dynamo.explain.

    python tests/corpus/coverage.py                # torchmux (mend on), torchmux with mend off, dynamo
    python tests/corpus/coverage.py --ablation     # also each half of the mend pass alone
    python tests/corpus/coverage.py -v             # one line per program and mode

A program is *full-graph* when it gives one graph and no break; its output is *correct* when the
captured run shows exactly what eager Python shows (outputs, printed text, log records, warnings,
exceptions). All runs use Dynamo with the eager backend, so only capture is measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import run  # noqa: E402
from catalog import ALL as PROGRAMS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ablation", action="store_true", help="also measure rewrites alone and Dynamo switches alone")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per program and mode")
    parser.add_argument("-k", default="", help="only programs whose name contains this")
    ns = parser.parse_args(argv)
    modes = ["torchmux", "torchmux-nomend", "dynamo"]
    if ns.ablation:
        modes[2:2] = ["rewrites-only", "switches-only"]
    programs = [p for p in PROGRAMS if ns.k in p.name]
    warnings.simplefilter("ignore")
    rows = []
    start = time.perf_counter()
    for mode in modes:
        results = [run(p, mode) for p in programs]
        full = sum(r.full_graph for r in results)
        correct = sum(r.correct for r in results)
        graphs = sum(r.graphs for r in results)
        rows.append((mode, full, correct, graphs))
        if ns.verbose:
            for r in results:
                status = "ok" if r.correct else f"WRONG: {r.why[:100]}"
                print(f"  {mode:16} {r.name:24} graphs={r.graphs} breaks={r.breaks} {status}")
    n = len(programs)
    print(f"corpus: {n} programs (tests/corpus/programs.py), backend eager, torch {_torch_version()}")
    print(f"{'mode':18}{'full-graph rate':>18}{'correct-output rate':>22}{'graphs in all':>16}")
    for mode, full, correct, graphs in rows:
        print(f"{mode:18}{f'{full}/{n} ({100 * full / n:.0f}%)':>18}{f'{correct}/{n} ({100 * correct / n:.0f}%)':>22}{graphs:>16}")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    sys.exit(main())
