"""PyTorch's Inductor: hands the normalized ATen graph to ``torch._inductor.compile``.

Inductor runs AOTAutograd once more over the graph (a no-op on a graph that is already functional
Core ATen) and generates C++/OpenMP on the CPU (needs a C++ compiler) or Triton on a GPU.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence

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

    def compile(self, request: extend.CompileRequest) -> extend.CompiledGraph:
        config_patches: dict = {}
        if request.mode in ("max-autotune", "max-autotune-no-cudagraphs"):
            config_patches.update(max_autotune=True)
        if any(True for _ in request.ir.gm.buffers()) and not torch.is_grad_enabled():
            # a frozen graph (weights as buffers, torchmux's autotune/freeze.py): Inductor's freezing
            # folds them into the code as constants (pre-packed GEMM weights, folded batch norms)
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


def _compile_static(gm: torch.fx.GraphModule, example_inputs: list, config_patches: dict) -> object:
    """Inductor over a static graph, inside a tracing context whose fake mode has a shape environment,
    as under Dynamo: without one Inductor bypasses its FX graph cache ("No shape env"), so every
    process, and an isolated trial's parent after its child, would lower and generate the code again."""
    from torch._guards import TracingContext, tracing
    from torch._inductor import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if config_patches.get("freezing"):
        # no shape environment for a frozen graph: under one, AOTAutograd makes every size symbolic and
        # Inductor's freezing path picks oneDNN's size-generic linear over MKL's (5x slower a call on
        # small inputs); its FX graph cache skips graphs with frozen constants anyway
        return compile_fx.compile_fx(gm, example_inputs, config_patches=config_patches)
    with tracing(TracingContext(FakeTensorMode(shape_env=ShapeEnv()))):
        return compile_fx.compile_fx(gm, example_inputs, config_patches=config_patches)


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
