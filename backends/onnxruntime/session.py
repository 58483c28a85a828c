"""ONNX Runtime backend, the heavy part: GraphIR -> ONNX model (export.py) -> cached session -> IOBinding calls.

The pipeline, one step per function:

1. ``_provider_list``: the execution providers (request option or the device's default), checked
   against what ONNX Runtime offers here.
2. ``_cache_dir``: the folder that holds this graph's files, keyed by everything that changes them:
   IR fingerprint, onnxruntime, torch and opset versions, providers.
3. ``export.export_onnx`` (cache miss only): the ONNX model (export.py).
4. ``_optimized_model`` (cache miss only): ONNX Runtime's extended graph optimizations, saved to disk
   (``SessionOptions.optimized_model_filepath``). Hardware-specific layout passes run at load time.
5. :class:`OrtGraph`: the session over the optimized model (one per model file and settings in the
   process, its threads idle between runs, its memory from one process-wide arena: see step 4); each
   call binds the torch tensors' memory as inputs and fresh torch tensors as outputs (IOBinding), so
   no NumPy array is made.

Cache layout: ``<TORCHMUX_CACHE_DIR>/onnxruntime/<key>/model.onnx`` (the export) and
``model.opt.onnx`` (after ONNX Runtime's optimizations). Files are written to a temporary name and
renamed, so processes sharing the folder never read half a file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from torchmux import extend
from torchmux.extend import (
    GraphIR,
    TensorSpec,
    artifact_dir,
    atomic_write,
    fetch_artifact,
    package_version,
    publish_artifact,
    tensor_inputs,
)

from . import CPU, CUDA, OPTIONS, TENSORRT, usable_providers
from .export import (
    EXPORT_FORMAT,
    IR_VERSION,
    OPSET,
    export_onnx,
    export_program_onnx,
    tensor_outputs,
    weights_by_reference,
)

_log = logging.getLogger(__name__)

# torch dtype -> (NumPy element type for IOBinding, ONNX Runtime's type string)
_TYPES: dict[torch.dtype, tuple[type, str]] = {
    torch.float32: (np.float32, "tensor(float)"),
    torch.float16: (np.float16, "tensor(float16)"),
    torch.float64: (np.float64, "tensor(double)"),
    torch.int64: (np.int64, "tensor(int64)"),
    torch.int32: (np.int32, "tensor(int32)"),
    torch.int16: (np.int16, "tensor(int16)"),
    torch.int8: (np.int8, "tensor(int8)"),
    torch.uint8: (np.uint8, "tensor(uint8)"),
    torch.bool: (np.bool_, "tensor(bool)"),
}


# --------------------------------------------------------------------------------------------- 1
def _provider_list(request: extend.CompileRequest) -> list[tuple[str, dict[str, Any]]]:
    """The providers to ask for, as (name, options) pairs; raises if one cannot exist here."""
    unknown = sorted(set(request.options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown onnxruntime option(s) {unknown}; known: "
            + "; ".join(f"{k} ({v.help})" for k, v in OPTIONS.items())
        )
    device = _device(request.example_inputs)
    requested = request.options.get("providers")
    if requested is None:
        usable = usable_providers()
        if device.type == "cuda":
            names = [p for p in (TENSORRT, CUDA) if p in usable] + [CPU]
        else:
            names = [CPU]
        requested = names
    if isinstance(requested, str) or not isinstance(requested, (list, tuple)) or not requested:
        raise ValueError(
            f"options['onnxruntime.providers'] must be a non-empty list of provider names or (name, options) "
            f"pairs, got {requested!r}"
        )
    out: list[tuple[str, dict[str, Any]]] = []
    built = ort.get_available_providers()
    for p in requested:
        if not isinstance(p, str) and not (isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[1], dict)):
            raise ValueError(
                f"options['onnxruntime.providers']: {p!r} is neither a provider name nor a (name, options) pair"
            )
        name, opts = (p, {}) if isinstance(p, str) else (p[0], dict(p[1]))
        if name not in built:
            raise ValueError(
                f"execution provider {name!r} is not in this onnxruntime build ({ort.__version__}); it has "
                f"{', '.join(built)}. Pass some of those in options['onnxruntime.providers']."
            )
        if name in (CUDA, TENSORRT) and device.type == "cuda":
            opts.setdefault("device_id", device.index or 0)
        out.append((name, opts))
    return out


def _device(inputs: Sequence[Any]) -> torch.device:
    return next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))


# --------------------------------------------------------------------------------------------- 2
def _cache_dir(ir: GraphIR, providers: list[tuple[str, dict[str, Any]]], program: bool = False) -> Path:
    key = json.dumps(
        {
            "fingerprint": ir.fingerprint(),
            "program": program,  # exported from the whole program (torchmux.export), not from ir
            "format": EXPORT_FORMAT,
            "onnxruntime": ort.__version__,
            "torch": torch.__version__,
            "onnxscript": package_version("onnxscript"),  # holds torchlib, the ATen -> ONNX translations
            "opset": OPSET,
            "ir_version": IR_VERSION,
            "providers": [[name, sorted((k, str(v)) for k, v in opts.items())] for name, opts in providers],
        },
        sort_keys=True,
    )
    return artifact_dir("onnxruntime") / hashlib.sha256(key.encode()).hexdigest()[:32]


# --------------------------------------------------------------------------------------------- 4
# Threads and memory in a process that runs torch too (``python -m torchmux.bench.scripts.ort_sessions``
# measures each setting side by side). Every session gets its own intra-op pool of torch's thread count
# whose workers never spin while idle: ONNX Runtime's default pool keeps spinning after a run (on 2
# cores, ~25 ms of CPU in the 50 ms after it), which takes the cores from torch's ops between regions
# and from the other sessions of the process (torchmux opens one per graph and per input shape).
# ``allow_spinning`` (an option) lets workers spin between the parallel sections of one run;
# ``force_spinning_stop`` stops them when the run returns. ONNX Runtime's global pool is no better
# here: from Python its spinning cannot be turned off (``set_global_thread_pool_sizes`` takes sizes
# only, and ``force_spinning_stop`` applies to per-session pools), and its size is fixed for the process.
# What sessions do share: one CPU arena for the process (``_env_arena``), and one session per model
# file and settings (``_shared_session``): a graph compiled twice (a named backend and auto in one
# process, a graph captured again) runs on one session, one pool, one copy of the packed weights.
def _session_options(level: ort.GraphOptimizationLevel, options: Any, shared_arena: bool = True) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 3  # errors only: shape-merge notes on empty tensors are not the user's business
    so.graph_optimization_level = level
    # torch's thread count unless told otherwise: a program that calls torch.set_num_threads(1) means
    # one thread, and auto compares backends on the same number of cores
    so.intra_op_num_threads = int(options.get("intra_op_num_threads") or torch.get_num_threads())
    so.add_session_config_entry(SPINNING, "1" if options.get("allow_spinning") else "0")
    so.add_session_config_entry(SPINNING_STOP, "1")  # a finished run leaves no thread spinning
    if shared_arena and _env_arena():
        so.add_session_config_entry(ENV_ALLOCATORS, "1")
    return so


SPINNING, SPINNING_STOP = "session.intra_op.allow_spinning", "session.force_spinning_stop"
ENV_ALLOCATORS = "session.use_env_allocators"
_SHARING = threading.Lock()
_ARENA: list[bool] = []  # [whether the process-wide CPU arena is registered], once decided
_SESSIONS: weakref.WeakValueDictionary[str, ort.InferenceSession] = weakref.WeakValueDictionary()


def _env_arena() -> bool:
    """Register one CPU arena allocator in ONNX Runtime's environment, once per process; whether sessions
    can use it (``session.use_env_allocators``). Separate arenas each keep their high-water mark: 6
    sessions of the zoo's BERT took 41 MB with their own, 32 MB with the shared one."""
    with _SHARING:
        if not _ARENA:
            try:
                info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
                ort.create_and_register_allocator(info, None)
                _ARENA.append(True)
            except Exception as e:  # noqa: BLE001 -- one registered by the program itself is as good; else own arenas
                _ARENA.append("already" in str(e).lower())
                _log.debug("onnxruntime: no process-wide CPU arena (%s)", e)
        return _ARENA[0]


def _shared_session(
    model: Path, so: ort.SessionOptions, providers: list[tuple[str, dict[str, Any]]]
) -> ort.InferenceSession:
    """The live session of this model file with these settings, else a new one (kept while a graph holds it).

    The file's path is its content's key (``_cache_dir``), so one path with the same options is one
    program; ``InferenceSession.run`` is safe to call from several threads."""
    entries = {k: _entry(so, k) for k in (SPINNING, SPINNING_STOP, ENV_ALLOCATORS)}
    key = json.dumps(
        [str(model), int(so.graph_optimization_level), so.intra_op_num_threads, entries, providers],
        sort_keys=True,
        default=str,
    )
    with _SHARING:
        session = _SESSIONS.get(key)
    if session is None:  # made outside the lock: loading a large model takes seconds
        made = ort.InferenceSession(str(model), sess_options=so, providers=providers)
        with _SHARING:  # another thread may have made one meanwhile: one session is kept, the other dropped
            session = _SESSIONS.setdefault(key, made)
    return session


def _entry(so: ort.SessionOptions, key: str) -> str | None:
    try:
        return so.get_session_config_entry(key)
    except RuntimeError:  # not set
        return None


def _optimized_model(folder: Path, providers: list[tuple[str, dict[str, Any]]]) -> Path:
    """Run ONNX Runtime's hardware-independent optimizations once and save the result next to the export.

    TensorRT compiles the graph into engines that cannot be saved as ONNX; with TensorRT the export
    itself is loaded (TensorRT keeps its own engine cache, see :func:`_with_engine_cache`).
    """
    source, target = folder / "model.onnx", folder / "model.opt.onnx"
    if any(name == TENSORRT for name, _ in providers):
        return source
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    so = _session_options(ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, {})
    so.optimized_model_filepath = str(tmp)
    try:
        session = ort.InferenceSession(str(source), sess_options=so, providers=_with_engine_cache(providers, folder))
        _check_providers(session, providers)  # never cache a model optimized for a fallback provider
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    _sign(target)
    return target


def _check_providers(session: ort.InferenceSession, providers: list[tuple[str, dict[str, Any]]]) -> None:
    """ONNX Runtime quietly falls back to the CPU when a provider cannot load: refuse that instead."""
    missing = [name for name, _ in providers if name not in session.get_providers()]
    if missing:
        raise RuntimeError(
            f"onnxruntime could not enable {', '.join(missing)} here (the session got {', '.join(session.get_providers())}); "
            f"providers usable on this machine: {', '.join(usable_providers())}. Pass those in options['onnxruntime.providers']."
        )


def _with_engine_cache(providers: list[tuple[str, dict[str, Any]]], folder: Path) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, opts in providers:
        opts = dict(opts)
        if name == TENSORRT:
            opts.setdefault("trt_engine_cache_enable", True)
            opts.setdefault("trt_engine_cache_path", str(folder / "tensorrt"))
        if name == CUDA and torch.cuda.is_available() and "user_compute_stream" not in opts:
            # run on torch's current stream: inputs torch wrote are ready, outputs are ordered for torch
            opts["user_compute_stream"] = str(torch.cuda.current_stream(int(opts.get("device_id", 0))).cuda_stream)
            opts["has_user_compute_stream"] = "1"
        out.append((name, opts))
    return out


# --------------------------------------------------------------------------------------------- 5
class OrtGraph:
    """A compiled graph: an ONNX Runtime session called through IOBinding on torch memory."""

    def __init__(
        self,
        ir: GraphIR,
        session: ort.InferenceSession,
        device: torch.device,
        *,
        folder: Path,
        cache_hit: bool,
        export_seconds: float,
    ) -> None:
        self.session = session
        self.providers = session.get_providers()
        self.folder, self.cache_hit, self.export_seconds = folder, cache_hit, export_seconds
        self.device = device
        self._tensor_args = None if ir.is_static else tensor_inputs(ir)  # a symbolic graph's ints stay here
        self._inputs = _check_io("input", session.get_inputs(), [ir.input_specs[i] for i in tensor_inputs(ir)])
        positions = tensor_outputs(ir)
        self._outputs = _check_io("output", session.get_outputs(), [ir.output_specs[i] for i in positions])
        self._slots: list[int | None] = [None] * len(ir.outputs)  # graph output -> index among tensor outputs
        # a value returned twice is bound once and returned twice (as eager returns the same tensor)
        self._first: list[int] = []
        names: dict[str, int] = {}
        for i, (name, _, _) in enumerate(self._outputs):
            self._first.append(names.setdefault(name, i))
        for k, position in enumerate(positions):
            self._slots[position] = self._first[k]
        self._first_of_each = sorted(set(self._first))
        self._c = _c_binding(session)
        # the CUDA stream the session runs on (torch's current stream when it was created)
        cuda_opts = dict(session.get_provider_options()).get(CUDA, {})
        self._stream = int(cuda_opts.get("user_compute_stream", 0) or 0) if device.type == "cuda" else None
        self._sizes = None if ir.is_static else _size_sources(ir)
        self._size_outputs = extend.size_outputs(ir)  # position -> expression of the call's sizes
        # the hot path of a static graph on the CPU, everything but the tensors worked out here: the output
        # shapes, what to bind them as (``_call_numpy``, ``_call_bound``); None where the general path is needed
        self._static: list[tuple[str, type, tuple[int, ...], torch.dtype, int]] | None = None
        if self._tensor_args is None and self._stream is None and self._c is not None:
            shapes = [tuple(int(d) for d in spec.shape) for _, _, spec in self._outputs]
            if all(math.prod(shape) for shape in shapes):  # an empty output has no memory to bind
                self._static = [
                    (name, np_type, shapes[k], spec.dtype, k)
                    for k, (name, np_type, spec) in enumerate(self._outputs)
                    if k in self._first_of_each
                ]
                self._static_names = [name for name, *_ in self._static]
        # chosen once: an inference graph takes ONNX Runtime's own output memory (_call_numpy says why); the
        # class's function, not a bound method, which would keep this graph (and its session) alive in a cycle
        self._call_static = OrtGraph._call_numpy if ir.phase == "inference" else OrtGraph._call_bound

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor | None]:  # a backward graph's outputs hold None
        if self._static is not None and len(args) == len(self._inputs):
            try:
                return self._call_static(self, args)
            except TypeError:  # this onnxruntime's C-level binding takes other arguments: the general path
                self._static = self._c = None
        if self._tensor_args is None:
            outs = [torch.empty(spec.shape, dtype=spec.dtype, device=self.device) for _, _, spec in self._outputs]  # type: ignore[arg-type]  # static: every dim an int
        else:  # dynamic axes: each output's sizes from this call's input sizes
            assert self._sizes is not None  # a symbolic graph always has its size sources
            values = {
                name: int(args[i]) if d is None else int(args[i].shape[d]) for name, (i, d) in self._sizes.items()
            }
            outs = [
                torch.empty([_size(x, values) for x in spec.shape], dtype=spec.dtype, device=self.device)
                for _, _, spec in self._outputs
            ]
            args = tuple(args[i] for i in self._tensor_args)
            if self._size_outputs:
                self.run_into(args, outs)
                # sizes returned for the backward graph are ints among the tensors
                mixed: list[Any] = [
                    _size(self._size_outputs[k], values) if k in self._size_outputs else None if j is None else outs[j]
                    for k, j in enumerate(self._slots)
                ]
                return mixed
        self.run_into(args, outs)
        return [None if j is None else outs[j] for j in self._slots]

    def run_into(self, args: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """Run with ``outs`` bound as the outputs; returns ``outs``.

        ``outs`` holds one contiguous tensor per tensor output of the graph (None outputs left out), of
        the output specs' shapes and dtypes."""
        if len(args) != len(self._inputs) or len(outs) != len(self._outputs):
            raise ValueError(
                f"the graph takes {len(self._inputs)} inputs and {len(self._outputs)} outputs, "
                f"got {len(args)} and {len(outs)}"
            )
        if not self._unique(outs):  # every output is empty: nothing to compute
            return outs
        if self._stream is not None and torch.cuda.current_stream(self.device).cuda_stream != self._stream:
            torch.cuda.current_stream(self.device).synchronize()  # inputs written on another stream are ready
        if self._c is not None:
            try:
                return self._run_c(args, outs)
            except TypeError:  # this onnxruntime's C-level binding takes other arguments: use the public one
                self._c = None
        binding = self.session.io_binding()
        keep = []  # contiguous copies must live until the run is over
        for (name, np_type, _), t in zip(self._inputs, args):
            if not t.is_contiguous():
                t = t.contiguous()
                keep.append(t)
            binding.bind_input(name, t.device.type, t.device.index or 0, np_type, tuple(t.shape), _ptr(t))
        for name, np_type, o in self._unique(outs):
            binding.bind_output(name, o.device.type, o.device.index or 0, np_type, tuple(o.shape), o.data_ptr())
        self.session.run_with_iobinding(binding)
        del keep
        return outs

    def _run_c(self, args: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """The same binding through ONNX Runtime's C-level objects, which the public wrapper calls after
        per-call bookkeeping (WebGPU graph capture, device lookup by name) that costs ~30 us."""
        c_session, new_binding, devices = self._c
        binding = new_binding(c_session)
        keep = []
        for (name, np_type, _), t in zip(self._inputs, args):
            if not t.is_contiguous():
                t = t.contiguous()
                keep.append(t)
            binding.bind_input(name, devices(t.device), np_type, tuple(t.shape), _ptr(t))
        for name, np_type, o in self._unique(outs):
            binding.bind_output(name, devices(o.device), np_type, tuple(o.shape), o.data_ptr())
        c_session.run_with_iobinding(binding, None)
        del keep
        return outs

    def _call_numpy(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        """``__call__`` of a static CPU inference graph: the inputs fed as NumPy views of the tensors'
        memory and the outputs taken as ONNX Runtime allocates them (``torch.from_numpy``, no copy),
        through the C-level session. IOBinding cost more than it saves here: 157 us a call against 142 on
        the zoo MLP at batch 1, 330 against 313 on ViT (best of 40 interleaved rounds, one thread).

        Only for inference graphs: an output's storage belongs to NumPy and cannot be resized, and a
        training graph's outputs can reach code that resizes them (FSDP frees an unsharded parameter with
        ``storage.resize_(0)``); those graphs take :meth:`_call_bound`."""
        feed = {}
        for (name, _, _), t in zip(self._inputs, args):
            if t.requires_grad:  # a forward graph's input under autograd: the same memory, no graph
                t = t.detach()
            feed[name] = (t if t.is_contiguous() else t.contiguous()).numpy()
        arrays = self._c[0].run(self._static_names, feed, None)  # _c is set where _static is
        outs: list[Any] = [None] * len(self._outputs)  # a value returned twice is taken once (see __init__)
        for (_, _, _, _, k), a in zip(self._static, arrays):  # type: ignore[arg-type]  # checked by the caller
            outs[k] = torch.from_numpy(a)
        return [None if j is None else outs[j] for j in self._slots]

    def _call_bound(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        """``__call__`` of a static CPU graph that is not an inference graph: ``run_into``'s work with
        nothing left to decide per call (~4 us less on a small graph, where the whole call is ~14 us)."""
        c_session, new_binding, devices = self._c
        binding = new_binding(c_session)
        keep = []  # contiguous copies must live until the run is over
        for (name, np_type, _), t in zip(self._inputs, args):
            if not t.is_contiguous():
                t = t.contiguous()
                keep.append(t)
            binding.bind_input(name, devices(t.device), np_type, tuple(t.shape), _ptr(t))
        device = self.device
        where = devices(device)
        outs: list[Any] = [None] * len(self._outputs)  # a value returned twice is bound once (see __init__)
        for name, np_type, shape, dtype, k in self._static:  # type: ignore[union-attr]  # checked by the caller
            o = outs[k] = torch.empty(shape, dtype=dtype, device=device)
            binding.bind_output(name, where, np_type, shape, o.data_ptr())
        c_session.run_with_iobinding(binding, None)
        del keep
        return [None if j is None else outs[j] for j in self._slots]

    def _unique(self, outs: Sequence[torch.Tensor]) -> list[tuple[str, type, torch.Tensor]]:
        # an empty output has no memory to bind (its data pointer is 0); there is nothing to write either
        return [(self._outputs[i][0], self._outputs[i][1], outs[i]) for i in self._first_of_each if outs[i].numel()]


_DUMMY: dict[torch.device, torch.Tensor] = {}


def _ptr(t: torch.Tensor) -> int:
    """The tensor's data pointer; for an empty tensor (pointer 0, which IOBinding refuses) a valid one."""
    if t.numel():
        return t.data_ptr()
    if t.device not in _DUMMY:
        _DUMMY[t.device] = torch.zeros(8, dtype=torch.float64, device=t.device)
    return _DUMMY[t.device].data_ptr()


def _c_binding(session: ort.InferenceSession) -> Any:
    """(C session, C IOBinding class, device lookup) where this onnxruntime has them, else None."""
    try:
        from onnxruntime.capi import _pybind_state as C

        c_session, new_binding = session._sess, C.SessionIOBinding
        cache: dict[torch.device, Any] = {}

        def devices(d: torch.device) -> Any:
            if d not in cache:
                cache[d] = ort.OrtDevice.make(d.type, d.index or 0)._get_c_device()
            return cache[d]

        devices(torch.device("cpu"))
        return c_session, new_binding, devices
    except Exception:  # a layout we do not know: the public API works everywhere
        return None


def _check_io(kind: str, args: Sequence[Any], specs: Sequence[TensorSpec | None]) -> list[tuple[str, type, TensorSpec]]:
    """Pair the session's inputs/outputs with the graph's specs; raise if any type or shape disagrees
    (binding memory of the wrong size or type would read or write garbage)."""
    if len(args) != len(specs):
        raise RuntimeError(f"the ONNX model has {len(args)} {kind}s; the graph has {len(specs)}")
    out = []
    for i, (arg, spec) in enumerate(zip(args, specs)):
        if spec is None:
            raise NotImplementedError(f"graph {kind} {i} is not a tensor")
        if spec.dtype not in _TYPES:
            raise NotImplementedError(f"graph {kind} {i} has dtype {spec.dtype}, which IOBinding cannot describe")
        np_type, ort_type = _TYPES[spec.dtype]
        shape = [d if isinstance(d, int) else None for d in arg.shape]
        if (
            arg.type != ort_type
            or (len(shape) != len(spec.shape))
            or any(d is not None and isinstance(s, int) and d != s for d, s in zip(shape, spec.shape))
        ):
            raise RuntimeError(
                f"the ONNX model's {kind} {i} ({arg.name}) is {arg.type}{arg.shape}; the graph says "
                f"{spec.short()}: the export changed the program"
            )
        out.append((arg.name, np_type, spec))
    return out


def _size_sources(ir: GraphIR) -> dict[str, tuple[int, int | None]]:
    """Where each symbol's value is in a call's arguments: (input position, dimension), or (position,
    None) for an integer input."""
    out: dict[str, tuple[int, int | None]] = {}
    for i, node in enumerate(ir.placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and getattr(val.node.expr, "is_Symbol", False):
            out.setdefault(str(val.node.expr), (i, None))
        elif isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and getattr(size.node.expr, "is_Symbol", False):
                    out.setdefault(str(size.node.expr), (i, d))
    return out


def _size(dim: int | str, values: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    if dim in values:
        return values[dim]
    import sympy  # an expression of the symbols (2*s0, s0 + s1): rare; evaluate it

    return int(sympy.sympify(dim).subs(values))


def compile_graph(request: extend.CompileRequest) -> OrtGraph:
    ir = request.ir
    providers = _provider_list(request)
    device = _device(request.example_inputs)
    folder = _cache_dir(ir, providers, request.program is not None)
    try:
        return _open(request, ir, providers, device, folder)
    except Exception as e:
        if not _damaged(e):
            raise
        # a truncated or altered model in the cache: set it aside and rebuild once, instead of failing
        # (and warning) in every later process
        for name in ("model.onnx", "model.opt.onnx"):
            with contextlib.suppress(OSError):
                os.replace(folder / name, folder / f"{name}.bad")
        _log.warning("onnxruntime: cached model in %s is damaged (%s); set aside as *.bad and rebuilt", folder, e)
        return _open(request, ir, providers, device, folder)


def _cached(path: Path) -> bool:
    """Whether a model file may be loaded from the cache: there, and what this user's torchmux stored (its
    ``.hmac`` digest beside it matches, ``extend.authentic``), whatever ``verify`` says: a model swapped
    for another valid one of the same signature would otherwise run unchecked under ``verify=False``. One
    the fleet's cache sent (checked against the digest the fleet stored) is signed here as it arrives. A
    file that fails is set aside as ``<name>.untrusted`` and rebuilt, with a logged warning (as TVM's)."""
    local = path.exists()
    if not fetch_artifact(path):
        return False
    if not local:
        _sign(path)
    if extend.authentic(path):
        return True
    _log.warning(
        "onnxruntime: cached model %s does not match the digest beside it; set aside as .untrusted, rebuilt", path
    )
    with contextlib.suppress(OSError):
        os.replace(path, path.with_name(path.name + ".untrusted"))
    return False


def _sign(path: Path) -> None:
    with contextlib.suppress(OSError):  # a read-only cache: the next process rebuilds instead of trusting
        extend.sign(path)


def _damaged(e: BaseException) -> bool:
    """Whether ONNX Runtime refused a model file as unreadable (not a graph or provider it cannot run)."""
    return type(e).__name__ in ("InvalidProtobuf", "NoSuchFile") or "protobuf" in str(e).lower()


def _open(
    request: extend.CompileRequest,
    ir: GraphIR,
    providers: list[tuple[str, dict[str, Any]]],
    device: torch.device,
    folder: Path,
) -> OrtGraph:
    folder.mkdir(parents=True, exist_ok=True)
    exported, optimized = folder / "model.onnx", folder / "model.opt.onnx"
    have_exported, have_optimized = _cached(exported), _cached(optimized)  # local and signed, else the fleet's
    cache_hit = have_optimized or (have_exported and any(n == TENSORRT for n, _ in providers))
    t0 = time.perf_counter()
    if not have_exported:
        model_bytes = (
            export_onnx(ir, request.example_inputs) if request.program is None else export_program_onnx(request.program)
        )
        atomic_write(exported, model_bytes)
        _sign(exported)
        publish_artifact(exported)
    export_seconds = time.perf_counter() - t0 if not cache_hit else 0.0
    model = optimized if have_optimized else _optimized_model(folder, providers)
    if not have_optimized and model == optimized:
        publish_artifact(optimized)
    so = _session_options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, request.options)
    session = _shared_session(model, so, _with_engine_cache(providers, folder))
    _check_providers(session, providers)
    return OrtGraph(ir, session, device, folder=folder, cache_hit=cache_hit, export_seconds=export_seconds)


# --------------------------------------------------------------------------------------------- 5
# Packages (torchmux.export): what a compiled program saves, and the session a package loads. The
# loaded call is ONNX Runtime's own ``run`` on NumPy views of the inputs, as a user of ONNX Runtime
# calls it: nothing between the package's input check and the session.
def save_graph(graph: OrtGraph, program: Any = None) -> extend.SavedGraph:
    """The exported model (portable: ONNX Runtime's hardware-specific passes run again at load), each
    initializer that is one of ``program``'s weights stored by reference: the package holds it once.

    Beside it, on the CPU provider, the model after ONNX Runtime's extended optimizations (the one the
    compiled session ran, ``model.opt.onnx``): what ONNX Runtime's docs call offline optimization, saved so
    that a load does not run those passes again (tiny BERT's session: ~26 -> ~15 ms in a fresh process). It holds contrib
    ops of this ONNX Runtime and initializers its fusions derived from weights (stored in it), so a load
    opens it only under the same ONNX Runtime version, and only where it stays small: weights fused into
    new initializers (a BERT's attention) would store them twice, and then only the portable model is
    kept. ``layout``: whether it has ops the hardware-specific layout passes rewrite (convolutions,
    pooling, resizes); a load runs ONNX Runtime's full optimization level on those, and none on the rest."""
    weights = {**program.state_dict, **program.constants} if program is not None else {}
    data = (graph.folder / "model.onnx").read_bytes()
    refs: dict[str, str] = {}
    if weights:
        data, refs = weights_by_reference(data, weights)
    files, meta = (
        {"model.onnx": data},
        {"providers": list(graph.providers), "onnxruntime": ort.__version__, "weights": refs},
    )
    optimized = graph.folder / "model.opt.onnx"
    if list(graph.providers) == [CPU] and optimized.exists():
        transposed: dict[str, str] = {}
        opt, opt_refs = weights_by_reference(optimized.read_bytes(), weights, transposed)
        if len(opt) <= 2 * len(data) + OPTIMIZED_EXTRA_BYTES:
            files["model.opt.onnx"] = opt
            meta["optimized"] = {"weights": opt_refs, "transposed": transposed, "layout": _has_layout_ops(opt)}
    return extend.SavedGraph(files, meta)


#: what a package's optimized model may add to the portable one's bytes (initializers its fusions derived)
OPTIMIZED_EXTRA_BYTES = 1 << 20


def _has_layout_ops(data: bytes) -> bool:
    """Whether ONNX Runtime's layout passes (level 3: NCHWc on the CPU, NHWC for quantized convolutions)
    could rewrite any node of the model ``data``: a convolution, a pooling, a resize or a batch norm."""
    import onnx

    kinds = {n.op_type for n in onnx.load_from_string(data).graph.node}
    return any("Conv" in k or "Pool" in k or k in ("Resize", "Upsample", "BatchNormalization") for k in kinds)


class PackagedSession:
    """A saved model's session, called with the program's flat CPU inputs; returns its flat outputs.

    The call is the C++ session's ``run`` (what ``InferenceSession.run`` ends in, as the compiled path's
    IOBinding uses ``session._sess``): ``InferenceSession.run`` first validates the feed's names, any
    OrtValue's session and WebGPU graph capture, and lists the output names, ~4-8 us a call at batch 1
    that the package's input check (api/load.py) has made redundant: the feed is built here from the
    session's own input names, holds NumPy arrays only, and the CPU provider captures nothing. Where an
    ONNX Runtime lays the session out otherwise, the public ``run``."""

    def __init__(self, session: ort.InferenceSession, weights: Sequence[Any] = ()) -> None:
        self.session = session
        self._weights = weights  # the arrays the session reads its referenced initializers from (no copy)
        self._names = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        c_session = getattr(session, "_sess", None)
        if c_session is not None and callable(getattr(c_session, "run", None)):
            self._run = functools.partial(c_session.run, outputs)
        else:
            self._run = functools.partial(session.run, None)

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        outs = self._run({n: a.detach().numpy() for n, a in zip(self._names, args)}, None)
        return [torch.from_numpy(o) for o in outs]


def load_graph(request: extend.LoadRequest) -> PackagedSession:
    if request.device != "cpu":
        raise NotImplementedError(
            "a packaged ONNX model runs on the CPU provider here; CUDA tensors need onnxruntime-gpu's IOBinding path"
        )
    meta = request.saved.meta
    # the model ONNX Runtime optimized at export (save_graph), under the ONNX Runtime that wrote it; else
    # the portable one, optimized here
    optimized = meta.get("optimized") if meta.get("onnxruntime") == ort.__version__ else None
    transposed: dict[str, str] = {}
    if optimized is not None and "model.opt.onnx" in request.saved.files:
        data, refs = request.saved.files["model.opt.onnx"], optimized.get("weights") or {}
        transposed = optimized.get("transposed") or {}
        level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if optimized.get("layout", True)
            else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
    else:
        data, refs = request.saved.files["model.onnx"], meta.get("weights") or {}
        level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # a package's session is the only one of its model in the process: its own arena, as a user of ONNX
    # Runtime gets (the process-wide one compile() shares across its sessions measured ~10% slower here on
    # tiny BERT's many small allocations)
    so = _session_options(level, {**request.options, "intra_op_num_threads": request.threads}, shared_arena=False)
    values: list[Any] = []
    if refs or transposed:
        arrays = request.weights()
        missing = sorted(w for w in (*refs.values(), *transposed.values()) if w not in arrays)
        if missing:
            raise ValueError(f"the model refers to program weights the package lacks: {missing[:5]}")
        # np.require, not np.ascontiguousarray: that one makes a 0-d array 1-d, and ONNX Runtime refuses a
        # scalar initializer (a batch norm's num_batches_tracked) replaced by a tensor of shape [1]
        held = [np.require(arrays[w], requirements="C") for w in refs.values()]
        held += [np.ascontiguousarray(arrays[w].T) for w in transposed.values()]  # a copy each, made here
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in held]  # each keeps its array alive
        so.add_external_initializers([*refs, *transposed], values)
    return PackagedSession(ort.InferenceSession(data, sess_options=so, providers=[CPU]), values)
