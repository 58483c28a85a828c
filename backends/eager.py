"""The smallest backend: run the normalized graph as it is, one ATen op at a time.

It is the baseline every other backend is measured against, the fallback when all else fails, and
the walkthrough in plugins.md. The graph module's generated ``forward`` calls the same ATen ops as the
reference interpreter, without the interpreter's per-node Python dispatch.
"""

from __future__ import annotations

import torch

from torchmux import extend


class EagerBackend(extend.Backend):
    name = "eager"
    devices = ("cpu", "cuda")
    package = "torch"
    contract_version = extend.CONTRACT_VERSION
    options_schema: dict[str, extend.Option] = {}  # takes no options
    description = "runs the ATen graph op by op (the baseline and the fallback)"
    dynamic_shapes = True

    def supports(self, node: torch.fx.Node) -> bool:
        """Every op in every dtype (float64 and complex included): it is what ATen runs."""
        return True

    def compile(self, request: extend.CompileRequest) -> extend.CompiledGraph:
        forward = request.ir.gm.forward

        def run(*args: torch.Tensor) -> list[torch.Tensor]:
            return list(forward(*args))

        return run

    def save(self, compiled: extend.CompiledGraph, request: extend.CompileRequest) -> extend.SavedGraph | None:
        """Its artifact is the package's program itself (``program.pt2``): nothing more to store."""
        return extend.SavedGraph({}, {"artifact": "program.pt2"}) if request.program is not None else None

    def load(self, request: extend.LoadRequest) -> extend.CompiledGraph:
        """The stored ``ExportedProgram``'s module, called with the flat inputs, returning flat outputs."""
        return extend.program_runner(request.program())


@extend.hookimpl
def torchmux_add_backends() -> list[extend.Backend]:
    return [EagerBackend()]
