"""A progress bar while the autotuner works, on a terminal only.

The tuner reports each step through a callback (``tuner.measure(progress=...)``): which candidate it
is compiling or timing. :func:`for_graph` returns that callback, backed by a ``tqdm`` bar naming the
graph, or a callback that does nothing when stderr is not a terminal (logs, CI) or tqdm is missing.
:func:`summary` prints the one line that closes a graph's tuning, on a terminal only too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

Step = Callable[[str, str], None]  # (candidate, what: "compile" | "check" | "time")


def _on_terminal() -> bool:
    try:
        return sys.stderr.isatty() and not os.environ.get("CI")
    except (AttributeError, ValueError):
        return False


class _Bar:
    def __init__(self, graph: str, total: int) -> None:
        from tqdm import tqdm

        self.graph = graph
        self.bar = tqdm(total=total, desc=f"torchmux {graph}", unit="step", leave=False, file=sys.stderr)

    def __call__(self, candidate: str, what: str) -> None:
        self.bar.update(1)
        self.bar.set_postfix_str(f"{what} {candidate}")  # redrawn now: a step takes long enough to read it

    def close(self) -> None:
        self.bar.close()


class _Quiet:
    def __call__(self, candidate: str, what: str) -> None:
        pass

    def close(self) -> None:
        pass


def for_graph(graph: str, candidates: int) -> Any:
    """A step callback for tuning ``graph`` over ``candidates`` backends (compile, then time, each)."""
    if not _on_terminal():
        return _Quiet()
    try:
        return _Bar(graph, 2 * candidates)
    except ImportError:
        return _Quiet()


def summary(line: str) -> None:
    if _on_terminal():
        print(f"torchmux: {line}", file=sys.stderr)
