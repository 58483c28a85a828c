"""A third-party backend: runs the pointwise ops it claims through its own interpreter.

It claims only a few pointwise ops, so torchmux's partitioner runs everything else eagerly around
the regions it claims: the smallest demonstration of per-node capability.
"""

from __future__ import annotations

import torch

import torchmux

CALLS = {"count": 0}  # how many times a graph compiled here ran (the tests read it)
PREPARED: list[str] = []  # the devices prepare() was called for in this process (the tests read it)


class ExampleBackend(torchmux.Backend):
    name = "example"
    devices = ("cpu",)
    package = "torchmux-example-plugin"
    description = "example third-party plugin: interprets add/mul/relu/sigmoid/tanh"
    dtypes = (torch.float32,)
    ops = frozenset(
        {"aten.add.Tensor", "aten.mul.Tensor", "aten.relu.default", "aten.sigmoid.default", "aten.tanh.default"}
    )
    auto = False  # an interpreter is never the fastest; run it only when asked by name

    def prepare(self, device: str) -> None:
        PREPARED.append(device)  # a real plugin would load its library here

    def compile(self, request: torchmux.CompileRequest) -> torchmux.CompiledGraph:
        gm = request.ir.gm

        def run(*args: torch.Tensor) -> list[torch.Tensor]:
            CALLS["count"] += 1
            return list(torchmux.ReferenceInterpreter(gm).run(*args))

        return run


@torchmux.hookimpl
def torchmux_add_backends() -> list[torchmux.Backend]:
    return [ExampleBackend()]
