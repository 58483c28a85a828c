"""core/ir.py: invariants (lint), printed form, fingerprint, reference interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import torchmux
from torchmux.core.trace import trace


def mlp(x, w1, b1, w2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2)


def mlp_args(dtype=torch.float32, batch=4):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(dtype) for s in [(batch, 8), (16, 8), (16,), (4, 16)]]


def test_traced_graph_is_linted_core_aten_and_typed():
    ir = trace(mlp, mlp_args())
    ir.lint()
    assert all(isinstance(n.target, torch._ops.OpOverload) for n in ir.op_nodes)
    assert all("val" in n.meta for n in ir.placeholders + ir.op_nodes)
    assert ir.input_specs[0].shape == (4, 8) and ir.input_specs[0].dtype == torch.float32
    assert ir.output_specs[0].shape == (4, 4)
    assert ir.is_static


def test_printed_form_shows_ops_and_specs():
    text = str(trace(mlp, mlp_args(), name="mlp"))
    assert text.startswith("graph mlp(")
    assert "f32[4, 8] input" in text
    assert "aten.addmm.default" in text and "aten.gelu.default" in text
    assert text.rstrip().splitlines()[-1].startswith("  return (")


def _graph_with(target, args_fn):
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 3)
    node = g.call_function(target, args_fn(x))
    node.meta["val"] = torch.empty(2, 3)
    g.output((node,))
    return fx.GraphModule(torch.nn.Module(), g)


def test_lint_rejects_mutation():
    gm = _graph_with(torch.ops.aten.add_.Tensor, lambda x: (x, x))
    with pytest.raises(torchmux.IRLintError, match="mutates"):
        torchmux.GraphIR(gm).lint()


def test_lint_rejects_non_aten_targets():
    gm = _graph_with(torch.add, lambda x: (x, x))
    with pytest.raises(torchmux.IRLintError, match="not an ATen OpOverload"):
        torchmux.GraphIR(gm).lint()


def test_lint_rejects_values_without_spec():
    gm = _graph_with(torch.ops.aten.relu.default, lambda x: (x,))
    del next(n for n in gm.graph.nodes if n.op == "call_function").meta["val"]
    with pytest.raises(torchmux.IRLintError, match="meta\\['val'\\]"):
        torchmux.GraphIR(gm).lint()


def test_input_kinds_are_checked():
    gm = trace(mlp, mlp_args()).gm
    with pytest.raises(torchmux.IRLintError, match="input kinds"):
        torchmux.GraphIR(gm, ["input"])
    ir = torchmux.GraphIR(gm, ["input", "param", "param", "param"])
    assert "param" in str(ir)


def test_fingerprint_ignores_weight_values_but_not_ops_shapes_dtypes():
    base = trace(mlp, mlp_args()).fingerprint()
    assert trace(mlp, [a * 3 + 1 for a in mlp_args()]).fingerprint() == base  # other weights
    assert trace(mlp, mlp_args(batch=5)).fingerprint() != base  # a shape
    assert trace(mlp, mlp_args(torch.float64)).fingerprint() != base  # a dtype
    other_op = lambda x, w1, b1, w2: F.linear(F.relu(F.linear(x, w1, b1)), w2)  # noqa: E731
    assert trace(other_op, mlp_args()).fingerprint() != base  # an op


def test_fingerprint_is_stable_across_processes():
    script = textwrap.dedent(
        """
        import torch, torch.nn.functional as F
        from torchmux.core.trace import trace
        def mlp(x, w1, b1, w2):
            return F.linear(F.gelu(F.linear(x, w1, b1)), w2)
        args = [torch.randn(s) for s in [(4, 8), (16, 8), (16,), (4, 16)]]
        print(trace(mlp, args).fingerprint())
        """
    )
    prints = {
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }
    assert len(prints) == 1
    assert prints == {trace(mlp, mlp_args()).fingerprint()}


def test_reference_interpreter_matches_eager_and_names_failing_node():
    args = mlp_args()
    ir = trace(mlp, args)
    torch.testing.assert_close(ir.run_reference(*args)[0], mlp(*args))
    with pytest.raises(RuntimeError, match="While executing %"):
        ir.run_reference(torch.randn(4, 7), *args[1:])  # wrong inner dimension


def test_example_inputs_follow_specs_and_are_not_zero():
    ir = trace(mlp, mlp_args())
    ex = ir.example_inputs()
    assert [tuple(t.shape) for t in ex] == [s.shape for s in ir.input_specs]
    assert all(t.abs().sum() > 0 for t in ex)


def _cond_program(delta):
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t + delta, lambda t: t - 1.0, (x,))

    return f


def _captured(fn, *args):
    graphs = []

    class Observer:
        @torchmux.hookimpl
        def torchmux_graph_captured(self, ir):
            graphs.append(ir)

    registry = torchmux.core.registry.get_registry()
    registry.pm.register(Observer(), name="ir-observer")
    try:
        torchmux.compile(fn, backend="eager")(*args)
    finally:
        registry.pm.unregister(name="ir-observer")
    return graphs[0]


def test_control_flow_branches_are_normalized_and_fingerprinted():
    x = torch.randn(4, 4)
    ir = _captured(_cond_program(1.0), x)
    ir.lint()  # the cond node's branches are linted as graphs of their own
    assert "cond" in ir.op_counts()
    torch.testing.assert_close(ir.run_reference(x)[0], _cond_program(1.0)(x))
    assert _captured(_cond_program(2.0), x).fingerprint() != ir.fingerprint()  # another branch body


def test_run_time_checks_carry_no_value_but_pass_lint():
    def f(x):
        torch._check(x.shape[0] > 1)
        torch._assert_async((x > -1e9).all(), "x is too small")
        return x * 2

    ir = trace(f, [torch.randn(3)])
    assert any(n.target == torch.ops.aten._assert_async.msg for n in ir.op_nodes)
    ir.lint()
