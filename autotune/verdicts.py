"""What a backend did on a graph, carried to every graph of the same structure.

Dynamo hands the runner a new graph for the same code whenever a size changes (a static graph, then a
symbolic one: autotune/shapes.py), after ``torch._dynamo.reset()``, or with ``dynamic=False`` one per
shape. Each is a new fingerprint, so a verdict keyed on the fingerprint alone (isolate.py's trials,
verify.py's demotions) would let a backend that aborted, hung, answered wrong or wrote into its input
on the first graph be tried again on the second, with the same danger and another warning. A
**structure** is what such graphs share: their ops in order, how each takes its tensor arguments, and
the dtype and rank of every tensor, with no size, no symbol and no scalar input (:func:`structure`).

**A verdict** is recorded for (structure, backend name and version, mode, torch's and torchmux's
versions), in this process and under ``$TORCHMUX_CACHE_DIR/verdicts/``:

- *safe* (``ok``): the backend's isolated trial on a graph of this structure neither crashed nor hung.
  A later graph of the structure needs no new trial in a child (its compile and first checked calls
  still run in-process under the trial deadline, and are still checked);
- *failed* (not ``ok``, with the reason): it crashed or hung in a trial, or its checked calls answered
  wrong, changed an input, returned an input's memory or reused its output buffers, or its guard
  demoted it. A later graph of the structure does not try it at all. Failed is never overwritten by safe.
  A torchmux backend that timed out was slow, not stuck: that verdict stays in this process
  (:func:`slow_not_stuck`), and the next process tries it again.

A compile that raises is not a verdict (the next graph may well compile). A verdict recorded in this
process was warned about when it was recorded: a graph that skips the backend for it warns no more
(``Verdict.here``), so the user of a program whose sizes change sees one warning per graph and backend.
The files are read as untrusted data: anything but a well-formed record is no verdict.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Any

import torch

from ..core import settings
from ..core.artifacts import atomic_write
from ..core.ir import GraphIR, op_name

#: failures that carry to graphs of the same structure (the start of a Measurement's reason), besides a
#: guard's demotion. An exception (a compile or a call that raises), an estimate or a screen's skip does
#: not: it harms nobody, and the next graph may well compile and run
CARRIED = (
    "crashed with signal",
    "exited with status",
    "timed out",
    "wrong answer",
    "changed its input",
    "returned output",
    "overwrites the outputs",
)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    here: bool  # recorded by this process (and warned about then)


_LOCK = threading.Lock()
_HERE: dict[str, Verdict] = {}


def structure(ir: GraphIR) -> str:
    """A graph apart from its sizes: per tensor-valued node its op, the positions of its tensor arguments,
    and its outputs' dtypes and ranks. Scalar inputs (a symbol's value), size queries and symbolic
    arithmetic are left out, so a graph static at batch 4 and its symbolic recapture share a structure."""
    index: dict[Any, int] = {}
    parts = [ir.phase]
    for node in ir.graph.nodes:
        val = node.meta.get("val")
        tensors = [v for v in (val if isinstance(val, (tuple, list)) else [val]) if isinstance(v, torch.Tensor)]
        if node.op == "output":
            args = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            parts.append("out:" + ",".join(str(index[a]) for a in args if a in index))  # no None, no SymInt
            continue
        if node.op == "get_attr" and isinstance(sub := getattr(ir.gm, str(node.target), None), torch.fx.GraphModule):
            ops = ",".join(op_name(n) for n in sub.graph.nodes if n.op == "call_function")
            parts.append(f"branch:{ops}")  # a control-flow branch's body is part of the program
            continue
        if not tensors:
            continue  # a SymInt, an int, a size query: sizes are not structure
        index[node] = len(index)
        what = node.op if node.op in ("placeholder", "get_attr") else op_name(node)
        inputs = [str(index[a]) for a in node.all_input_nodes if a in index]
        specs = ";".join(f"{t.dtype}/{t.dim()}" for t in tensors)
        parts.append(f"{what}({','.join(inputs)}):{specs}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _key(shape: str, backend: Any, mode: str | None) -> str:
    from ..core.version import __version__

    try:
        version = str(backend.version)
    except Exception:  # noqa: BLE001 -- a backend's fault of any kind is a measurement, never the user's crash
        version = "?"
    parts = [shape, backend.name, version, mode or "default", torch.__version__, __version__]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _memo_key(key: str) -> str:
    return f"{settings.CACHE_DIR.get()}|{key}"  # another cache folder, another memory (as on disk)


def _path(key: str) -> Any:
    return settings.CACHE_DIR.get() / "verdicts" / f"{key}.json"


def recall(shape: str, backend: Any, mode: str | None) -> Verdict | None:
    """The verdict on ``backend`` for graphs of structure ``shape``, from this process or the disk; None if none."""
    if not shape:
        return None
    key = _key(shape, backend, mode)
    with _LOCK:
        if _memo_key(key) in _HERE:
            return _HERE[_memo_key(key)]
    try:
        record = json.loads(_path(key).read_bytes().decode())
    except (OSError, ValueError):  # missing, undecodable or not JSON: no verdict (the trial runs again)
        return None
    if not (isinstance(record, dict) and isinstance(record.get("ok"), bool) and isinstance(record.get("reason"), str)):
        return None
    return Verdict(record["ok"], record["reason"], here=False)


def slow_not_stuck(backend: Any, reason: str) -> bool:
    """A torchmux backend past the deadline: its code does not hang, it was slow (a large graph on a busy
    machine). That verdict holds in this process and is not written to disk: the next process tries it again."""
    from ..core.registry import get_registry

    return reason.startswith("timed out") and get_registry().package_of(backend.name) == "torchmux"


def carried(reason: str) -> bool:
    """Whether a failure with this reason is a verdict on the structure (:data:`CARRIED`)."""
    return reason.startswith(CARRIED)


def record(shape: str, backend: Any, mode: str | None, ok: bool, reason: str = "") -> None:
    """Remember a verdict (a failed one is never replaced by a safe one)."""
    if not shape:
        return
    if ok and (old := recall(shape, backend, mode)) is not None and not old.ok:
        return
    key = _key(shape, backend, mode)
    with _LOCK:
        old = _HERE.get(_memo_key(key))
        if old is not None and not old.ok:
            return
        _HERE[_memo_key(key)] = Verdict(ok, reason, here=True)
    if slow_not_stuck(backend, reason):
        return  # kept in this process only
    try:
        atomic_write(_path(key), json.dumps({"ok": ok, "reason": reason, "backend": backend.name}))
    except OSError:
        pass  # a read-only cache never stops a call
