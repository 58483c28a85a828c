"""The capture frontend: TorchDynamo (PEP 523) finds the graphs, AOTAutograd normalizes them.

Pipeline for each graph Dynamo captures (between graphs Python runs as usual, as in torch.compile):

1. Dynamo hands us a torch-level ``fx.GraphModule`` plus example inputs; parameters and buffers
   arrive as inputs (Dynamo inlines ``nn.Module``s), so we record which input is which.
2. AOTAutograd functionalizes it and decomposes it to Core ATen (``core_aten_decompositions``);
   under autograd it splits forward and backward, and both come back to us.
3. Each resulting graph becomes a linted :class:`GraphIR`, and the plugins' ``torchmux_graph_captured``
   hook sees it.
4. The ``place`` function the API layer gave us (the autotuner's runner) stands in for it.

If any step fails the graph runs as Dynamo captured it (eagerly), with a warning. This module knows
nothing of placement or backends: it hands each normalized graph to ``place`` and returns what
``place`` returned to Dynamo.
"""

from __future__ import annotations

import contextvars
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ..core.errors import TorchmuxFallbackWarning
from ..core.ir import GraphIR
from ..core.registry import get_registry
from ..core.userframe import in_torch

#: what the API layer passes in: a normalized graph -> the callable that runs it
Place = Callable[[GraphIR], Callable[..., Any]]


@dataclass
class CapturedGraph:
    """What the frontend saw of one Dynamo graph (for explain)."""

    index: int
    dynamo_gm: fx.GraphModule
    break_reason: Any  # torch._dynamo GraphCompileReason, or None
    runners: list[Any] = field(default_factory=list)  # what ``place`` returned, one per normalized graph
    error: str | None = None

    @property
    def torch_ops(self) -> list[Any]:
        return [n.target for n in self.dynamo_gm.graph.nodes if n.op == "call_function"]


class Recorder:
    """Collects every graph one compiled program produced."""

    def __init__(self) -> None:
        self.graphs: list[CapturedGraph] = []


def _input_kinds(gm: fx.GraphModule, example_inputs: list[Any]) -> list[str]:
    kinds = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        source = ""
        arg = node.meta.get("grapharg")
        if arg is not None and getattr(arg, "source", None) is not None:
            source = arg.source.name() if callable(getattr(arg.source, "name", None)) else str(arg.source)
        if isinstance(value, torch.nn.Parameter):
            kinds.append("param")
        elif "_buffers" in source or "_buffers" in node.name:
            kinds.append("buffer")
        else:
            kinds.append("input")
    return kinds


_RNN_OPS = frozenset({torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu})


class TorchmuxDynamoBackend:
    """A Dynamo backend (``torch.compile(m, backend=TorchmuxDynamoBackend(place))``)."""

    def __init__(self, place: Place, recorder: Recorder | None = None) -> None:
        self.place = place
        self.recorder = recorder
        self._count = 0

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any], **_: Any) -> Callable[..., Any]:
        from functorch.compile import make_boxed_func
        from torch._decomp import core_aten_decompositions
        from torch._dynamo.backends.common import aot_autograd

        index, self._count = self._count, self._count + 1
        captured = CapturedGraph(index, gm, getattr(gm, "compile_subgraph_reason", None))
        if self.recorder is not None:
            self.recorder.graphs.append(captured)
        kinds = _input_kinds(gm, example_inputs)
        registry = get_registry()

        def compiler(phase: str) -> Callable[..., Any]:
            def compile_graph(fx_gm: fx.GraphModule, fx_inputs: list[Any]) -> Callable[..., Any]:
                n_inputs = len([n for n in fx_gm.graph.nodes if n.op == "placeholder"])
                ir = GraphIR(
                    fx_gm,
                    kinds if phase != "backward" and n_inputs == len(kinds) else None,
                    name=f"graph_{index}" + ("" if phase == "inference" else f"_{phase}"),
                    phase=phase,
                ).lint()
                registry.notify("torchmux_graph_captured", ir=ir)
                runner = self.place(ir)
                captured.runners.append(runner)
                if phase == "inference" and n_inputs == len(example_inputs) and _plain_inference(example_inputs):
                    direct.append(runner)
                return make_boxed_func(runner)

            return compile_graph

        if any(n.op == "call_function" and n.target in _RNN_OPS for n in gm.graph.nodes):
            # AOTAutograd saves an RNN op's parameters for backward and then fails at the first call under
            # autograd (torch 2.13: "expected all tensors_saved_with_vc_check to be Tensors"): run as captured
            captured.error = "an nn.LSTM/GRU/RNN call that AOTAutograd cannot normalize (torch.lstm/gru/rnn_*)"
            warnings.warn(
                f"torchmux could not normalize graph_{index} ({captured.error}); it runs eagerly",
                TorchmuxFallbackWarning,
                stacklevel=2,
            )
            return gm.forward
        direct: list[Callable[..., Any]] = []  # the inference runner, where AOTAutograd's wrapper has nothing to do
        try:
            compiled = aot_autograd(
                fw_compiler=compiler("forward"),
                bw_compiler=compiler("backward"),
                inference_compiler=compiler("inference"),
                decompositions=core_aten_decompositions(),
            )(gm, example_inputs)
            return _without_autograd(direct[0]) if direct else compiled
        except Exception as e:  # normalization failed: run Dynamo's graph as captured, and say so
            captured.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            warnings.warn(
                f"torchmux could not normalize graph_{index} ({captured.error}); it runs eagerly",
                TorchmuxFallbackWarning,
                stacklevel=2,
            )
            return gm.forward


def _plain_inference(example_inputs: list[Any]) -> bool:
    """Whether AOTAutograd's runtime wrapper around the inference graph being compiled would only call it
    with grad mode off: read from the metadata AOTAutograd left in the tracing context for its compiler
    (the caller checked that the graph takes Dynamo's inputs one for one, so no input was deduplicated,
    lifted, or added as an effect token or RNG state).

    Anything else the wrapper does rules it out: an input mutated (written back after the call, or kept
    in the graph, whose version counter it bumps), an output that aliases an input or another output
    (views regenerated), a tensor subclass (unwrapped and rewrapped), functionalized RNG, effect tokens,
    grad mode set inside the graph, dynamic output dimensions marked for Dynamo, autocast on while
    tracing (the call runs with autocast off) or a first call Dynamo fakifies. Without the wrapper a
    call of a compiled model costs ~10 Python frames less (~3 us; ~15 us where a large graph's run has
    evicted them from the CPU's caches)."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None or getattr(ctx, "fakify_first_call", True) or torch._C._is_any_autocast_enabled():
        return False
    plain = (torch.Tensor, torch.nn.Parameter, int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)
    try:
        return (
            all(type(x) in plain or isinstance(x, torch._subclasses.FakeTensor) for x in example_inputs)
            and not any(i.mutates_data or i.mutates_metadata for i in meta.input_info)
            and meta.num_outputs_aliased == 0
            and meta.num_intermediate_bases == 0
            and not meta.tokens
            and not meta.is_rng_op_functionalized
            and meta.grad_enabled_mutation is None
            and not meta.dynamic_outputs
            and all(type(m).__name__ == "PlainTensorMeta" or isinstance(m, int) for m in meta.subclass_inp_meta)
            and all(
                type(m).__name__ == "PlainTensorMeta" or isinstance(m, int) for m in meta.subclass_fw_graph_out_meta
            )
        )
    except AttributeError:  # a torch whose metadata is laid out otherwise: keep its wrapper
        return False


def _without_autograd(runner: Callable[..., Any]) -> Callable[..., Any]:
    """What Dynamo calls for a plain inference graph: the runner, with grad mode off as AOTAutograd's
    wrapper would set it (an inference graph can be compiled under grad mode when no input needs grad)."""
    grad_enabled, set_grad = torch.is_grad_enabled, torch._C._set_grad_enabled

    def call(*args: Any) -> Any:
        if not grad_enabled():
            return runner(*args)
        set_grad(False)
        try:
            return runner(*args)
        finally:
            set_grad(True)

    return call


_NO_GUARD_PROFILE: contextvars.ContextVar[bool] = contextvars.ContextVar("torchmux_no_guard_profile", default=False)


def _guard_latency(real: Callable[..., float]) -> Callable[..., float]:
    def profile_guard_manager(*args: Any) -> float:
        return 0.0 if _NO_GUARD_PROFILE.get() else real(*args)

    profile_guard_manager._torchmux_real = real  # type: ignore[attr-defined]  # marks it installed
    return profile_guard_manager


class no_guard_profile:
    """While Dynamo traces in this context, it does not time its new guards.

    After building a frame's guards Dynamo runs them once to time them (``profile_guard_manager``,
    torch 2.x): it first flushes the CPU cache, which costs ~20-30 ms on every compiled frame, a third
    of the capture of a small program, for a figure it only writes to its debug log and its compile
    metrics (``guard_latency_us``). Here that figure is 0; the guards themselves, their checks and what
    they decide are unchanged. The hook is installed once, on first use, and reads a context variable,
    so other threads and code outside this context keep Dynamo's timing; a torch without the function
    is left alone.
    """

    __slots__ = ("_token",)

    installed = False

    def __enter__(self) -> None:
        if not no_guard_profile.installed:
            no_guard_profile.installed = True
            import torch._dynamo.guards as guards

            real = getattr(guards, "profile_guard_manager", None)
            if real is not None and not hasattr(real, "_torchmux_real"):
                guards.profile_guard_manager = _guard_latency(real)
        self._token = _NO_GUARD_PROFILE.set(True)

    def __exit__(self, *exc: Any) -> None:
        _NO_GUARD_PROFILE.reset(self._token)


class TraceOptions:
    """Dynamo options torchmux sets while Dynamo traces one of its programs, and ``extra()``'s (the mend
    pass's switches) inside them; restored after.

    ``record_runtime_overhead`` off: with it on (torch's default) Dynamo's bytecode brackets every call
    of a graph with two ``torch._dynamo.disable``-wrapped calls that open a profiler range ("Pregraph
    bytecode") only while torch.profiler runs; ~6 us a call of a compiled program, every call. Off,
    a profile of torchmux's programs lacks that range; nothing else changes. And :class:`no_guard_profile`.
    """

    __slots__ = ("_extra", "_no_profile", "_saved")

    def __init__(self, extra: Callable[[], Any] | None = None) -> None:
        self._extra = extra() if extra is not None else None
        self._no_profile = no_guard_profile()

    def __enter__(self) -> None:
        cfg = torch._dynamo.config
        self._saved = getattr(cfg, "record_runtime_overhead", None)  # None: a torch without the option
        if self._saved is not None:
            cfg.record_runtime_overhead = False
        self._no_profile.__enter__()
        if self._extra is not None:
            try:
                self._extra.__enter__()
            except BaseException:
                self._extra = None  # it set nothing to restore
                self.__exit__(None, None, None)
                raise

    def __exit__(self, *exc: Any) -> None:
        extra, self._extra = self._extra, None
        try:
            if extra is not None:
                extra.__exit__(*exc)
        finally:
            self._no_profile.__exit__(*exc)
            if self._saved is not None:
                torch._dynamo.config.record_runtime_overhead = self._saved


def while_tracing(
    compiled: Any,
    extra: Callable[[], Any] | None = None,
    suppress: bool = True,
    handled: Callable[[], Callable[[BaseException], bool]] | None = None,
) -> bool:
    """Set :class:`TraceOptions` (with ``extra``) only while Dynamo traces ``compiled`` (what
    ``torch.compile`` returned for an ``nn.Module``): they go around its Dynamo context's frame callback,
    which Dynamo calls only on a cache miss (a first call, a recompile), and its forward is rebuilt on
    it; a call that hits the cache pays nothing for them. Dynamo reads these options only while it
    traces (its guards do not test them), and the backends compile in threads of their own.

    False (and nothing changed) where ``compiled`` is not an ``OptimizedModule`` laid out as torch 2.x
    lays it out. The wrapper carries ``_torchdynamo_orig_backend`` as the callback did (the link Dynamo
    follows to the backend that compiled a cached graph, and to rebuild the callback under
    ``set_stance``), so Dynamo sees the same backend through it.

    ``suppress`` (compile()'s ``not fullgraph``): where Dynamo itself fails on a frame (its fake tensors
    refuse a legacy constructor, an internal error), the callback answers "skip this code" as Dynamo's
    own ``suppress_errors`` does: the frame runs as plain Python, as eager runs it, and Dynamo does not
    try that code again; the rest of the program is compiled as usual. The failure does not reach the
    user's program; a :class:`TorchmuxFallbackWarning` names the frame and the line, and
    ``torchmux.explain`` lists it (:data:`SUPPRESSED`). ``handled()``, called as a frame's trace starts,
    gives a test of the exceptions a caller above handles itself (the mend pass retries a trace that
    ``torch.cond`` refused): those are raised as before."""
    ctx: Any = getattr(compiled, "dynamo_ctx", None)
    callback = getattr(ctx, "callback", None)
    rebuild = getattr(compiled, "_initialize", None)
    if not callable(callback) or not callable(rebuild) or not hasattr(callback, "_torchdynamo_orig_backend"):
        return False

    def traced(*args: Any, **kwargs: Any) -> Any:
        with TraceOptions(extra):
            caller_handles = handled() if handled is not None else None
            try:
                return callback(*args, **kwargs)
            except torch._dynamo.exc.TorchDynamoException as e:
                if not suppress or _SKIP is None or (caller_handles is not None and caller_handles(e)):
                    raise
                return _skip_failed_frame(e, args[0] if args else None)

    traced._torchdynamo_orig_backend = callback._torchdynamo_orig_backend  # type: ignore[attr-defined]  # Dynamo's link, see above
    ctx.callback = traced
    rebuild()  # the forward Dynamo built holds the callback it was built with: build it on ours
    return True


class TracedSince:
    """The code objects Dynamo traces from its making on (Dynamo's own trackers of the frames it
    translated and the code it emitted, resume functions included), and :meth:`forget`, which drops
    their cached graphs: the next call of such code is traced again. compile()'s verdict uses it when it
    turns the mend pass's switches off for a module, whose first call was traced under them (Dynamo's
    guards do not test its options, so its cached graphs would be kept)."""

    def __init__(self) -> None:
        from torch._dynamo import convert_frame

        self._trackers = (convert_frame.input_codes, convert_frame.output_codes)
        self._marks = [len(t.seen) for t in self._trackers]

    def forget(self, *also: types.CodeType) -> None:
        """Drop the cached graphs of every code traced since, and of ``also``."""
        from torch._C._dynamo.eval_frame import reset_code

        codes = [ref() for t, mark in zip(self._trackers, self._marks) for ref in t.seen[min(mark, len(t.seen)) :]]
        dropped = {id(c): c for c in [*codes, *also] if c is not None}
        for code in dropped.values():
            reset_code(code)


class _RecompileLimitWatch:
    """Turns Dynamo's "hit config.recompile_limit" log line into a TorchmuxFallbackWarning.

    Past the limit Dynamo runs the function eagerly from then on, and says so only in its log. The
    warning names the function (the graph's code), the last guard that failed (the dimension that
    changed) and what to do.
    """

    installed = False

    @classmethod
    def install(cls) -> None:
        import logging

        if cls.installed:
            return
        cls.installed = True

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                text = str(record.msg)
                if "hit config." not in text or not record.args:
                    return
                try:
                    fields: tuple[Any, ...] = tuple(record.args)[:4]  # type: ignore[arg-type,unused-ignore]  # a tuple here (typed as a mapping too)
                    limit, value, function, reason = fields
                except (TypeError, ValueError):
                    return
                warnings.warn(
                    f"torchmux: Dynamo hit torch._dynamo.config.{limit} ({value}) on {function}; the last change "
                    f"was: {str(reason).strip()}. From now on that function runs eagerly, not compiled. "
                    f"If its shapes keep changing, compile with dynamic=True (or torch._dynamo.mark_dynamic the "
                    f"input's dimension) so one graph serves every size, or raise torch._dynamo.config.{limit} "
                    "(torch._dynamo.config.cache_size_limit in older torch).",
                    TorchmuxFallbackWarning,
                    stacklevel=2,
                )

        logging.getLogger("torch._dynamo.convert_frame").addHandler(Handler(logging.WARNING))


watch_recompile_limit = _RecompileLimitWatch.install


@dataclass(frozen=True)
class Suppressed:
    """A frame Dynamo failed on, run as plain Python since (:func:`while_tracing`'s ``suppress``)."""

    function: str
    filename: str
    lineno: int
    reason: str  # the exception's type and first line


#: every frame Dynamo failed on while torchmux traced, in order (explain reports those of its call)
SUPPRESSED: list[Suppressed] = []

try:  # what a frame callback returns for "run this code as plain Python from now on" (torch >= 2.6)
    from torch._dynamo.types import ConvertFrameReturn as _SKIP
except ImportError:  # an older torch: its failures are raised as before
    _SKIP = None  # type: ignore[assignment,misc]


def _skip_failed_frame(e: BaseException, frame: Any) -> Any:
    code = getattr(frame, "f_code", None)
    stack = [f for f in (getattr(e, "real_stack", None) or []) if not in_torch(f.filename)]
    if stack:
        filename, lineno = stack[-1].filename, stack[-1].lineno or 0
    else:
        filename, lineno = getattr(code, "co_filename", "?"), getattr(code, "co_firstlineno", 0)
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    entry = Suppressed(getattr(code, "co_name", "?"), filename, lineno, f"{type(e).__name__}: {first}")
    SUPPRESSED.append(entry)
    warnings.warn_explicit(
        f"torchmux: Dynamo failed while capturing {entry.function} ({entry.filename}:{entry.lineno}): "
        f"{entry.reason[:300]}. That function runs as plain Python (eagerly, not compiled); the rest of the "
        "program is compiled as usual. torchmux.explain(model, *args) lists it.",
        TorchmuxFallbackWarning,
        entry.filename,
        entry.lineno,
    )
    return _SKIP(skip_reason=f"torchmux: Dynamo failed on this frame ({entry.reason[:200]})")
