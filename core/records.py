"""Schemas of the records torchmux keeps on disk, checked before a record is used.

The cache is data another process (or another user) may have written: a record is used only when it
has the shape below; anything else is set aside (renamed ``<file>.bad``) with one warning, and the
work it stood for is done again.

A **decision** (autotune/decisions.py)::

    {"backend": str,                       # the winner
     "plan": null | {...},                 # a split's cuts and pieces (autotune/split.py), or null
     "measurements": [{"backend": str, "seconds": float | null, "reason": str}, ...]}
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

__all__ = ["decision_problem", "set_aside"]


def decision_problem(record: Any) -> str | None:
    """None if ``record`` is a well-formed decision; otherwise what is wrong with it."""
    if not isinstance(record, dict):
        return f"a decision is a JSON object, got {type(record).__name__}"
    if not isinstance(record.get("backend"), str):
        return "'backend' is missing or not a string"
    if record.get("plan") is not None and not isinstance(record["plan"], dict):
        return "'plan' is neither null nor an object"
    ms = record.get("measurements", [])
    if not isinstance(ms, list):
        return "'measurements' is not a list"
    for i, m in enumerate(ms):
        if not isinstance(m, dict) or not isinstance(m.get("backend"), str):
            return f"measurements[{i}] has no string 'backend'"
        s = m.get("seconds")
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or math.isnan(s) or s < 0):
            return f"measurements[{i}]['seconds'] is {s!r}, not a number of seconds or null"
        if not isinstance(m.get("reason", ""), str):
            return f"measurements[{i}]['reason'] is not a string"
    return None


_WARNED: set[str] = set()


def set_aside(path: Path, problem: str) -> None:
    """Rename a bad record to ``<name>.bad`` (kept for a post-mortem) and warn once per folder."""
    try:
        os.replace(path, path.with_name(path.name + ".bad"))
    except OSError:
        pass
    if str(path.parent) not in _WARNED:
        _WARNED.add(str(path.parent))
        from .errors import TorchmuxFallbackWarning

        warnings.warn(
            f"torchmux: cache record {path} is not valid ({problem}); set aside as {path.name}.bad and measured again",
            TorchmuxFallbackWarning,
            stacklevel=3,
        )
