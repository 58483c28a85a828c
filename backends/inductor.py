"""PyTorch's Inductor: hands the normalized ATen graph to ``torch._inductor.compile``.

Inductor runs AOTAutograd once more over the graph (a no-op on a graph that is already functional
Core ATen) and generates C++/OpenMP on the CPU (needs a C++ compiler) or Triton on a GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from torchmux import extend


class InductorBackend(extend.Backend):
    name = "inductor"
    devices = ("cpu", "cuda")
    package = "torch"
    description = "torch._inductor: C++/OpenMP on the CPU, Triton on the GPU"
    dynamic_shapes = True
    # the conformance suite's NaN/inf variants (test_op_cpu_nonfinite): Inductor's inference batch norm
    # folds the statistics and turns a NaN input into a different NaN pattern than eager's
    nonfinite_unsafe = frozenset({"aten._native_batch_norm_legit_no_training.default"})
    contract_version = extend.CONTRACT_VERSION
    exports_programs = True  # torchmux.export: AOTInductor / torch.onnx.export of the whole program
    # free-form: every option is an Inductor config patch (a name in torch._inductor.config, such as
    # options={"inductor.epilogue_fusion": False}), passed to compile_fx unchecked; Inductor itself
    # refuses an unknown name when the graph compiles (a failed candidate, so eager runs it)
    options_schema = None

    def availability(self) -> extend.Availability:
        if not torch.cuda.is_available() and not (
            shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
        ):
            return extend.Availability.no(
                "no C++ compiler on PATH (Inductor's CPU code needs g++ or clang++); install one, or use a GPU"
            )
        return extend.Availability.yes()

    def supports(self, node: torch.fx.Node) -> bool:
        """Every op but ``while_loop``: Inductor lowers it only inside its own trace (the symbolic-shape
        state it needs is gone on a graph AOTAutograd already produced), so it runs eagerly between
        Inductor's regions."""
        return node.target is not getattr(torch.ops.higher_order, "while_loop", None) and super().supports(node)

    def save(self, compiled: extend.CompiledGraph, request: extend.CompileRequest) -> extend.SavedGraph | None:
        if not isinstance(compiled, AotiProgram):
            return None
        meta = {
            "torch": torch.__version__,
            "weights": sorted(compiled.weights),
            "own_weights": compiled.own_weights,
            "copy_inputs": compiled.copy_inputs,
        }
        return extend.SavedGraph({"model.pt2": compiled.path.read_bytes()}, meta, native=True)

    def load(self, request: extend.LoadRequest) -> extend.CompiledGraph:
        return _load_package(request)

    def prepare(self, device: str) -> None:
        """On the CPU, Inductor's first compile in a process probes which vector ISA the CPU runs: it
        builds a test kernel and loads it in a Python subprocess (~1 s here, paid by a warm start too,
        whose graph is in Inductor's cache). Probed here, that wait overlaps Dynamo's capture."""
        if device == "cpu":
            from torch._inductor import cpu_vec_isa

            cpu_vec_isa.pick_vec_isa()  # cached for the process

    def compile(self, request: extend.CompileRequest) -> extend.CompiledGraph:
        if request.program is not None:  # torchmux.export: AOTInductor's package, its deployable form
            return _compile_package(request)
        config_patches: dict = {}
        if request.mode in ("max-autotune", "max-autotune-no-cudagraphs"):
            config_patches.update(max_autotune=True)
        if any(True for _ in request.ir.gm.buffers()) and not torch.is_grad_enabled():
            # a frozen graph (weights as buffers, torchmux's autotune/freeze.py): Inductor's freezing
            # folds them into the code as constants (folded batch norms, transposed weights)
            config_patches.update(freezing=True)
        config_patches.update(request.options)
        gm = _views_as_reshapes(request.ir.gm)
        compiled: Callable[..., Sequence[torch.Tensor]]
        if request.ir.is_static:
            compiled = _compile_static(gm, list(request.example_inputs), config_patches)  # type: ignore[assignment]  # as below
        else:  # symbolic: compile for the graph's symbols (its fake values), not the first call's sizes
            compiled = _compile_symbolic(gm, request.ir, config_patches)  # type: ignore[assignment]  # as above
        # compile_fx wraps its result in torch._dynamo.disable (~4 us a call: two eval-frame switches).
        # The runner calls it from Dynamo's own disabled region or from a plain thread, never under an
        # active Dynamo callback, so the wrapper's switch does nothing there: call what it wraps
        if getattr(compiled, "_torchdynamo_disable", False):
            compiled = getattr(compiled, "_torchdynamo_orig_callable", compiled)
        return compiled  # AOTAutograd's forward: flat inputs, a list of outputs (no wrapper frame per call)


class AotiProgram:
    """An AOTInductor package (``aoti_compile_and_package``) loaded with ``aoti_load_package``, called
    with the program's flat inputs through the loader's own ``boxed_run`` (the loaded model's
    ``__call__`` parses its pytree specs from strings on every call; the package layer already holds
    them). ``path`` is the ``.pt2`` file; it holds the code only (``package_constants_in_so=False``):
    the weights are the program's, handed over by name (``load_constants(..., user_managed=True)``, no
    copy; a torchmux package stores them once, in the program). ``weights=None``: a library that holds
    its own (where Inductor named a constant of its own making, which no program holds)."""

    def __init__(
        self,
        path: Path,
        weights: Mapping[str, torch.Tensor] | None,
        copy_inputs: bool = False,
        single_threaded: bool = False,
    ) -> None:
        from torch._inductor import aoti_load_package

        self.path = path
        self.copy_inputs = copy_inputs  # the program writes in place: its library would write the caller's inputs
        self.own_weights = weights is None
        # single-threaded (to be recorded as a CUDA graph, LoadRequest.recorded): no model container's
        # event query before each run, which a stream capture forbids; the replay's lock serializes calls
        runner = aoti_load_package(str(path), run_single_threaded=single_threaded)
        names = [] if weights is None else list(runner.get_constant_fqns())
        missing = sorted(set(names) - set(weights or {}))
        if missing:
            raise ForeignConstants(f"the AOTInductor package needs weights the program does not hold: {missing[:5]}")
        self.weights = {k: weights[k] for k in names} if weights is not None else {}  # the library reads them in place
        if names:
            runner.load_constants(self.weights, check_full_update=True, user_managed=True)
        self._run = runner.loader.boxed_run

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        return self._run([a.clone() for a in args] if self.copy_inputs else list(args))


class ForeignConstants(ValueError):
    """The library wants a constant by a name no program weight has (Inductor made it while compiling)."""


def _compile_package(request: extend.CompileRequest) -> AotiProgram:
    """AOTInductor on the whole exported program (cached by the frozen graph's fingerprint, which names
    the weights' values): one shared library holding the code, the program's weights handed to it. Where
    the library asks for a constant the program does not hold under that name (a tensor the forward
    builds from NumPy and caches on the module: Inductor names it ``_tensor_constant0``), it is compiled
    again holding its weights itself: a bigger package, the same answers."""
    program = request.program
    weights = {k: v.detach() for k, v in {**program.state_dict, **program.constants}.items()}
    copy_inputs = extend.writes_in_place(program)
    try:
        return AotiProgram(_aoti_library(request, own_weights=False), weights, copy_inputs)
    except ForeignConstants:
        return AotiProgram(_aoti_library(request, own_weights=True), None, copy_inputs)


def _aoti_library(request: extend.CompileRequest, own_weights: bool) -> Path:
    folder = extend.artifact_dir("inductor", "aoti-code", request.ir.fingerprint()[:32])
    path = folder / ("model-with-weights.pt2" if own_weights else "model.pt2")
    with extend.building(folder):  # another process building the same library: wait, then load its build
        if not (path.exists() and extend.authentic(path)):  # a package planted in the cache is rebuilt, never loaded
            _build_library(request, path, own_weights)
    return path


def _build_library(request: extend.CompileRequest, path: Path, own_weights: bool) -> None:
    from torch._inductor import aoti_compile_and_package

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".model.{os.getpid()}.{threading.get_ident()}.pt2"
    patches = {"max_autotune": True} if request.mode in ("max-autotune", "max-autotune-no-cudagraphs") else {}
    patches["aot_inductor.package_constants_in_so"] = own_weights
    with torch.no_grad():
        aoti_compile_and_package(
            request.program, package_path=str(tmp), inductor_configs={**patches, **dict(request.options)}
        )
    os.replace(tmp, path)
    extend.sign(path)


def _load_package(request: extend.LoadRequest) -> AotiProgram:
    """A saved package's bytes, written once to the cache under their digest (AOTInductor loads from a
    path), signed there so a later load from the cache is trusted as this one is; its weights are the
    program's, read from the package (``request.weights()``), unless the library holds its own."""
    data = request.saved.files["model.pt2"]
    digest = hashlib.sha256(data).hexdigest()[:32]
    path = extend.artifact_dir("inductor", "aoti-loaded", digest) / "model.pt2"
    if not (path.exists() and extend.authentic(path)):
        extend.atomic_write(path, data)
        extend.sign(path)
    copy_inputs = bool(request.saved.meta.get("copy_inputs"))
    if request.saved.meta.get("own_weights"):
        return AotiProgram(path, None, copy_inputs, request.recorded)
    arrays = request.weights()
    names = request.saved.meta.get("weights") or []
    weights = {k: torch.from_numpy(arrays[k]).to(request.device) for k in names if k in arrays}
    return AotiProgram(path, weights, copy_inputs, request.recorded)


def _compile_static(gm: torch.fx.GraphModule, example_inputs: list, config_patches: dict) -> object:
    """Inductor over a static graph, inside a tracing context whose fake mode has a shape environment,
    as under Dynamo: without one Inductor bypasses its FX graph cache ("No shape env"), so every
    process, and an isolated trial's parent after its child, would lower and generate the code again.
    Frozen graphs too: a warm start finds them in that cache (tests/backends/test_inductor.py)."""
    from torch._guards import TracingContext, tracing
    from torch._inductor import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    if config_patches.get("freezing"):
        # the inputs as static fakes: given real tensors under a shape environment, AOTAutograd makes
        # every size symbolic, and Inductor's freezing path then picks oneDNN's size-generic linear
        # over MKL's (5x slower a call on small inputs). Inductor caches a frozen graph keyed by its
        # constants' specs, and binds this process's weights to the cached code when it loads it
        example_inputs = [
            fake_mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in example_inputs
        ]
    with tracing(TracingContext(fake_mode)), _packed_weights_cacheable():
        return compile_fx.compile_fx(gm, example_inputs, config_patches=config_patches)


@contextlib.contextmanager
def _packed_weights_cacheable() -> Iterator[None]:
    """Inductor's FX graph cache for frozen graphs with oneDNN-packed weights, while this compiles.

    Inductor caches a frozen graph without its folded constants: the entry keeps their names, keys
    them by their specs, and binds the constants the loading process folded from its own weights
    (``CompiledFxGraphConstantsWithGm``). It refuses the graph only because a packed weight is an
    mkldnn tensor, whose spec it cannot read ("mkldnn tensors unpickleable"); then every process
    lowers it again, and a warm start costs most of a cold one. Here such a tensor, when it is a frozen
    constant, is keyed by its dtype, shape and device, like any frozen constant. Without pre-packing
    the cache would work as it is, but the bench models run 1.6-2.3x slower a call (MLP, CNN, batch 8).
    Torch versions without these internals are left as they are (the graph is lowered again)."""
    _install_packed_weight_keys()
    _PACKED.on = True
    try:
        yield
    finally:
        _PACKED.on = False


_PACKED = threading.local()  # .on: this thread is compiling a frozen graph under _packed_weights_cacheable
_INSTALLED: list[bool] = []


def _install_packed_weight_keys() -> None:
    """Wrap Inductor's two cacheability checks of a tensor, once per process; the wrappers change
    nothing outside :func:`_packed_weights_cacheable` (a thread-local switch: no lock, so a compile
    abandoned past its deadline blocks no other)."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    from torch._inductor import codecache
    from torch._inductor.freezing_utils import is_frozen_param

    validator: Any = getattr(codecache, "CacheabilityValidator", None)
    pickler: Any = getattr(codecache, "FxGraphCachePickler", None)
    if not hasattr(validator, "check_tensor") or not hasattr(pickler, "_reduce_tensor"):
        return  # another torch: its cache decides alone
    check, reduce = validator.check_tensor, pickler._reduce_tensor

    def packed(t: torch.Tensor) -> bool:
        return getattr(_PACKED, "on", False) and t.is_mkldnn and is_frozen_param(t)

    def check_tensor(t: torch.Tensor) -> None:
        if not packed(t):
            check(t)

    def reduce_tensor(self: Any, t: torch.Tensor) -> Any:
        if packed(t):
            return (_same, (("mkldnn frozen constant", t.dtype, tuple(t.shape), t.device.type),))
        return reduce(self, t)

    validator.check_tensor, pickler._reduce_tensor = staticmethod(check_tensor), reduce_tensor


def _same(x: Any) -> Any:
    return x


def _compile_symbolic(gm: torch.fx.GraphModule, ir: extend.GraphIR, config_patches: dict) -> object:
    """Inductor over a symbolic graph: the placeholders' fake values (sizes ``s0``...) are the example
    inputs, under their own fake mode and shape environment, so one kernel serves every size."""
    from torch._guards import TracingContext, detect_fake_mode, tracing
    from torch._inductor import compile_fx

    fakes = [n.meta["val"] for n in ir.placeholders]
    fake_mode = detect_fake_mode(fakes)
    assert fake_mode is not None, "a symbolic graph's placeholders carry fake values"
    with tracing(TracingContext(fake_mode)), fake_mode:
        return compile_fx.compile_fx(gm, fakes, config_patches=config_patches)


def _views_as_reshapes(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` with ``view`` as ``reshape``. Inductor traces the graph again with its own
    decompositions, whose intermediate strides can differ from eager's; a ``view`` that was legal on
    eager's strides may then be illegal. ``reshape`` is the same op wherever ``view`` is legal."""
    import copy

    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # the weights are shared, not copied
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (
            torch.ops.aten.view.default,
            torch.ops.aten._unsafe_view.default,
        ):
            node.target = torch.ops.aten.reshape.default
    gm.recompile()
    return gm


@extend.hookimpl
def torchmux_add_backends() -> list[extend.Backend]:
    return [InductorBackend()]
