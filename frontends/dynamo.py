"""The capture frontend: TorchDynamo (PEP 523) finds the graphs, AOTAutograd normalizes them.

Pipeline for each graph Dynamo captures (between graphs Python runs as usual, as in torch.compile):

1. Dynamo hands us a torch-level ``fx.GraphModule`` plus example inputs; parameters and buffers
   arrive as inputs (Dynamo inlines ``nn.Module``s), so we record which input is which.
2. AOTAutograd functionalizes it and decomposes it to Core ATen (``core_aten_decompositions``);
   under autograd it splits forward and backward, and both come back to us.
3. Each resulting graph becomes a linted :class:`GraphIR`, and the plugins' ``torchmux_graph_captured``
   hook sees it.
4. A :class:`GraphRunner` stands in for it and chooses a backend on first call.

If any step fails the graph runs as Dynamo captured it (eagerly), with a warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from ..autotune.dispatch import GraphRunner, TorchmuxFallbackWarning
from ..core.config import CompileConfig, resolve
from ..core.ir import GraphIR
from ..core.registry import get_registry

@dataclass
class CapturedGraph:
    """What the frontend saw of one Dynamo graph (for explain)."""

    index: int
    dynamo_gm: fx.GraphModule
    break_reason: Any  # torch._dynamo GraphCompileReason, or None
    runners: list[GraphRunner] = field(default_factory=list)
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


class TorchmuxDynamoBackend:
    """A Dynamo backend (``torch.compile(m, backend=TorchmuxDynamoBackend(config))``)."""

    def __init__(self, config: CompileConfig, recorder: Recorder | None = None) -> None:
        self.config = config
        self.recorder = recorder
        self._count = 0

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any], **_: Any) -> Callable[..., Any]:
        from torch._decomp import core_aten_decompositions
        from torch._dynamo.backends.common import aot_autograd
        from functorch.compile import make_boxed_func

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
                    fx_gm, kinds if phase != "backward" and n_inputs == len(kinds) else None,
                    name=f"graph_{index}" + ("" if phase == "inference" else f"_{phase}"), phase=phase,
                ).lint()
                registry.notify("torchmux_graph_captured", ir=ir)
                runner = GraphRunner(ir, self.config)
                captured.runners.append(runner)
                return make_boxed_func(runner)

            return compile_graph

        try:
            return aot_autograd(
                fw_compiler=compiler("forward"),
                bw_compiler=compiler("backward"),
                inference_compiler=compiler("inference"),
                decompositions=core_aten_decompositions(),
            )(gm, example_inputs)
        except Exception as e:  # normalization failed: run Dynamo's graph as captured, and say so
            captured.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            warnings.warn(
                f"torchmux could not normalize graph_{index} ({captured.error}); it runs eagerly",
                TorchmuxFallbackWarning, stacklevel=2,
            )
            return gm.forward


_SHARED: dict[tuple, TorchmuxDynamoBackend] = {}


def shared_backend(config: CompileConfig) -> TorchmuxDynamoBackend:
    """One Dynamo backend object per distinct configuration.

    Dynamo guards each cached graph on the identity of the backend that compiled it, and counts every
    new backend against the recompile limit of the code object. Compiling two models of the same class
    (or two ``nn.Sequential``s) with the same settings must reuse the same backend, or the tenth
    ``torchmux.compile`` of a Sequential would silently run eagerly.
    """
    key = (
        tuple(id(b) for b in config.backends), config.auto, config.mode,
        repr(sorted(config.own.items())), repr(sorted((k, sorted(v.items())) for k, v in config.backend_options.items())),
    )
    if key not in _SHARED:
        _SHARED[key] = TorchmuxDynamoBackend(config)
    return _SHARED[key]


def torchmux_dynamo_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """Entry point for ``torch.compile(m, backend="torchmux")`` (group ``torch_dynamo_backends``).

    ``torch.compile(m, backend="torchmux", mode=..., options={...})`` passes mode and options through;
    the backend choice is "auto". Name a backend with ``options={"backend": "onnxruntime"}``.
    """
    options = dict(kwargs.get("options") or {})
    backend = options.pop("backend", "auto")
    config = resolve(backend, kwargs.get("mode"), options)
    return shared_backend(config)(gm, example_inputs)
