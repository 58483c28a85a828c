"""CUDA graphs: record the graph's kernels once, replay them with one launch.

It removes per-op launch overhead (the win for small batches on a GPU), not work. The graph is
recorded from the eager ATen graph on static input buffers; each call copies the inputs in, replays,
and returns clones of the outputs (so a later replay cannot overwrite what the caller holds; a backward
graph's None gradients pass as they are).
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
        forward = request.ir.gm.forward
        static_in = [t.clone() if isinstance(t, torch.Tensor) else t for t in request.example_inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up outside the recording (allocator, lazy init)
                forward(*static_in)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = list(forward(*static_in))

        def run(*args: torch.Tensor) -> list[torch.Tensor]:
            for dst, src in zip(static_in, args):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            graph.replay()
            return [t.clone() if isinstance(t, torch.Tensor) else t for t in static_out]  # a backward's None

        return run


@extend.hookimpl
def torchmux_add_backends() -> list[extend.Backend]:
    return [CudaGraphsBackend()]
