"""Trains a small model under DistributedDataParallel (or FSDP2's ``fully_shard``) on 2 CPU processes
(gloo), uncompiled and compiled with torchmux, and writes each rank's losses, gradients, measurements
and choices to OUT/rank<r>.pt.

    python tests/api/ddp_worker.py OUT BACKEND [STEPS] [ddp|fsdp]

BACKEND is "auto" or a comma-separated list of backend names for auto to choose among. Every rank
has its own TORCHMUX_CACHE_DIR: rank 1 learns rank 0's choices through the process group, not a file.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def train(
    model: torch.nn.Module, rank: int, steps: int, wrap: str, compile: Any = None
) -> tuple[list[float], list[list[torch.Tensor]]]:
    if wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard

        ddp = fully_shard(model)
    else:
        ddp = DDP(model)
    ddp = compile(ddp) if wrap == "fsdp" and compile else ddp
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of data
    losses, grads = [], []
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        losses.append(loss.item())
        grads.append([_full(p.grad).detach().clone() for p in model.parameters()])
        opt.step()
    return losses, grads


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # FSDP's gradients are sharded DTensors


def run(rank: int, world: int, out: str, backend: str, steps: int, wrap: str) -> None:
    os.environ["TORCHMUX_CACHE_DIR"] = os.path.join(out, f"cache{rank}")
    dist.init_process_group(
        "gloo", init_method=f"file://{os.path.join(out, 'rendezvous')}", rank=rank, world_size=world
    )
    import torchmux
    from torchmux.autotune.runner import GraphRunner
    from torchmux.core.registry import get_registry

    measured: list[str] = []

    class Observer:
        @torchmux.hookimpl
        def torchmux_candidate_measured(self, ir, backend, seconds, ok, reason):  # type: ignore[no-untyped-def]
            measured.append(backend)

    get_registry().register(Observer(), "ddp_observer")
    torch.manual_seed(0)
    plain = Net()
    compiled = Net()
    compiled.load_state_dict(plain.state_dict())
    want = train(plain, rank, steps, wrap)
    names = backend.split(",") if "," in backend else backend
    if wrap == "fsdp":  # the sharded model is compiled: fully_shard hooks the module it is given
        got = train(compiled, rank, steps, wrap, compile=lambda m: torchmux.compile(m, backend=names))
    else:  # DDP wraps the compiled model
        got = train(torchmux.compile(compiled, backend=names), rank, steps, wrap)
    chosen = {
        r.ir.fingerprint(): [d.backend for d in r.placements()] for r in gc.get_objects() if type(r) is GraphRunner
    }  # type(): no dereferencing dead weak proxies
    torch.save({"want": want, "got": got, "measured": measured, "chosen": chosen}, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    out, backend = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    wrap = sys.argv[4] if len(sys.argv) > 4 else "ddp"
    mp.spawn(run, args=(2, out, backend, steps, wrap), nprocs=2, join=True)
