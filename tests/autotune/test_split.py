"""autotune/split.py: cutting a graph into pieces, placing each piece by measurement, stitching."""

from __future__ import annotations

import time

import torch

import torchmux
from torchmux.autotune.runner import GraphRunner
from torchmux.autotune.split import Plan, _live_after, build_split, cut_points, split, try_split
from torchmux.autotune.tuner import measure
from torchmux.core.config import CompileConfig
from torchmux.core.ir import GraphIR, op_name
from torchmux.core.registry import get_registry
from torchmux.core.trace import trace


def blocks(x, w1, w2, w3, w4):
    """Four residual blocks: between blocks only the running value crosses."""
    for w in (w1, w2, w3, w4):
        x = x + torch.tanh(x @ w).sigmoid() * 0.5
    return x


def blocks_args():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(16, 32, generator=g)] + [torch.randn(32, 32, generator=g) / 6 for _ in range(4)]


def blocks_ir():
    ir = trace(blocks, blocks_args(), name="blocks")
    return GraphIR(ir.gm, ["input", "param", "param", "param", "param"], name="blocks")


def matmuls_then_pointwise(x, w1, w2):
    """Eight matmuls, then fifteen pointwise ops; two values are live inside each part and one between
    them, so that is where a cut in two goes."""
    a = x @ w1
    b = a @ w2
    for _ in range(3):
        a = a @ b
        b = b @ a
    y = a @ b
    p, q = torch.tanh(y), torch.sigmoid(y)
    for _ in range(3):
        p = p * q + 0.1
        q = q - p * 0.5
    return p + q


def mp_args():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(16, 16, generator=g) / 4 for _ in range(3)]  # stays O(1) through the chain


class Averse(torchmux.Backend):
    """Runs any graph correctly, but 20 ms late when the graph holds one of ``slow_ops``: two of these
    with different ``slow_ops`` each lose the whole graph, and each wins the piece the other is slow on."""

    slow_ops: frozenset[str] = frozenset()

    def compile(self, request):
        forward = request.ir.gm.forward
        late = any(op_name(n) in self.slow_ops for n in request.ir.op_nodes)

        def run(*a):
            if late:
                time.sleep(0.02)
            return list(forward(*a))

        return run


class SlowMatmul(Averse):
    name = "slow_matmul"
    slow_ops = frozenset({"aten.mm.default"})


class SlowPointwise(Averse):
    name = "slow_pointwise"
    slow_ops = frozenset({"aten.tanh.default", "aten.sigmoid.default"})


def test_cuts_fall_where_fewest_values_cross_and_leave_no_piece_too_small():
    ir = blocks_ir()
    live = _live_after(ir.op_nodes)
    cuts = cut_points(ir, 4, min_ops=3)
    assert len(cuts) == 3
    assert all(live[c] == min(live[:-1]) for c in cuts)  # only the running value crosses a block boundary
    sizes = [b - a for a, b in zip([-1, *cuts], [*cuts, len(ir.op_nodes) - 1])]
    assert min(sizes) >= 3
    assert cut_points(ir, 4, min_ops=len(ir.op_nodes)) == []  # too small to cut


def test_pieces_are_normalized_graphs_that_rebuild_the_graph():
    ir, a = blocks_ir(), blocks_args()
    parent, pieces = split(ir, cut_points(ir, 2, min_ops=3), a)
    assert len(pieces) == 2
    for piece in pieces:
        piece.ir.lint()
        assert "param" in piece.ir.input_kinds  # weights stay weights inside a piece
    torch.testing.assert_close(parent(*a)[0], blocks(*a))
    assert sum(len(p.ir.op_nodes) for p in pieces) == len(ir.op_nodes)


def test_neighbours_that_chose_the_same_backend_are_merged():
    plan = Plan((3, 7, 9), ("onnxruntime", "inductor", "inductor", "onnxruntime"))
    assert plan.merged() == Plan((3, 9), ("onnxruntime", "inductor", "onnxruntime"))
    assert Plan.from_record(plan.as_record()) == plan
    assert Plan.from_record({"cuts": [1], "backends": ["a"]}) is None  # one name short
    assert Plan.from_record({"cuts": "x"}) is None


def test_each_piece_runs_on_the_backend_that_is_fastest_on_it():
    ir = trace(matmuls_then_pointwise, mp_args(), name="mp")
    a = mp_args()
    backends = [SlowMatmul(), SlowPointwise()]
    whole = measure(ir, backends, a, time_budget=0.1)
    assert all(m.ok and m.seconds >= 0.02 for m in whole)  # each is late on the whole graph
    m = try_split(ir, whole, backends, a, segments=2, mode=None, options=lambda n: {}, time_budget=0.2)
    assert m is not None and m.ok, m and m.reason
    assert m.backend == "split(slow_pointwise,slow_matmul)"
    assert m.seconds < 0.01 < min(w.seconds for w in whole)  # neither piece is late on its winner
    torch.testing.assert_close(m.placement.fn(*a)[0], matmuls_then_pointwise(*a))


def test_real_backends_share_a_graph_and_the_answer_is_the_reference():
    ir, a = blocks_ir(), blocks_args()
    registry = get_registry()
    cut = cut_points(ir, 2, min_ops=3)
    plan = Plan(tuple(cut), ("onnxruntime", "eager"))
    placement = build_split(
        ir, plan, [registry.get("onnxruntime"), registry.get("eager")], a, mode=None, options=lambda n: {}
    )
    assert placement is not None and placement.backend == "split(onnxruntime,eager)"
    torch.testing.assert_close(placement.fn(*a)[0], blocks(*a), rtol=1e-5, atol=1e-5)


def test_the_runner_chooses_a_split_and_a_new_runner_rebuilds_it_from_disk():
    ir, a = trace(matmuls_then_pointwise, mp_args(), name="mp_runner"), mp_args()
    config = CompileConfig((SlowMatmul(), SlowPointwise()), auto=True, own={"split": 2, "autotune_budget": 0.2})
    first = GraphRunner(ir, config)
    torch.testing.assert_close(first(*a)[0], matmuls_then_pointwise(*a))
    decision = next(iter(first.decisions.values()))
    assert decision.backend == "split(slow_pointwise,slow_matmul)"
    second = GraphRunner(ir, config)  # as a new process would
    torch.testing.assert_close(second(*a)[0], matmuls_then_pointwise(*a))
    again = next(iter(second.decisions.values()))
    assert again.backend == decision.backend
    assert [m.backend for m in again.measurements if m.placement is not None] == [decision.backend]  # not re-measured


def test_split_is_off_by_default_and_on_under_max_autotune():
    from torchmux.core.config import resolve

    assert resolve("auto", None, None).split_segments == 0
    assert resolve("auto", "max-autotune", None).split_segments == 4
    assert resolve("auto", None, {"split": 3}).split_segments == 3
    assert resolve("auto", "max-autotune", {"split": 0}).split_segments == 0


def test_no_cut_falls_between_a_multi_output_op_and_its_getitems():
    def norms(x, w):
        for _ in range(6):
            x = torch.nn.functional.layer_norm(x @ w, (32,)) * 0.5 + x
        return x

    a = [torch.randn(4, 32), torch.randn(32, 32) / 6]
    ir = trace(norms, a, name="norms")
    multi = [i for i, n in enumerate(ir.op_nodes) if isinstance(n.meta.get("val"), (tuple, list))]
    assert multi  # native_layer_norm returns (out, mean, rstd)
    cuts = cut_points(ir, 6, min_ops=2)
    assert cuts
    pos = {n: i for i, n in enumerate(ir.op_nodes)}
    for c in cuts:  # no tuple crosses a cut: every getitem sits with its producer
        assert all(pos[u] <= c for j in multi if j <= c for u in ir.op_nodes[j].users), c
    parent, pieces = split(ir, cuts, a)
    torch.testing.assert_close(parent(*a)[0], norms(*a))


class SlowPointwiseMutatesLate(SlowPointwise):
    """SlowPointwise (the winner of the first piece, which reads the user's ``x``) that adds 1 to its first input from its third call on: past the two checked calls,
    so the split's own check and timing runs are what would reach the user's tensor."""

    name = "slow_pointwise_mutates_late"

    def compile(self, request):
        run, calls = super().compile(request), [0]

        def mutating(*a):
            out = run(*a)
            calls[0] += 1
            if calls[0] >= 3:
                a[0].add_(1)
            return out

        return mutating


def test_split_trials_never_touch_the_users_tensors():
    ir = trace(matmuls_then_pointwise, mp_args(), name="mp_mutates")
    a = mp_args()
    kept = [t.clone() for t in a]
    backends = [SlowMatmul(), SlowPointwiseMutatesLate()]
    whole = measure(ir, backends, a, time_budget=0.05)
    m = try_split(ir, whole, backends, a, segments=2, mode=None, options=lambda n: {}, time_budget=0.1)
    assert m is not None and m.backend == "split(slow_pointwise_mutates_late,slow_matmul)"
    for t, k in zip(a, kept):
        torch.testing.assert_close(t, k, rtol=0, atol=0)
