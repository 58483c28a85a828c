"""Where backends keep what they build, and how they write it.

Every on-disk artifact lives under ``$TORCHMUX_CACHE_DIR/<backend>/``; :func:`artifact_dir` names that
folder. Writes go through :func:`atomic_write`: the data lands in a temporary file in the same folder
and is renamed into place, so a reader (another process, another thread) sees the old file or the new
one, never half of one. Backends reach both through :mod:`torchmux.extend`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from . import settings

__all__ = ["artifact_dir", "atomic_write", "debug_dir", "load_claims"]


def artifact_dir(*parts: str) -> Path:
    """``$TORCHMUX_CACHE_DIR/<parts...>`` (not created: a read-only cache never stops a compile)."""
    return Path(settings.CACHE_DIR.get()).joinpath(*parts)


def debug_dir() -> Path | None:
    """``$TORCHMUX_DEBUG_DIR`` if set: where code-generating backends write the source they generate."""
    return settings.DEBUG_DIR.get()


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` atomically, creating its folder. Raises ``OSError`` if it cannot."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_claims(path: Path | str) -> dict[str, frozenset[str]]:
    """The ops a backend claims, per floating dtype, from the conformance suite's results.

    The file is what ``python -m torchmux.testing.probe NAME --write PATH`` writes:
    ``{"float32": ["aten.add.Tensor", ...], "float16": [...], "command": "..."}``. Keys are dtype names
    (``torch.float32`` without ``torch.``); the result maps each to the frozenset of ops that passed.
    """
    record = json.loads(Path(path).read_text())
    return {k: frozenset(v) for k, v in record.items() if k != "command"}
