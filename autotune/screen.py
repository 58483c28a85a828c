"""Which candidates auto builds at all: a candidate that cannot win is not built (its build would be
most of auto's compile time, and the answer would be thrown away).

The rule, applied before any candidate is compiled (tuner.py's step 0):

1. ``mode="max-autotune"`` (and ``max-autotune-no-cudagraphs``) builds every candidate, and says so:
   it may spend more. Everything below is about the default mode.
2. A backend that declares it needs tuning on a device (``Backend.needs_tuning``: TVM on the CPU,
   whose untuned matmuls are plain loops that lose 10-50x to oneDNN/MLAS) is not built there in
   default mode...
3. ...unless this machine remembers that it came within :data:`KEEP_WITHIN` of the winner on a graph of
   the same kind (the same set of ATen ops, the same device): a measurement in any earlier process,
   default mode or max-autotune, recorded in ``$TORCHMUX_CACHE_DIR/screen/<backend>.json``.

A candidate left out is reported as a measurement that did not run, with the reason, so ``explain``
and ``TORCHMUX_VERBOSE`` show it. Every measured auto decision feeds the record (:func:`remember`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core import settings
from ..core.ir import GraphIR
from ..core.registry import get_registry

KEEP_WITHIN = 1.5  # a skipped backend that came this close to the winner on a graph of this kind is built again
TUNING_MODES = ("max-autotune", "max-autotune-no-cudagraphs")


def graph_kind(ir: GraphIR, device: str) -> str:
    """What "a graph of the same kind" means here: the set of ATen ops it holds, on one device."""
    ops = sorted(set(ir.op_counts()))
    return device + ":" + hashlib.sha256("|".join(ops).encode()).hexdigest()[:16]


def _path(backend: str) -> Path:
    return settings.CACHE_DIR.get() / "screen" / f"{backend}.json"


def _load(backend: str) -> dict[str, float]:
    try:
        return json.loads(_path(backend).read_text())
    except (OSError, ValueError):
        return {}


def skipped(ir: GraphIR, candidates: Sequence[Any], device: str, mode: str | None) -> dict[str, str]:
    """Candidates not to build (name -> why), by the rule of the module docstring."""
    if mode in TUNING_MODES:
        return {}
    out = {}
    kind = graph_kind(ir, device)
    for b in candidates:
        if device not in getattr(b, "needs_tuning", ()):
            continue
        ratio = _load(b.name).get(kind)
        if ratio is not None and ratio <= KEEP_WITHIN:
            continue
        seen = (
            f"it ran {ratio:.1f}x the winner's time on a graph of this kind here" if ratio else "untuned it cannot win"
        )
        out[b.name] = f"not built: needs tuning on {device} and {seen} (mode='max-autotune' builds and tunes it)"
    return out


def remember(ir: GraphIR, measurements: Sequence[Any], device: str) -> None:
    """Record, for each backend that declares ``needs_tuning`` and was measured, how far it was from the
    winner on this kind of graph (the best ratio seen is kept)."""
    ok = [m for m in measurements if m.ok and math.isfinite(m.seconds) and m.seconds > 0]
    if len(ok) < 2:
        return
    best = min(m.seconds for m in ok)
    kind = graph_kind(ir, device)
    registry = get_registry()
    for m in ok:
        if m.backend not in registry.names:  # a split, or a backend object the registry does not hold
            continue
        backend = registry.get(m.backend)
        if device not in getattr(backend, "needs_tuning", ()):
            continue
        record = _load(m.backend)
        record[kind] = min(record.get(kind, math.inf), m.seconds / best)
        _store(_path(m.backend), record)


def _store(path: Path, record: dict[str, float]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache never stops a compile
