"""Under ``torch.distributed``: rank 0 tunes, every other rank runs rank 0's choice.

Ranks that each measured for themselves could pick different backends for the same graph (timings are
noisy), and a data-parallel step needs every rank to compute the same function. So when a process
group of more than one rank is initialized, the runner (runner.py) asks :func:`role`:

- ``"leader"`` (rank 0) decides as usual (measures, or reads the cache) and :func:`publish` es the
  decision record under its decision key in the process group's key-value store;
- ``"follower"`` (every other rank) :func:`receive` s that record, waiting up to
  ``TORCHMUX_DISTRIBUTED_TIMEOUT``, and builds the named winner, checked against the reference but not
  timed. A winner that fails there runs eagerly, with a warning: correct, never different by choice.

The store (the TCPStore or FileStore every process group rendezvoused through) is used rather than a
collective: a broadcast issued while compiling a backward graph would interleave with DDP's own
gradient all-reduces, and collectives must be issued in the same order on every rank. A ``set``/``get``
on the store has no such order.

The store key (:func:`key_for`) is not the decision cache's key: that one names the machine kind and
the device index (``cuda:1`` on rank 1), which differ between ranks, and so does the graph's
fingerprint. Every rank compiles the same graphs in the same order, so the key is the graph's name, its
ops in order, the inputs' shapes, dtypes and device type, and the order in which this process first
tuned that combination.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from ..core import settings
from ..core.ir import GraphIR

PREFIX = "torchmux/decision/"


def role() -> str | None:
    """``"leader"``, ``"follower"``, or None when no process group of 2 or more ranks is initialized."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        return "leader" if dist.get_rank() == 0 else "follower"
    except Exception:
        return None


_tuned: dict[tuple, int] = {}


def key_for(ir: GraphIR, signature: tuple, mode: str | None) -> str:
    """The same string on every rank for the same graph, input signature and mode (see the docstring)."""
    plain = tuple(
        (tuple(e[0]), str(e[1]), e[2].type) if len(e) == 3 and hasattr(e[2], "type") else repr(e) for e in signature
    )
    what = (ir.name, ",".join(str(n.target) for n in ir.op_nodes), plain, mode)
    n = _tuned.setdefault(what, len(_tuned))
    return hashlib.sha256(repr((n, *what)).encode()).hexdigest()[:32]


def _store() -> Any:
    from torch.distributed.distributed_c10d import (
        _get_default_store,  # the group's rendezvous store
    )

    return _get_default_store()


def publish(key: str, record: dict[str, Any]) -> None:
    _store().set(PREFIX + key, json.dumps(record))


def receive(key: str) -> dict[str, Any]:
    """Rank 0's record for ``key``; raises ``RuntimeError`` (naming the setting) if it does not come in time."""
    store, timeout = _store(), settings.DISTRIBUTED_TIMEOUT.get()
    try:
        store.wait([PREFIX + key], timedelta(seconds=timeout))
        return json.loads(store.get(PREFIX + key))
    except Exception as e:
        raise RuntimeError(
            f"torchmux: rank 0 did not publish its autotune decision within {timeout:.0f} s ({e}); "
            "raise TORCHMUX_DISTRIBUTED_TIMEOUT if rank 0 tunes longer, and compile the same model on every rank"
        ) from e
