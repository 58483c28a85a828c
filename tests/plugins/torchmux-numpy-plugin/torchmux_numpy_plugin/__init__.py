"""A torchmux backend that runs the ops it claims with NumPy, one op at a time.

Written from plugins.md and the docstrings of ``torchmux.extend`` / ``torchmux.testing`` only: it
is partial (it claims the ops in ``OPS`` that pass the probe, in float32; torchmux runs every other op
eagerly between its regions) and reads weights both ways a graph holds them (core/ir.py, "What a
backend receives"): as placeholders (training, ``freeze=False``) and as ``get_attr`` tensors (frozen
inference graphs, program constants).

Its claims file was made the documented way, before the plugin was installed::

    python -m torchmux.testing.probe torchmux_numpy_plugin --write torchmux_numpy_plugin/claims.json

and its own test (tests/test_conformance.py) is one line of ``torchmux.testing``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from torchmux import extend

from .ops import OPS


class NumpyBackend(extend.Backend):
    name = "numpy_interp"
    package = "torchmux-numpy-plugin"
    description = "NumPy interpreter of a few Core ATen ops (an example plugin)"
    contract_version = 2  # the contract it was written against (phases, granularity, options)
    devices = ("cpu",)
    dtypes = (torch.float32,)
    claims = extend.load_claims(Path(__file__).with_name("claims.json"))
    nonfinite_unsafe = extend.load_nonfinite_unsafe(Path(__file__).with_name("claims.json"))
    options_schema: dict[str, extend.Option] = {}  # takes no options
    auto = False  # an interpreter is never the fastest: it runs only where a user names it

    def compile(self, request: extend.CompileRequest) -> extend.CompiledGraph:
        import numpy as np

        graph = request.ir.graph
        for node in request.ir.op_nodes:  # the table is the claim: refuse what it cannot run
            if node.target is not operator.getitem and extend.op_name(node) not in OPS:
                raise NotImplementedError(f"no NumPy implementation of {extend.op_name(node)}")
        # frozen weights and constants: get_attr tensors of the graph module, read once here
        constants = {name: t.detach().cpu().numpy() for name, t in request.ir.constants.items()}
        nodes = list(graph.nodes)

        def run(*args: Any) -> list[torch.Tensor]:
            with np.errstate(all="ignore"):  # NaN and inf propagate as ATen's do, silently
                return interpret(args)

        def interpret(args: Sequence[Any]) -> list[torch.Tensor]:
            env: dict[Any, Any] = {}
            inputs = iter(args)
            for node in nodes:
                if node.op == "placeholder":
                    env[node] = _to_numpy(next(inputs))
                elif node.op == "get_attr":
                    env[node] = constants[str(node.target)]
                elif node.op == "call_function":
                    a = [_load(env, x) for x in node.args]
                    kw = {k: _load(env, v) for k, v in node.kwargs.items()}
                    fn = operator.getitem if node.target is operator.getitem else OPS[extend.op_name(node)]
                    env[node] = fn(*a, **kw)
                elif node.op == "output":
                    outs = node.args[0]
                    # fresh tensors on every call: np.array copies (no output aliases an input or a weight)
                    return [torch.from_numpy(np.array(_load(env, o), copy=True)) for o in outs]
            raise AssertionError("a graph ends with its output node")

        return run


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (tuple, list)):
        return type(value)(_to_numpy(v) for v in value)
    return value


def _load(env: dict[Any, Any], arg: Any) -> Any:
    if isinstance(arg, torch.fx.Node):
        return env[arg]
    if isinstance(arg, (tuple, list)):
        return type(arg)(_load(env, a) for a in arg)
    return arg


@extend.hookimpl
def torchmux_add_backends() -> list[extend.Backend]:
    return [NumpyBackend()]
