"""``torchmux.compile``: torch.compile's signature, torchmux's backends.

This is where the layers meet: the frontend (``frontends/``: mend, then Dynamo + AOTAutograd) captures
and normalizes each graph into the IR (``core/ir.py``), and hands it to the autotuner's
:class:`~torchmux.autotune.runner.GraphRunner`, which places it on the backends (``backends/``).
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
from collections.abc import Callable
from typing import Any

import torch

from ..autotune import isolate
from ..autotune.runner import GraphRunner
from ..core import settings
from ..core.backend import prepare_in_background
from ..core.config import CompileConfig, resolve
from ..core.errors import BadArgumentError, FullGraphError
from ..core.userframe import in_torch
from ..frontends.dynamo import TorchmuxDynamoBackend, watch_recompile_limit, while_tracing
from ..frontends.replay import MISS, Replay


def compile(
    model: Callable[..., Any] | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: Any = "auto",
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    disable: bool = False,
) -> Any:
    """Compile ``model`` (an ``nn.Module`` or a function) the way ``torch.compile`` does, with torchmux's backends.

    - ``backend``: ``"auto"`` (measure every available backend per graph, run the fastest correct one),
      a backend name (``torchmux list`` shows them), a list of names for auto to choose among, or a
      :class:`torchmux.Backend` object.
    - ``fullgraph=True``: raise :class:`FullGraphError` naming the break and its file:line instead of
      splitting the program.
    - ``dynamic``: as torch.compile's. ``None`` (default): static on the first shape; when a dimension
      changes, Dynamo captures the graph again with it symbolic, and that graph serves every size.
      ``True``: symbolic from the start; ``False``: a new shape recompiles (up to Dynamo's recompile
      limit). ``torch._dynamo.mark_dynamic`` is honoured. Backends with ``dynamic_shapes`` (``torchmux
      list``) compile a symbolic graph once; the others are specialized per size, bounded
      (autotune/shapes.py).
    - ``mode``: as torch.compile's; ``"max-autotune"`` lets backends tune (TVM MetaSchedule, Inductor).
    - ``options``: torchmux's own (``verify``, ``autotune_budget``) and per-backend options written
      ``{"onnxruntime.providers": [...]}`` or ``{"onnxruntime": {"providers": [...]}}``.
    - ``disable=True`` returns ``model`` unchanged.

    Usable as a decorator, bare (``@torchmux.compile``) or with arguments (``@torchmux.compile(backend="eager")``).
    """
    if model is None:
        return functools.partial(
            compile, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options, disable=disable
        )
    if not callable(model):
        raise BadArgumentError(f"compile() needs an nn.Module or a function, got {type(model).__name__}")
    for arg, value in (("fullgraph", fullgraph), ("disable", disable)):
        if not isinstance(value, bool):
            raise BadArgumentError(f"{arg} must be True or False, got {value!r}")
    if dynamic not in (None, True, False):
        raise BadArgumentError(f"dynamic must be None, True or False, got {dynamic!r}")
    if disable:
        return model

    config = resolve(backend, mode, options)
    settings.REMOTE_CACHE.get()  # a malformed TORCHMUX_REMOTE_CACHE is refused here, not at the first call
    watch_recompile_limit()  # Dynamo's silent switch to eager past its limit becomes a warning
    isolate.prestart(config.backends, config.isolation, model)  # the trials' child starts while Dynamo captures
    # so do the backends' first-compile waits (a plugin's prepare() only when its trials are not isolated)
    trusted = [b for b in config.backends if config.isolation == "off" or not isolate.wanted(b, "third-party")]
    prepare_in_background(trusted, _device_of(model))
    retry = None
    rewrites = switched = None
    if config.get("mend"):  # remove graph breaks from the source first (frontends/mend/)
        from ..frontends.mend import TraceSwitches, cond_refusals, cond_refused, mend, scoped

        model, rewrites = mend(model)
        switched = TraceSwitches()  # the verdict turns them off for this module where they broke more
    dynamo_backend = shared_backend(config)
    compiled = torch.compile(model, backend=dynamo_backend, fullgraph=fullgraph, dynamic=dynamic)
    # torchmux's Dynamo options (and the mend pass's switches) while Dynamo traces (frontends/dynamo.py);
    # first: it rebuilds compiled.forward. Where it cannot, the switches go around each call
    traced = isinstance(compiled, torch.nn.Module) and while_tracing(
        compiled,
        switched,
        suppress=not fullgraph,  # a frame Dynamo fails on runs as plain Python, with a warning
        handled=cond_refusals if config.get("mend") else None,  # the entry below retries those
    )
    if config.get("mend") and traced:
        retry = cond_refused  # the entry below retries the trace torch.cond refused (as scoped() does)
    elif config.get("mend") and isinstance(compiled, torch.nn.Module):
        compiled.forward = scoped(compiled.forward)
    elif config.get("mend"):
        compiled = functools.wraps(model)(scoped(compiled))
    if isinstance(compiled, torch.nn.Module):
        use = config.get("replay") and Replay.available() and isinstance(model, torch.nn.Module)
        replay = Replay(model, dynamo_backend) if use else None  # type: ignore[arg-type]  # a Module, as tested
        # judged where the mend pass ran on a module: its rewrites, and the switches set while it traces
        mended = rewrites is not None and (rewrites.keys or traced) and isinstance(model, torch.nn.Module)
        judge = _Verdict(model, rewrites, dynamo_backend, switched) if mended else None  # type: ignore[arg-type]  # a Module
        compiled.forward = _entry(compiled.forward, model.forward, retry, fullgraph, replay, judge)  # type: ignore[union-attr]
        return compiled
    return functools.wraps(model)(_entry(compiled, model, retry, fullgraph))


def _device_of(model: Any) -> str:
    """The device type of a module's first weight (where its graphs will most likely run), else "cpu"."""
    if isinstance(model, torch.nn.Module):
        for t in itertools.chain(model.parameters(), model.buffers()):
            return t.device.type
    return "cpu"


def runner_factory(config: CompileConfig) -> Callable[[Any], GraphRunner]:
    """What the frontend calls for each normalized graph: the autotuner's runner under ``config``."""
    return lambda ir: GraphRunner(ir, config)


_SHARED: dict[tuple, TorchmuxDynamoBackend] = {}


def shared_backend(config: CompileConfig) -> TorchmuxDynamoBackend:
    """One Dynamo backend object per distinct configuration.

    Dynamo guards each cached graph on the identity of the backend that compiled it, and counts every
    new backend against the recompile limit of the code object. Compiling two models of the same class
    (or two ``nn.Sequential``s) with the same settings must reuse the same backend, or the tenth
    ``torchmux.compile`` of a Sequential would silently run eagerly.
    """
    key = (
        tuple(id(b) for b in config.backends),
        config.auto,
        config.mode,
        repr(sorted(config.own.items())),
        repr(sorted((k, sorted(v.items())) for k, v in config.backend_options.items())),
    )
    if key not in _SHARED:
        _SHARED[key] = TorchmuxDynamoBackend(runner_factory(config))
    return _SHARED[key]


def torchmux_dynamo_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """Entry point for ``torch.compile(m, backend="torchmux")`` (group ``torch_dynamo_backends``).

    ``torch.compile(m, backend="torchmux", mode=..., options={...})`` passes mode and options through;
    the backend choice is "auto". Name a backend with ``options={"backend": "onnxruntime"}``.
    """
    options = dict(kwargs.get("options") or {})
    backend = options.pop("backend", "auto")
    config = resolve(backend, kwargs.get("mode"), options)
    return shared_backend(config)(gm, example_inputs)


def _fullgraph_message(e: BaseException) -> str:
    text = str(e)
    where = ""
    frames = [f for f in (getattr(e, "real_stack", None) or []) if not in_torch(f.filename)]
    if frames:
        f = frames[-1]
        where = f"{f.filename}:{f.lineno}" + (f" ({f.line.strip()})" if f.line else "")
    else:
        found = re.findall(r'File "([^"]+)", line (\d+)', text)
        user = [(p, n) for p, n in found if not in_torch(p)]
        if user:
            where = f"{user[-1][0]}:{user[-1][1]}"
    reason = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    return (
        f"fullgraph=True, but the program breaks into more than one graph at {where or '(unknown location)'}: "
        f"{reason}. Remove that break (torchmux.explain(model, *args) lists every break), "
        "or compile with fullgraph=False to let Python run between graphs."
    )


#: compile()'s verdict copies the module to capture it again; a module holding more than this (weights and
#: buffers) keeps the rewrites without a verdict rather than risk the memory of a second copy
VERDICT_COPY_BYTES = 1 << 30


class _Verdict:
    """The mend pass's keep-or-revert in ``compile()`` (``frontends/mend/verdict.py``), once, around the
    module's first call: that call's capture is recorded (the shared Dynamo backend's recorder, for that
    call only); where its breaks leave in doubt whether the code as written would break less, both are
    captured again on copies of the module and inputs (eager backend, output silenced, Dynamo's caches
    left alone) and compared (:func:`~torchmux.api.explain.verdict_of`). A revert puts the user's own
    methods back on the module (``unmend``), turns the mend pass's switches off for it (``switched``,
    what ``while_tracing`` sets while Dynamo traces it) and drops Dynamo's graphs of the first call's
    trace (``TracedSince``: its guards do not test the switches): the next call captures the code as
    written, as Dynamo alone would. The first call's answer is the mended code's, which computes the same
    values. In a distributed run (a process group initialized), or for a module over
    :data:`VERDICT_COPY_BYTES`, the rewrites and switches are kept without a verdict."""

    def __init__(self, model: torch.nn.Module, rewrites: Any, backend: TorchmuxDynamoBackend, switched: Any) -> None:
        self.model, self.rewrites, self.backend, self.switched = model, rewrites, backend, switched
        self.reverted: list[str] = []  # why, then each rewrite that was taken back

    def first(self, call: Callable[[], Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            # a distributed program keeps the rewrites: the verdict's captures run the module's forward on
            # copies, and a wrapper's hooks there (FSDP's all-gathers, its state machine) are not for copies
            return call()
        held = sum(t.numel() * t.element_size() for t in itertools.chain(self.model.parameters(), self.model.buffers()))
        if held > VERDICT_COPY_BYTES:  # a copy of a large model could take the memory the program needs
            return call()
        from ..frontends.dynamo import SUPPRESSED, Recorder, TracedSince
        from ..frontends.mend import unmend
        from .explain import _unsupported_now, verdict_of

        recorder = Recorder()
        recorder.unsupported_before = _unsupported_now()  # type: ignore[attr-defined]  # as compile_recorded sets
        recorder.suppressed_before = len(SUPPRESSED)  # type: ignore[attr-defined]
        recorder.entry = self.model  # type: ignore[attr-defined]
        previous, self.backend.recorder = self.backend.recorder, recorder
        traced = TracedSince()
        try:
            out = call()
        finally:
            self.backend.recorder = previous
        why = verdict_of(self.model, args, kwargs, recorder, self.rewrites)
        if why:
            self.reverted = [why, *self.rewrites.applied]
            unmend(self.model)
            self.switched.on = False
            forward = getattr(type(self.model).forward, "__code__", None)  # traced before, by another instance
            traced.forget(*([forward] if forward is not None else []))
            if settings.VERBOSE.get():
                print(f"[torchmux] the mend pass (rewrites and switches) was not kept: {why}", file=sys.stderr)
        return out


def _entry(
    fn: Callable[..., Any],
    original: Callable[..., Any],
    retry: Callable[..., bool] | None,
    fullgraph: bool,
    replay: Replay | None = None,
    judge: _Verdict | None = None,
) -> Callable[..., Any]:
    """What the user calls: ``fn`` (the compiled forward or function) with the API's per-call rules in
    one frame (each wrapper frame costs a call ~0.3 us):

    - a NumPy array argument runs ``original``: eager's behaviour (a TypeError from torch, or whatever
      the user's code does with it) is kept; Dynamo would quietly trace it as a tensor;
    - ``retry`` (the mend pass's ``cond_refused``): a trace that ``torch.cond`` refused is tried once more,
      with this program's rewritten ifs branching in Python from then on: ``runtime.COND`` is set to this
      program's own state around each of its calls (Dynamo guards on it), so one program's refusal
      leaves every other program's ifs as ``torch.cond``;
    - ``fullgraph``: Dynamo's failure becomes a FullGraphError naming the reason and the user's line;
    - ``replay`` (a module's): a call Dynamo's cache would answer runs its code directly (frontends/replay.py);
    - ``judge``: the mend pass's verdict, made around the first call (:class:`_Verdict`).
    """
    from ..frontends.mend import runtime as mend_runtime

    tensor, dynamo_error, backend_failed = (
        torch.Tensor,
        torch._dynamo.exc.TorchDynamoException,
        torch._dynamo.exc.BackendCompilerFailed,
    )

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        for a in args:  # a plain loop, tensors first: this runs on every call (two generators cost ~2 us)
            if type(a) is not tensor and type(a).__module__ == "numpy":
                return original(*args, **kwargs)
        if kwargs and any(type(v).__module__ == "numpy" for v in kwargs.values()):
            return original(*args, **kwargs)
        nonlocal judge, replay
        saved = mend_runtime.COND
        if retry is not None:
            mend_runtime.COND = cond
        try:
            if judge is not None:
                verdict, judge = judge, None
                out = verdict.first(lambda: guarded(args, kwargs), args, kwargs)
                if verdict.reverted and replay is not None:
                    replay = Replay(verdict.model, verdict.backend)  # the user's forward is the one compiled now
                return out
            if replay is not None and not kwargs:
                out = replay(args)
                if out is not MISS:
                    return out
            return guarded(args, kwargs)
        finally:
            mend_runtime.COND = saved

    cond = True  # this program's rewritten ifs become torch.cond (until torch.cond refuses one: retry)

    def guarded(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        nonlocal cond
        traces = mend_runtime.COND_TRACES
        try:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if retry is None or not retry(e, traces):
                    raise
            cond = mend_runtime.COND = False
            return fn(*args, **kwargs)
        except dynamo_error as e:
            if not fullgraph or isinstance(e, backend_failed):
                raise
            raise FullGraphError(_fullgraph_message(e)) from e

    return run
