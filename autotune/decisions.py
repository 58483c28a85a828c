"""On-disk memory of the autotuner's choices, so a new process compiles only the winner.

One small JSON file per decision under ``$TORCHMUX_CACHE_DIR/decisions/``. The key names everything
that can change the choice: the graph's fingerprint, the input signature, the candidates with their
versions, the mode, how many segments a split may have, torch's and torchmux's versions, the kind
of machine (CPU model and core count, or GPU name: core/machine.py), so a choice measured on one machine
is not trusted on a machine of another speed, and for a CPU graph the threads it runs on
(``torch.get_num_threads()``: ONNX Runtime's sessions take as many; which backend wins changes with it,
as ``torchmux bench --threads 1,2`` shows). A remembered winner is still checked against the reference
before it is trusted; if it fails, the tuner measures everything again.

With ``TORCHMUX_REMOTE_CACHE`` set, a decision missing locally is looked up in the fleet's Redis
(core/remote_cache.py) and every decision stored is sent there too.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..core import remote_cache, settings
from ..core.ir import GraphIR
from ..core.machine import machine_kind
from ..core.records import decision_problem, set_aside


def decision_key(
    ir: GraphIR, signature: tuple, candidates: Sequence[Any], mode: str | None, split: int = 0, frozen: bool = False
) -> str:
    """``frozen``: the decision is for the graph's frozen twin (freeze.py); ``ir`` is the unfrozen graph, so
    the key names its structure, not its weights' values."""
    device = _device_type(signature)
    parts = (
        [
            ir.fingerprint(),
            repr(signature),
            mode or "default",
            torch.__version__,
            f"split={split}",
            f"torchmux={_torchmux_version()}",
            machine_kind(device),
            ",".join(sorted(f"{b.name}={_version(b)}" for b in candidates)),
        ]
        + (["frozen"] if frozen else [])
        + ([f"threads={torch.get_num_threads()}"] if device == "cpu" else [])
    )
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _torchmux_version() -> str:
    from ..core.version import __version__  # a new torchmux measures again: its backends and tuner may have changed

    return __version__


def _device_type(signature: tuple) -> str:
    devices = {e[2].type for e in signature if len(e) == 3 and isinstance(e[2], torch.device)}
    return "cuda" if "cuda" in devices else "cpu"


def _version(backend: Any) -> str:
    try:
        return str(backend.version)
    except Exception:
        return "?"


def _path(key: str) -> Path:
    return settings.CACHE_DIR.get() / "decisions" / f"{key}.json"


def load(key: str) -> dict[str, Any] | None:
    """The record for ``key`` if there is one (locally, or fetched from the remote cache) and it has the
    schema of core/records.py (else set aside)."""
    path = _path(key)
    try:
        if not remote_cache.fetch_artifact(path):
            return None
        data = path.read_bytes()
    except OSError:
        return None
    try:  # the cache is data anyone with write access may have written: bytes that are not UTF-8 JSON are a miss
        record = json.loads(data.decode())
    except ValueError as e:  # UnicodeDecodeError included
        set_aside(path, f"not JSON: {type(e).__name__}: {str(e)[:200]}")
        return None
    problem = decision_problem(record)
    if problem:
        set_aside(path, problem)
        return None
    return record


def store(key: str, record: dict[str, Any]) -> None:
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:
        pass  # a read-only cache never stops a compile
    remote_cache.write_bytes(_path(key).relative_to(settings.CACHE_DIR.get()).as_posix(), json.dumps(record).encode())
