"""CUDA graphs: record the graph's kernels once, replay them with one launch.

It removes per-op launch overhead (the win for small batches on a GPU), not work. The graph is
recorded from the eager ATen graph by the kit's ``record_cuda_graph`` (core/cudagraph.py says how: static
input buffers, each call copies the inputs in, replays, returns clones of the outputs).
Available only where CUDA is.
"""

from __future__ import annotations

import torch

from torchmux import extend
from torchmux.extend import op_name


class CudaGraphsBackend(extend.Backend):
    name = "cudagraphs"
    devices = ("cuda",)
    package = "torch"
    contract_version = extend.CONTRACT_VERSION
    options_schema: dict[str, extend.Option] = {}  # takes no options
    description = "records the ATen graph as a CUDA graph and replays it (removes launch overhead)"

    def availability(self) -> extend.Availability:
        if not torch.cuda.is_available():
            return extend.Availability.no("no CUDA GPU visible to torch (CUDA graphs need one)")
        return extend.Availability.yes()

    def supports(self, node: torch.fx.Node) -> bool:
        # ops that synchronize with the host or allocate data-dependent shapes cannot be recorded
        name = op_name(node)
        return name not in {
            "aten.nonzero.default",
            "aten._local_scalar_dense.default",
            "aten.masked_select.default",
        } and super().supports(node)

    def compile(self, request: extend.CompileRequest) -> extend.CompiledGraph:
        if request.device != "cuda":
            raise RuntimeError("cudagraphs runs CUDA tensors only")
        return extend.record_cuda_graph(request.ir.gm.forward, request.example_inputs)


@extend.hookimpl
def torchmux_add_backends() -> list[extend.Backend]:
    return [CudaGraphsBackend()]
