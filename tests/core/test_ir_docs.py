"""The printed graphs in core/ir.py's docstring are what a backend receives: this test makes them.

Each example of the docstring's "What a backend receives" is a program below, compiled through
``torchmux.compile`` on a backend that records every ``CompileRequest``; the test compares the printed
form of what it recorded with the docstring's text, graph name aside. When the IR changes on purpose,
``python tests/core/test_ir_docs.py`` prints the new examples to paste.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import torchmux
import torchmux.core.ir as ir_module
from torchmux import extend


class _Recorder(extend.Backend):
    """Claims ``ops`` (None: every op) and runs what it is given with the graph's own code."""

    contract_version = extend.CONTRACT_VERSION
    auto = False
    dynamic_shapes = True

    def __init__(self, name: str, ops: frozenset[str] | None = None) -> None:
        self.name, self.ops, self.seen = name, ops, []

    def compile(self, request):
        self.seen.append(request)
        forward = request.ir.gm.forward
        return lambda *args: list(forward(*args))


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("scale", torch.ones(16))

    def forward(self, x):
        return torch.relu(self.lin(x)) * self.scale


class Sorted(Block):
    def forward(self, x):
        return torch.sort(super().forward(x), dim=-1).values + 1


def _offset(x):
    return x * torch.tensor([1.0, 2.0, 3.0, 4.0])


#: (title in the docstring, program, grad enabled, backend ops (None: all), compile options)
EXAMPLES = {
    "inference": (Block, False, None, {}),
    "training": (Block, True, None, {}),
    "region": (Sorted, False, frozenset({"aten.addmm.default", "aten.permute.default", "aten.relu.default"}), {}),
    "unfrozen": (Block, False, None, {"freeze": False}),
    "constant": (lambda: _offset, False, None, {}),
    "dynamic": (Block, False, None, {"dynamic": True}),
}


def printed(title: str) -> str:
    """The printed form of every graph the example's backend received, in order."""
    make, grad, ops, options = EXAMPLES[title]
    backend = _Recorder(f"irdoc_{title}", ops)
    torchmux.register_plugin(backend)
    torch.manual_seed(0)
    program = make()
    dynamic = options.pop("dynamic", None) if "dynamic" in options else None
    compiled = torchmux.compile(program, backend=backend.name, dynamic=dynamic, options={"isolate": "off", **options})
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.set_grad_enabled(grad):
            for batch in (8, 5) if dynamic else (8,):
                out = compiled(torch.randn(batch, 16) if title != "constant" else torch.randn(2, 4))
                if grad:
                    out.sum().backward()
    options.update({"dynamic": dynamic} if dynamic else {})
    return "\n".join(f"{str(r.ir)}\n  # phase={r.ir.phase} input_kinds={list(r.ir.input_kinds)}" for r in backend.seen)


def documented(title: str) -> str:
    """The docstring's example ``title``: the indented block after the line ``Example <title>``."""
    doc = ir_module.__doc__ or ""
    match = re.search(rf"^Example {title}\b[\s\S]*?::\n\n((?:    .*\n|\n)+)", doc, re.M)
    assert match, f"core/ir.py's docstring has no 'Example {title} ...::' block"
    return "\n".join(line[4:] for line in match.group(1).rstrip().splitlines())


def _unnamed(text: str) -> str:
    return re.sub(r"^graph \S+\(", "graph G(", text, flags=re.M)


@pytest.mark.parametrize("title", list(EXAMPLES))
def test_documented_ir_is_what_a_backend_receives(title: str) -> None:
    got = printed(title)
    assert _unnamed(got) == _unnamed(documented(title)), (
        f"core/ir.py's 'Example {title}' no longer shows what a backend receives; it now gets:\n{got}"
    )


def test_region_placeholders_come_first_and_weights_stay_weights() -> None:
    """A region is a normalized graph like any other: placeholders first, frozen weights as get_attr."""
    make, grad, ops, _ = EXAMPLES["region"]
    backend = _Recorder("irdoc_region_order", ops)
    torchmux.register_plugin(backend)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torchmux.compile(make(), backend=backend.name, options={"isolate": "off"})(torch.randn(8, 16))
    (region,) = [r.ir for r in backend.seen]
    kinds = [n.op for n in region.graph.nodes]
    first_op = kinds.index("call_function")
    assert set(kinds[:first_op]) == {"placeholder", "get_attr"} and "placeholder" not in kinds[first_op:]
    attrs = [n for n in region.graph.nodes if n.op == "get_attr"]
    assert attrs and all(isinstance(getattr(region.gm, str(n.target)), torch.Tensor) for n in attrs)


if __name__ == "__main__":
    for name in EXAMPLES:
        print(f"Example {name}::\n")
        print("\n".join("    " + line for line in printed(name).splitlines()))
        print()
