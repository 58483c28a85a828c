"""The TVM backend's work: one normalized graph in, one Relax VM function out.

:func:`compile_graph` runs these steps, in order:

1. *Key.* ``ir.fingerprint()`` + the TVM target (JSON form) + TVM's version + the tuning options name
   one artifact under ``TORCHMUX_CACHE_DIR/tvm/lib``. A hit loads the ``.so`` and skips steps 2-4.
2. *Import.* The ATen graph is wrapped in an ``nn.Module``, ``torch.export``-ed with every placeholder
   (weights included) as a user input, and read by ``tvm.relax.frontend.torch.from_exported_program``.
   (``from_fx`` does not know ATen overloads such as ``aten.mm.default``; the export route does.)
   ``FuseTransposeMatmul`` then makes ``x @ w.T`` (every ``nn.Linear``) one kernel that reads ``w`` as
   it is, instead of a transpose copy and a matmul that walks it across rows (5x faster untuned).
3. *Build.* ``tvm.compile`` with TVM's default pipeline: LLVM on the CPU (no BLAS: matmuls stay
   unscheduled loops), dlight GPU schedules for CUDA. In ``mode="max-autotune"`` MetaSchedule first
   tunes the graph's fused kernels (:mod:`tuning below <compile_graph>`), then the graph is built with
   the best schedules found.
4. *Store.* ``export_library`` writes the ``.so``; a JSON file beside it holds the metadata. Both are
   written to temporary names and renamed, so a reader never sees half an artifact.
5. *Run.* The Relax VM's ``main`` is called with the inputs as TVM tensors made by DLPack (no copy,
   no NumPy), and its outputs become torch tensors by DLPack again.

Weights the graph takes as placeholders are arguments: the artifact depends only on the graph's
structure and specs (what the fingerprint covers), so one cached library serves every set of weights.
A frozen inference graph (autotune/freeze.py) holds its weights as ``get_attr`` buffers instead;
``torch.export`` lifts them and ``from_exported_program`` binds them as Relax constants (the library
then holds the weights, and the frozen graph's fingerprint covers their values).

Tuning (``mode="max-autotune"``) is in tuning.py.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import tvm
from tvm import relax

from torchmux import extend
from torchmux.extend import artifact_dir, atomic_write, fetch_artifact, publish_artifact

from . import OPTIONS

FORMAT = 4  # bump when the artifact layout or the import route changes: old artifacts are then ignored

DEFAULTS: dict[str, Any] = {name: option.default for name, option in OPTIONS.items()}
TUNING_OPTIONS = ("tune_seconds", "tune_trials", "tune_trials_per_task", "trials_per_round")
_log = logging.getLogger("torchmux.tvm")


@dataclass
class BuildInfo:
    """What happened when a graph was compiled; the compiled callable carries it as ``.tvm_info``."""

    key: str
    target: str
    cache: str  # "hit", "miss" (built and stored), "off" or "unwritable"
    tuned: bool = False
    tasks: int = 0  # kernels MetaSchedule saw
    tasks_tuned: int = 0  # kernels tuned in this call
    tasks_reused: int = 0  # kernels whose records were already in the database
    trials: int = 0  # trials measured in this call
    tune_seconds: float = 0.0
    build_seconds: float = 0.0
    library: str = ""


# ------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------


def compile_graph(request: extend.CompileRequest) -> extend.CompiledGraph:
    ir, opts = request.ir, _options(request.options)
    device = _device_of(request.example_inputs)
    target = target_for(device, opts["target"])
    tuned = request.mode in ("max-autotune", "max-autotune-no-cudagraphs")
    key = artifact_key(ir.fingerprint(), target, {k: opts[k] for k in TUNING_OPTIONS} if tuned else None)
    info = BuildInfo(key=key, target=str(target), cache="off", tuned=tuned)
    lib_dir = cache_root() / "lib"

    executable = _load(lib_dir, key) if opts["cache"] else None
    if executable is not None:
        info.cache = "hit"
        info.library = str(lib_dir / f"{key}.so")
    else:
        t0 = time.perf_counter()
        mod = to_relax(ir, request.example_inputs)
        try:
            mod = relax.transform.FuseTransposeMatmul()(mod)
        except Exception:  # noqa: BLE001 - leave it unfused (the pass is an optimization, mod is unchanged):
            # a symbolic operand without a shape expression, or (apache-tvm 0.27) a fused x @ w.T whose
            # function returns a tuple, as in a training forward graph that also returns w.T for the
            # backward ("'TupleType' object has no attribute 'dtype'"; torchmux.testing's model check)
            pass
        if tuned:
            from .tuning import build_tuned

            executable = build_tuned(mod, target, device, opts, info)
        else:
            executable = tvm.compile(mod, target=target)
        info.build_seconds = time.perf_counter() - t0
        if opts["cache"]:
            info.cache = _store(lib_dir, key, executable, ir, info)
    positions = None if ir.is_static else extend.tensor_inputs(ir)  # symbolic: Relax reads sizes from tensors
    return _runner(executable, device, info, len(ir.outputs), positions)


def _options(given: Any) -> dict[str, Any]:
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown tvm option(s) {unknown}; the tvm backend accepts "
            + ", ".join(f"{k} (default {v!r})" for k, v in DEFAULTS.items())
        )
    return {**DEFAULTS, **given}


def _device_of(inputs: Sequence[Any]) -> torch.device:
    devices = {t.device for t in inputs if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"tvm runs a graph on one device; its inputs are on {sorted(map(str, devices))}")
    bad = [type(t).__name__ for t in inputs if not isinstance(t, (torch.Tensor, int))]
    if bad:  # an integer is a symbolic graph's size, read from the tensors' shapes
        raise ValueError(f"tvm takes tensors (and a symbolic graph's sizes) only; this graph also takes {bad}")
    return devices.pop() if devices else torch.device("cpu")


# ------------------------------------------------------------------------------------------------
# targets and keys
# ------------------------------------------------------------------------------------------------


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def target_for(device: torch.device, override: Any = None) -> tvm.target.Target:
    """The host CPU (its LLVM cpu name and core count), or the GPU's CUDA arch with the CPU as host."""
    if override:
        return tvm.target.Target(override)
    cpu: dict[str, Any] = {"kind": "llvm", "num-cores": host_cores()}
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    if mcpu and mcpu != "generic":
        cpu["mcpu"] = mcpu
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}"}, host=cpu)
    return tvm.target.Target(cpu)


def artifact_key(fingerprint: str, target: tvm.target.Target, tuning: dict[str, Any] | None) -> str:
    parts = [
        f"format={FORMAT}",
        fingerprint,
        str(target),
        f"tvm={tvm.__version__}",
        f"tuning={json.dumps(tuning, sort_keys=True)}",
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def cache_root() -> Path:
    return artifact_dir("tvm")


# ------------------------------------------------------------------------------------------------
# import: ATen graph -> Relax
# ------------------------------------------------------------------------------------------------


class _AtenProgram(torch.nn.Module):
    """The normalized graph as a module whose every input (weights too) is a user input."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__()
        self.gm = gm

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.gm(*args))


def to_relax(ir: extend.GraphIR, example_inputs: Sequence[torch.Tensor]) -> tvm.IRModule:
    from tvm.relax.frontend.torch import from_exported_program

    args = tuple(t.detach().contiguous() if isinstance(t, torch.Tensor) else t for t in example_inputs)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's and TVM's deprecation notices
        # a symbolic graph keeps its symbols (torch.export Dims): Relax gets symbolic shapes, one build serves every size
        program = extend.export_program(ir, args, wrap=lambda gm: _AtenProgram(_without_empty_cat_inputs(gm)))
        return from_exported_program(program, custom_convert_map=_EXTRA_CONVERTERS)


def _without_empty_cat_inputs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``aten.cat`` skips 1-D empty tensors whatever the other inputs' rank (a legacy rule that an empty
    KV cache relies on, in GPT-2); TVM's concat refuses mixed ranks. A copy of ``gm`` without them."""

    def legacy_empty(a: Any) -> bool:
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        return isinstance(val, torch.Tensor) and val.dim() == 1 and val.numel() == 0

    cats = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target is torch.ops.aten.cat.default
        and any(legacy_empty(a) for a in n.args[0])
        and not all(legacy_empty(a) for a in n.args[0])
    ]
    if not cats:
        return gm
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.cat.default:
            kept = [a for a in node.args[0] if not legacy_empty(a)]
            if kept and len(kept) < len(node.args[0]):
                node.args = (kept, *node.args[1:])
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _reduction(op_name: str) -> Any:
    """A converter for a Core ATen reduction TVM's frontend lacks: ``op(x, dims=[], keepdim=False)``."""

    def convert(node: torch.fx.Node, importer: Any) -> relax.Var:
        args = importer.retrieve_args(node)
        x = args[0]
        dims = args[1] if len(args) > 1 else node.kwargs.get("dim", None)
        if isinstance(dims, int):
            dims = [dims]
        if isinstance(dims, (list, tuple)) and len(dims) == 0:
            dims = None  # an empty list means every dimension
        keepdim = bool(args[2] if len(args) > 2 else node.kwargs.get("keepdim", False))
        return importer.block_builder.emit(getattr(relax.op, op_name)(x, dims, keepdim))

    return convert


def _slice_in_bounds(node: torch.fx.Node, importer: Any) -> relax.Var:
    """``aten.slice.Tensor`` as TVM's own converter reads it, except where torch proved the slice in
    bounds (its output's size along ``dim`` is ``end - start``): Relax is told so (``assume_inbound``).
    Otherwise Relax sizes ``x[:, :s]`` of a ``[1, 128]`` tensor as ``min(s, 128)``, which it cannot
    prove equal to ``s``: a BERT's ``position_ids[:, :seq]`` embedding added to the token embedding
    then has no known shape, and the add is left unlowered (``CodeGenVM cannot emit ... R.add``)."""
    args: list[Any] = list(node.args) + [None] * 5
    dim, start, end, step = args[1] or 0, args[2] or 0, args[3], 1 if args[4] is None else args[4]
    val = node.meta.get("val")
    known: list[Any] = [v.meta.get("val") if isinstance(v, torch.fx.Node) else v for v in (start, end)]
    if isinstance(val, torch.Tensor) and step == 1 and all(isinstance(v, (int, torch.SymInt)) for v in known):
        size, want = val.shape[dim], known[1] - known[0]
        same = (
            size.node.expr == want.node.expr
            if isinstance(size, torch.SymInt) and isinstance(want, torch.SymInt)
            else isinstance(size, int) and isinstance(want, int) and size == want
        )
        if same:
            bounds = [importer.env[v] if isinstance(v, torch.fx.Node) else v for v in (start, end)]
            x = importer.env[node.args[0]]
            return importer.block_builder.emit(
                relax.op.strided_slice(x, [dim], [bounds[0]], [bounds[1]], [1], assume_inbound=True)
            )
    return importer._slice(node)


def _select_from_end(node: torch.fx.Node, importer: Any) -> relax.Var:
    """``aten.select.int`` with a negative index (``x[:, -1]``, an RNN's last step) counted from the end.
    TVM's converter hands the index to ``take`` as it is, in its "fast" mode, which checks no bounds: -1
    read memory before the tensor (a BiRNN answered 2.8e22). A static size makes the index positive;
    a symbolic one is taken in "wrap" mode."""
    x, dim, index = importer.env[node.args[0]], int(node.args[1]), int(node.args[2])  # type: ignore[arg-type]
    if index >= 0:
        return importer._select(node)
    val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    size = val.shape[dim] if isinstance(val, torch.Tensor) else None
    if isinstance(size, int):
        return importer.block_builder.emit(relax.op.take(x, relax.const(index + size, "int64"), dim))
    return importer.block_builder.emit(relax.op.take(x, relax.const(index, "int64"), dim, mode="wrap"))


def _index_from_end(node: torch.fx.Node, importer: Any) -> relax.Var:
    """``aten.index.Tensor`` whose integer indices may count from the end (``x[:, idx]`` with -1 in
    ``idx``): TVM's converter takes them unchecked, as :func:`_select_from_end` says. Each integer index
    of an axis of static size is made positive first (``where(i < 0, i + size, i)``, per axis: one index
    tensor may serve two axes of different sizes), then TVM's own converter runs on those arguments; an
    axis of symbolic size keeps TVM's reading."""
    val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    indices = node.args[1] if isinstance(node.args[1], (list, tuple)) else ()
    args = importer.retrieve_args(node)
    given = list(args[1])
    for axis, index in enumerate(indices):
        index_val = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
        size = val.shape[axis] if isinstance(val, torch.Tensor) and axis < val.dim() else None
        if not isinstance(index_val, torch.Tensor) or index_val.dtype not in (torch.int32, torch.int64):
            continue
        if not isinstance(size, int):
            continue
        dtype = str(index_val.dtype).removeprefix("torch.")
        i, zero, size_c = given[axis], relax.const(0, dtype), relax.const(size, dtype)
        given[axis] = importer.block_builder.emit(relax.op.where(relax.op.less(i, zero), relax.op.add(i, size_c), i))
    importer.retrieve_args = lambda _: [args[0], given, *args[2:]]  # TVM's converter reads these arguments
    try:
        return importer._index_tensor(node)
    finally:
        del importer.retrieve_args  # the class's own again


# ATen reductions missing from TVM 0.27's PyTorch frontend (prod only without a dtype argument), a
# slice that keeps the size torch proved, and a select or an index counted from the end
_EXTRA_CONVERTERS = {
    "slice.Tensor": _slice_in_bounds,
    "select.int": _select_from_end,
    "index.Tensor": _index_from_end,
    "amax.default": _reduction("max"),
    "amin.default": _reduction("min"),
    "prod.dim_int": _reduction("prod"),
}


# ------------------------------------------------------------------------------------------------
# the on-disk cache of built libraries
# ------------------------------------------------------------------------------------------------


def _load(lib_dir: Path, key: str) -> Any | None:
    so, meta = lib_dir / f"{key}.so", lib_dir / f"{key}.json"
    # a shared library comes from the fleet only signed with its key (else it is rebuilt here)
    if not (fetch_artifact(meta) and fetch_artifact(so, executable=True)):
        return None
    try:
        if json.loads(meta.read_text()).get("format") != FORMAT:
            return None
        if not extend.authentic(so):  # planted or altered: never loaded (its constructors would run)
            _log.warning("tvm: cached library %s is not signed with this user's key; set aside and rebuilt", so)
            with contextlib.suppress(OSError):
                os.replace(so, so.with_name(so.name + ".untrusted"))
            return None
        return tvm.runtime.load_module(str(so))
    except Exception as e:  # a damaged artifact is rebuilt, never trusted
        _log.warning("tvm: ignoring cached library %s (%s); rebuilding", so, e)
        return None


def _store(lib_dir: Path, key: str, executable: Any, ir: extend.GraphIR, info: BuildInfo) -> str:
    try:
        lib_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib_dir)
        os.close(fd)
        executable.export_library(tmp)
        os.replace(tmp, lib_dir / f"{key}.so")
        extend.sign(lib_dir / f"{key}.so")
        info.library = str(lib_dir / f"{key}.so")
        meta = {
            "format": FORMAT,
            "graph": ir.name,
            "fingerprint": ir.fingerprint(),
            "tvm": tvm.__version__,
            "inputs": [s.short() if s else "?" for s in ir.input_specs],
            "outputs": [s.short() if s else "?" for s in ir.output_specs],
            "created": time.time(),
            **{k: v for k, v in asdict(info).items() if k not in ("cache", "library")},
        }
        atomic_write(lib_dir / f"{key}.json", json.dumps(meta, indent=1))
        publish_artifact(lib_dir / f"{key}.so", executable=True)
        publish_artifact(lib_dir / f"{key}.json")
        return "miss"
    except Exception as e:  # no C compiler, read-only disk...: run from memory, say why once
        with contextlib.suppress(Exception):
            os.unlink(tmp)
        _log.warning(
            "tvm: could not cache the library for %s under %s (%s: %s); it works from memory",
            ir.name,
            lib_dir,
            type(e).__name__,
            e,
        )
        return "unwritable"


# ------------------------------------------------------------------------------------------------
# packages (torchmux.export): the exported library, and a runner made from it
# ------------------------------------------------------------------------------------------------


def save_graph(run: Any) -> extend.SavedGraph | None:
    """The library ``export_library`` wrote (native: signed in the package), and how to call it."""
    info = getattr(run, "tvm_info", None)
    if info is None or not info.library:
        return None  # built in memory only (no cache): rebuilt at load
    meta = {"tvm": tvm.__version__, "target": info.target, "outputs": run.tvm_outputs, "key": info.key}
    if run.tvm_tensors is not None:  # symbolic: one library for the declared range, called with the tensors
        meta["tensors"] = list(run.tvm_tensors)
    return extend.SavedGraph({"model.so": Path(info.library).read_bytes()}, meta, native=True)


def load_graph(request: extend.LoadRequest) -> extend.CompiledGraph:
    """A package's library, written once to the cache under its digest and signed there (TVM loads from
    a path), then run as a compiled graph is."""
    data = request.saved.files["model.so"]
    digest = hashlib.sha256(data).hexdigest()[:32]
    so = cache_root() / "packaged" / f"{digest}.so"
    if not (so.exists() and extend.authentic(so)):
        atomic_write(so, data)
        extend.sign(so)
    meta = request.saved.meta
    device = torch.device(request.device)
    info = BuildInfo(key=str(meta.get("key", digest)), target=str(meta.get("target", "")), cache="package")
    info.library = str(so)
    tensors = meta.get("tensors")
    positions = [int(i) for i in tensors] if isinstance(tensors, list) else None
    return _runner(tvm.runtime.load_module(str(so)), device, info, int(meta["outputs"]), positions)


# ------------------------------------------------------------------------------------------------
# the hot path: Relax VM, tensors through DLPack
# ------------------------------------------------------------------------------------------------


def _compact(a: torch.Tensor) -> torch.Tensor:
    """``a`` as TVM takes it through DLPack: compact (``contiguous()`` is free for the usual input). An
    empty tensor gets the strides TVM computes for its shape (torch counts a size-0 dimension as 1 there,
    and TVM refuses the call: ``Mismatched args_0.strides``)."""
    if not a.numel():
        return torch.empty_strided(a.shape, _row_major(a.shape), dtype=a.dtype, device=a.device)
    return a if a.is_contiguous() else a.contiguous()


def _row_major(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _runner(
    executable: Any, device: torch.device, info: BuildInfo, n_outputs: int, tensors: list[int] | None = None
) -> extend.CompiledGraph:
    dev = tvm.cuda(device.index or 0) if device.type == "cuda" else tvm.cpu(0)
    main = relax.VirtualMachine(executable, dev)["main"]
    to_tvm, to_torch = tvm.runtime.from_dlpack, torch.from_dlpack
    lock = threading.Lock()  # one VM, one call at a time

    def run(*args: torch.Tensor) -> list[torch.Tensor]:
        if tensors is not None:  # a symbolic graph's integer inputs: the VM reads them from the tensors' shapes
            args = tuple(args[i] for i in tensors)
        tvm_args = [to_tvm(_compact(a)) for a in args]
        with lock:
            outs = main(*tvm_args)
        if len(outs) != n_outputs:
            raise RuntimeError(f"tvm returned {len(outs)} outputs, the graph has {n_outputs}")
        return [to_torch(o) for o in outs]

    run.tvm_info = info  # type: ignore[attr-defined]
    run.tvm_outputs = n_outputs  # type: ignore[attr-defined]
    run.tvm_tensors = tensors  # type: ignore[attr-defined]
    return run
