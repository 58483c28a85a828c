"""Keep or revert: the mend pass's rewrites stay only where they capture no worse than Dynamo does.

A rewrite is kept when the rewritten capture has no more breaks than the user's code gives Dynamo, gave
a graph where that code gives one, and took no more than twice its capture time. Capturing the user's
code as well would double every capture, so the second capture is taken only where the first one leaves
the question open (:func:`in_doubt`); everywhere else the answer follows from the first capture alone:

- **no break, no skipped frame**: the rewritten capture is one graph, and the original cannot have
  fewer breaks;
- **no rewrite fired** while Dynamo traced (every runtime guard chose the user's statements) and no
  break is one of :func:`switched`'s: Dynamo traced the user's code, nothing to revert;
- **every break is outside the rewritten statements** (its innermost user frame is not in a span a
  fired rewrite replaced, nor in the mend pass's own runtime) and no fired rewrite is *wide* (gives a
  value of another kind than the user's code, read after its statement: ``Variable(t)`` ->
  ``t.detach()`` is not a leaf): each such break is Dynamo's on the user's own statements, which the
  original capture meets too (a rewrite only replaces its own statement, with values of the same kind).

Otherwise (a break inside rewritten code, the mend runtime's own data-dependent break, any break with
a wide rewrite fired, or a break :func:`switched` names) both are measured: the caller captures the
user's code without the mend pass's switches (``explain`` does it on copies of the model and inputs, so
the user's module and random state are untouched, its prints and warnings silenced) and :func:`keep`
decides; a revert is reported with its reason.

**The switches are judged too.** The mend pass also sets Dynamo's own options (``switches.py``:
``capture_scalar_outputs`` and its kin), and they can add a break to code no rewrite touched: with
``.item()`` kept in the graph, an ``if`` on its value breaks *after* it (a graph, then a break), where
the code as written breaks at the ``.item()`` itself before any op (one graph, no break counted):
ParityBench's Glow ``ActNorm`` (``if self.initialized.item() == 0:`` first in ``forward``). A break on a
data-dependent value (:func:`switched`) is therefore in doubt whatever fired, and a revert in
``compile()`` turns the switches off for that module as well and drops Dynamo's graphs of its first
trace (``frontends/dynamo.py`` ``TracedSince``), so its next call is traced as the verdict measured.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from . import runtime as rt
from .pipeline import MEND_DIR


@dataclass(frozen=True)
class Capture:
    """What one capture gave: breaks (graph breaks and frames run outside any graph), its seconds and
    its graphs."""

    breaks: int
    seconds: float
    graphs: int


def in_doubt(stacks: Iterable[list[tuple[str, int]]], keys: Iterable[int], reasons: Iterable[str] = ()) -> bool:
    """Whether a capture whose breaks had these frame stacks (each ``[(file, line), ...]``, outermost
    first; a skipped frame is a stack of one) and these ``reasons`` (Dynamo's, one per graph break) may
    have more breaks than the user's code would give, the rewrites ``keys`` applied (those Dynamo traced
    through are the ones that count) and the switches set (:func:`switched`)."""
    if switched(reasons):
        return True
    fired = [k for k in keys if k in rt.FIRED]
    stacks = [s for s in stacks if s]
    if not fired or not stacks:
        return False
    if any(rt.SPANS.get(k, ("", 0, 0, False))[3] for k in fired):
        return True
    spans = [rt.SPANS[k] for k in fired if k in rt.SPANS]
    for stack in stacks:
        if any(f.startswith(MEND_DIR) for f, _ in stack):
            return True
        user = [(f, n) for f, n in stack if not _torch_file(f)]
        if not user:
            continue
        f, n = user[-1]
        if any(f == sf and first <= n <= last for sf, first, last, _ in spans):
            return True
    return False


#: what Dynamo says of a break on a value only the switches keep in the graph (an unbacked ``.item()``,
#: a data-dependent size), where the code as written would have broken earlier, at the value's making
SWITCHED_BREAKS = ("data-dependent", "data dependent", "unbacked")


def switched(reasons: Iterable[str]) -> bool:
    """Whether a break with one of these reasons may be the switches' own (:data:`SWITCHED_BREAKS`)."""
    return any(marker in r.lower() for r in reasons for marker in SWITCHED_BREAKS)


def keep(rewritten: Capture, original: Capture, timed: bool = True) -> str:
    """ "" to keep the rewritten capture, else why the user's code is captured as written. ``timed`` False:
    the rewritten capture was the process's first, whose seconds hold Dynamo's one-time imports (seconds
    of them): its time says nothing of the rewrites, and only the breaks are compared."""
    if rewritten.breaks > original.breaks:
        return f"the mended code (its rewrites and switches) broke {rewritten.breaks} times, the code as written {original.breaks}"
    if rewritten.graphs == 0 < original.graphs:  # as many breaks, but Dynamo gave up on the whole frame
        return f"the mended code gave no graph (Dynamo skipped its frame), the code as written {original.graphs}"
    if timed and rewritten.seconds > 2 * original.seconds:
        return (
            f"the rewritten capture took {rewritten.seconds:.2f} s, over twice the "
            f"{original.seconds:.2f} s of the code as written"
        )
    return ""


@contextlib.contextmanager
def shadowed() -> Iterator[None]:
    """Around a capture run only to be measured: random state restored after, prints, warnings and log
    records dropped (the user sees only the run that answers)."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                yield
        finally:
            logging.disable(previous)


def copies(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Deep copies for a measuring run (the user's module and inputs are not touched)."""
    return copy.deepcopy(model), copy.deepcopy(args), copy.deepcopy(kwargs)


def _torch_file(path: str) -> bool:
    from ...core.userframe import in_torch

    return in_torch(path)
