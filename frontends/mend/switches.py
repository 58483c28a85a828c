"""Dynamo's own switches that remove breaks, set around each compiled call only (and restored after).

- ``capture_scalar_outputs``: ``.item()`` stays in the graph (an unbacked symbolic value);
- ``capture_dynamic_output_shape_ops``: ``nonzero``, boolean masks, ``unique`` stay in the graph;
- ``reorderable_logging_functions`` gains ``runtime.deferred``, so the deferred effects of
  :mod:`.effects` and :mod:`.checks` move after the graph instead of breaking it.

- ``allow_rnn``: Dynamo reaches an ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` submodule, whose forward
  :mod:`.rnn` wrote out in tensor ops (left to itself, ``allow_rnn`` gives a ``torch.lstm`` call that
  AOTAutograd cannot run under autograd; ``frontends/dynamo.py`` runs such a graph as captured).

**When they are set.** Dynamo reads these options only while it traces a frame: its guards do not
test them (a cached graph runs whatever they hold), the compiled code does not read them, and the
backends compile in threads of their own, where these context-local settings (``ContextVar``s in
torch's config module) never reached. So for a compiled ``nn.Module`` they are set around Dynamo's
frame callback (``frontends/dynamo.py`` ``while_tracing``, given :func:`tracing`), which runs only on
a cache miss (a first call, a recompile), and a call that hits the cache pays nothing for them; saving and restoring four config attributes around
every call cost ~18 us, as much as the rest of torchmux's per-call work. A compiled function (whose
Dynamo wrapper keeps its callback in a closure) gets them around each call (:func:`scoped`).

Either way a trace that ``torch.cond`` refused (a rewritten if/else) is tried once more
(:func:`cond_refused`: in :func:`scoped`, or in the API's entry for a module).

**Deferred effects in inlined frames.** Dynamo keeps a reorderable logging call on the translator of
the frame that made it, and emits only the root frame's after the graph: a print deferred in a
submodule's ``forward`` or a helper (frames Dynamo inlines) was dropped, never replayed (torch 2.13).
:func:`_replay_from_inlined_frames` hands ``runtime.deferred``'s calls to the root frame's translator,
the function reached there through a global Dynamo installs, so they are replayed after the graph in
the order they were made. Other reorderable functions are left as Dynamo handles them.

**Warnings from code the mend pass does not rewrite** (torch's own ``InstanceNorm2d`` warns when the
input's channels are not its ``num_features``; a user's ``warnings.warn(..., stacklevel=2)``, which
:mod:`.effects` leaves alone): ``warnings.warn`` is reorderable too, and the same handler turns a call
whose message, category and stacklevel are known while tracing into a deferred effect registered
there (:func:`_warning_effect`), shown once the graph has run with the file, line and module of the
traced frame ``stacklevel`` names, as Python's own ``warn`` finds them. One difference: Dynamo calls a
submodule's ``forward`` without ``Module.__call__``'s two frames between, so torch's warning aimed at
its caller names the user's line that called the submodule, where eager names ``module.py``'s. Any
other call (a message computed from the data, another keyword) is the break Dynamo gives it without
the switch.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..dynamo import no_guard_profile
from . import runtime as rt


class switches:
    """Dynamo options that remove breaks, for the duration of one compiled call.

    A save/set/restore of a few attributes of ``torch._dynamo.config`` rather than
    ``config.patch``: the patch builds a class on every call and cost ~40 us, as much as running a
    small compiled graph. Nested compiled calls restore in order (each call has its own instance).
    """

    __slots__ = ("_saved",)

    def __enter__(self) -> None:
        cfg = torch._dynamo.config
        saved: list[tuple[str, Any]] = []  # (attribute, value to restore)
        if not cfg.capture_scalar_outputs:
            saved.append(("capture_scalar_outputs", False))
            cfg.capture_scalar_outputs = True
        if not cfg.capture_dynamic_output_shape_ops:
            saved.append(("capture_dynamic_output_shape_ops", False))
            cfg.capture_dynamic_output_shape_ops = True
        # sizes become symbolic when they change (dynamic=None), Python floats stay constants: a symbolic
        # float breaks torch.cond's operands in torch 2.13 and no backend but eager and Inductor takes one
        if not cfg.specialize_float:
            saved.append(("specialize_float", False))
            cfg.specialize_float = True
        if not cfg.allow_rnn:
            saved.append(("allow_rnn", False))
            cfg.allow_rnn = True
        logging_fns = cfg.reorderable_logging_functions
        if rt.deferred not in logging_fns or warnings.warn not in logging_fns:
            saved.append(("reorderable_logging_functions", logging_fns))
            cfg.reorderable_logging_functions = set(logging_fns) | {rt.deferred, warnings.warn}
        self._saved = saved

    def __exit__(self, *exc: Any) -> None:
        cfg = torch._dynamo.config
        for name, value in reversed(self._saved):
            setattr(cfg, name, value)


def _replay_from_inlined_frames() -> bool:
    """Patch Dynamo's reorderable-call handler once (see the module docstring); False where this torch
    lays it out otherwise (then a deferred effect in an inlined frame is lost, as before)."""
    try:
        from torch._dynamo.source import GlobalSource
        from torch._dynamo.variables import ConstantVariable
        from torch._dynamo.variables.functions import SkipFunctionVariable
        from torch._dynamo.variables.misc import DebuggingVariable
    except ImportError:
        return False
    original = DebuggingVariable.call_function
    if getattr(original, "_torchmux_root", False):
        return True

    def call_function(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        if getattr(tx, "export", False) or self.value not in (rt.deferred, warnings.warn):
            return original(self, tx, args, kwargs)
        root = tx
        while getattr(root, "parent", None) is not None:
            root = root.parent
        if self.value is warnings.warn:
            key = _warning_effect(tx, args, kwargs)
            if key is None:
                return SkipFunctionVariable(warnings.warn).call_function(tx, args, kwargs)
            args, kwargs = [ConstantVariable.create(key)], {}
        elif root is tx:
            return original(self, tx, args, kwargs)
        name = tx.output.install_global_by_id("_torchmux_deferred", rt.deferred)
        return original(DebuggingVariable(rt.deferred, source=GlobalSource(name)), root, args, kwargs)

    call_function._torchmux_root = True  # type: ignore[attr-defined]
    DebuggingVariable.call_function = call_function  # type: ignore[method-assign]
    return True


#: (file, line, function, message, category) -> the effect registered for it (one per warning site)
_WARNINGS: dict[tuple[Any, ...], int] = {}


def _warning_effect(tx: Any, args: Any, kwargs: Any) -> int | None:
    """The deferred effect for ``warnings.warn(*args, **kwargs)`` traced in ``tx``'s frame, or None when the
    call is not one whose warning is known while tracing: a constant ``str`` message, a constant ``Warning``
    class for ``category``, a constant ``int`` for ``stacklevel``, no other keyword."""
    names = ("message", "category", "stacklevel")
    if len(args) > len(names) or set(kwargs) - set(names[len(args) :]):
        return None
    given = dict(zip(names, args)) | dict(kwargs)
    if not all(v.is_python_constant() for v in given.values()):
        return None
    message = given["message"].as_python_constant() if "message" in given else None
    category = given["category"].as_python_constant() if "category" in given else UserWarning
    level = given["stacklevel"].as_python_constant() if "stacklevel" in given else 1
    if not (
        isinstance(message, str) and isinstance(category, type) and issubclass(category, Warning) and type(level) is int
    ):
        return None
    frame = tx  # the frame stacklevel names; past the traced frames, the outermost one traced
    for _ in range(level - 1):
        frame = frame.parent if getattr(frame, "parent", None) is not None else frame
    code, lineno = frame.f_code, frame.lineno
    site = (code.co_filename, lineno, code.co_name, message, category)
    if site not in _WARNINGS:
        _WARNINGS[site] = rt.register(
            rt.Effect(
                kind="warn",
                callee=_warn_callee,
                globals=frame.f_globals,
                filename=code.co_filename,
                lineno=lineno,
                funcname=code.co_name,
                parts=(("const", message),),
                kwargs=(("category", category),),
            )
        )
    return _WARNINGS[site]


def _warn_callee(module_globals: dict[str, Any]) -> Callable[..., None]:
    return warnings.warn


_replay_from_inlined_frames()


def tracing() -> switches:
    """The switches for :func:`torchmux.frontends.dynamo.while_tracing` (looked up when Dynamo traces)."""
    return switches()


class TraceSwitches:
    """One compiled module's :func:`tracing`, for ``while_tracing``'s ``extra``: the switches while
    ``on``. compile()'s verdict (``api/compile.py`` ``_Verdict``) turns them off for that module where its
    capture broke more than the code as written does under Dynamo's own options (``verdict.switched``):
    the module's later traces are then Dynamo's own, as the verdict measured them."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = True

    def __call__(self) -> switches | None:
        return switches() if self.on else None


def scoped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run under :func:`switches` (and ``frontends.dynamo.no_guard_profile``, as ``while_tracing``
    sets it), with the retry for ``torch.cond`` (:func:`cond_refused`). A compiled ``nn.Module`` whose
    Dynamo callback ``while_tracing`` wrapped needs neither wrapper: the API's entry
    (``api/compile.py``) retries for it."""

    cond = True  # this function's rewritten ifs become torch.cond, until torch.cond refuses one

    @functools.wraps(fn)
    def run_switched(*args: Any, **kwargs: Any) -> Any:
        nonlocal cond
        saved, rt.COND = rt.COND, cond
        try:
            with switches(), no_guard_profile():
                traces = rt.COND_TRACES
                try:
                    return fn(*args, **kwargs)
                except Exception as e:
                    if not cond_refused(e, traces):
                        raise
                    cond = rt.COND = False
                    return fn(*args, **kwargs)
        finally:
            rt.COND = saved

    return run_switched


def cond_refused(e: BaseException, traces: int) -> bool:
    """Whether ``e`` is torch.cond refusing a rewritten if/else while Dynamo traced it (the frame had not
    run); if so, said once: the caller traces again with ``runtime.COND`` off, and keeps it off around its
    own calls from then on (its ifs branch in Python: a graph break each, as without the rewrite). The
    switch is the program's, not the process's: Dynamo guards on ``runtime.COND``, and each program's
    entry (:func:`scoped`, ``api/compile._entry``) sets it to its own state for the length of its call,
    so another program's ifs stay ``torch.cond``."""
    if not (rt.COND and rt.COND_TRACES > traces and isinstance(e, torch._dynamo.exc.TorchDynamoException)):
        return False
    warnings.warn(
        f"torchmux: torch.cond refused a rewritten tensor if/else ({str(e).splitlines()[0]}); "
        "this program's such ifs now branch in Python (one graph break each)",
        stacklevel=3,
    )
    return True


def cond_refusals() -> Callable[[BaseException], bool]:
    """For ``frontends.dynamo.while_tracing``'s ``handled``, as a frame's trace starts: a test of whether
    an exception from that trace is a ``torch.cond`` refusal (the API's entry retries those, see
    :func:`cond_refused`), so Dynamo's failure is raised to it instead of the frame being skipped."""
    before = rt.COND_TRACES
    return lambda e: bool(rt.COND and rt.COND_TRACES > before)
