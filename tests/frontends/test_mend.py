"""The mend pass: graph breaks removed before Dynamo, behaviour unchanged.

Covers the four programs of the "common torch.compile mistakes" article, what the user sees
(printed text, log records, warnings, exceptions, their file and line), where a rewrite must not
apply, how the mended code is installed, and Hugging Face models from tiny configs.
"""

from __future__ import annotations

import io
import logging
import math
import os
import sys
import traceback
import types
import warnings
from contextlib import redirect_stdout

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.autograd import Variable

import torchmux
from torchmux.frontends.mend import mend, source_of

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "corpus"))

from programs import (  # noqa: E402
    AssertCheck,
    BranchWithPrint,
    ItemUnused,
    LoggingInfo,
    RaiseCheck,
    RandomBranch,
    RangeLoop,
    ShapeBranch,
    WarnsUnconditionally,
)

HERE = os.path.abspath(__file__)


def explain(model, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torchmux.explain(model, *args, backend="eager", **kw)


def compiled(model, **options):
    torch._dynamo.reset()
    return torchmux.compile(model, backend="eager", options=options or None)


# --- the article's four programs ---------------------------------------------------------------------

ARTICLE = [RandomBranch, ItemUnused, RangeLoop, ShapeBranch]


@pytest.mark.parametrize("cls", ARTICLE, ids=[c.__name__ for c in ARTICLE])
def test_article_program_is_one_graph(cls) -> None:
    torch.manual_seed(0)
    model, x = cls(), torch.randn(4, 16)
    report = explain(model, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    fast = compiled(model)
    for seed in range(4):  # RandomBranch: both outcomes of the draw, drawn the same way
        torch.manual_seed(seed)
        expected = model(x)
        torch.manual_seed(seed)
        assert torch.allclose(fast(x), expected, atol=1e-6)


def test_article_random_branch_reports_rewrite_and_plain_dynamo_breaks() -> None:
    model, x = RandomBranch(), torch.randn(4, 16)
    report = explain(model, x)
    assert any(
        r.startswith(f"{os.path.dirname(HERE)[: -len('frontends')]}corpus/programs.py:") and "torch.cond" in r
        for r in report.rewrites
    ), report.rewrites
    plain = explain(model, x, mend=False)
    assert (plain.graph_count, plain.graph_break_count) == (2, 1)
    assert plain.rewrites == []


# --- what the user sees stays the same ---------------------------------------------------------------


def test_print_text_and_order_with_code_between() -> None:
    def f(x):
        print("start", x.shape)
        y = x * 2
        print(f"sum={y.sum().item():.3f}", "max", y.max(), sep=";", end="!\n")
        z = y.relu()
        print("done %d items" % z.numel())
        return z

    x = torch.randn(3, 5)
    eager = io.StringIO()
    with redirect_stdout(eager):
        want = f(x)
    fast = compiled(f)
    out = io.StringIO()
    with redirect_stdout(out):
        got = fast(x)
    assert out.getvalue() == eager.getvalue()
    assert torch.equal(got, want)
    report = explain(f, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    assert sum("print(...) deferred" in r for r in report.rewrites) == 3


class _PrintingBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        print("block", h.shape, h.sum() > -1e9)
        return h


class _PrintingStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_PrintingBlock() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_print_in_an_inlined_submodule_is_replayed() -> None:
    """Dynamo inlines a submodule's forward; a print deferred there is replayed after the graph (Dynamo
    itself keeps only the root frame's reorderable calls: these three lines were lost)."""
    model, x = _PrintingStack().eval(), torch.randn(2, 4)
    eager = io.StringIO()
    with redirect_stdout(eager):
        want = model(x)
    assert eager.getvalue().count("block") == 3
    fast = compiled(model)
    for _ in range(2):  # the capturing call and a cached one
        out = io.StringIO()
        with redirect_stdout(out):
            got = fast(x)
        assert out.getvalue() == eager.getvalue()
        assert torch.allclose(got, want)
    report = explain(model, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def test_log_record_keeps_users_file_line_and_function(caplog: pytest.LogCaptureFixture) -> None:
    model, x = LoggingInfo(), torch.randn(2, 16)
    with caplog.at_level(logging.INFO, logger="torchmux.corpus"):
        model(x)
        fast = compiled(model)
        fast(x)
    eager_rec, fast_rec = [r for r in caplog.records if r.name == "torchmux.corpus"]
    for attr in ("pathname", "lineno", "funcName", "levelname"):
        assert getattr(fast_rec, attr) == getattr(eager_rec, attr), attr
    assert fast_rec.getMessage() == eager_rec.getMessage()
    assert explain(model, x).graph_break_count == 0


def test_warning_keeps_category_file_and_line() -> None:
    model, x = WarnsUnconditionally(), torch.randn(2, 16)
    with warnings.catch_warnings(record=True) as eager:
        warnings.simplefilter("always")
        model(x)
    fast = compiled(model)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        fast(x)
    mine = [w for w in got if w.category is DeprecationWarning]
    assert [(w.filename, w.lineno, str(w.message)) for w in mine] == [
        (w.filename, w.lineno, str(w.message)) for w in eager
    ]


class _AdaIN(nn.Module):
    """An AdaIN as a research repository wrote it: its ``InstanceNorm2d`` is told other channels than it
    gets, so torch's own code warns on every call (ParityBench's input; Dynamo breaks on that warning)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self.norm = nn.InstanceNorm2d(8)

    def forward(self, x):
        return self.norm(self.conv(x)).relu()


def _warned(stacklevel_two: bool):
    def check(x):
        if stacklevel_two:
            warnings.warn("scaled twice", RuntimeWarning, stacklevel=2)  # aimed at check's caller
        else:
            warnings.warn(f"sum {x.sum().item()}", stacklevel=2)  # known only from the data
        return x * 2

    class Warned(nn.Module):
        def forward(self, x):
            return check(x).sin()

    return Warned()


def _seen(caught, text):
    return [(w.filename, w.lineno, w.category, str(w.message)) for w in caught if text in str(w.message)]


def test_a_warning_from_torchs_own_code_is_shown_after_one_graph() -> None:
    model, x = _AdaIN(), torch.randn(2, 4, 5, 5)
    plain = torch._dynamo.explain(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert plain(x).graph_break_count == 1  # Dynamo: "Attempted to call function marked as skipped"
    report = explain(model, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    with warnings.catch_warnings(record=True) as eager:
        warnings.simplefilter("always")
        expected = model(x)
    fast = compiled(model)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        outs = [fast(x), fast(x)]
    assert all(torch.equal(out, expected) for out in outs)
    (seen,) = {(c, m) for _, _, c, m in _seen(eager, "num_features")}
    # once per call, as eager; named at the user's line that called the norm (eager: module.py's call)
    forward_line = _AdaIN.forward.__code__.co_firstlineno + 1
    assert _seen(got, "num_features") == [(HERE, forward_line, *seen)] * 2


def test_a_warning_aimed_at_the_caller_names_the_callers_line_and_one_from_the_data_still_breaks() -> None:
    model, x = _warned(True), torch.randn(3)
    with warnings.catch_warnings(record=True) as eager:
        warnings.simplefilter("always")
        expected = model(x)
    report = explain(model, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    fast = compiled(model)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert torch.equal(fast(x), expected)
    assert _seen(got, "scaled twice") == _seen(eager, "scaled twice") != []

    model = _warned(False)
    report = explain(model, x)
    assert report.graph_break_count >= 1 and any("skipped" in str(r) for r in report.break_reasons), str(report)
    with warnings.catch_warnings(record=True) as eager:
        warnings.simplefilter("always")
        expected = model(x)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert torch.equal(compiled(model)(x), expected)
    assert _seen(got, "sum ") == _seen(eager, "sum ") != []


def test_branch_not_taken_runs_no_side_effect() -> None:
    model = BranchWithPrint()
    fast = compiled(model)
    for x, text in ((torch.ones(2, 3), "positive sum\n"), (-torch.ones(2, 3), "non-positive sum\n")):
        out = io.StringIO()
        with redirect_stdout(out):
            got = fast(x)
        assert out.getvalue() == text
        assert torch.equal(got, model(x))


def test_checks_still_raise_the_users_exception() -> None:
    model = RaiseCheck()
    fast = compiled(model)
    assert torch.allclose(fast(torch.ones(2, 16)), model(torch.ones(2, 16)))
    with pytest.raises(ValueError, match="input out of range"):
        fast(torch.full((2, 16), 1000.0))
    assert explain(model, torch.ones(2, 16)).graph_break_count == 0

    amodel = AssertCheck()
    afast = compiled(amodel)
    with pytest.raises(AssertionError, match="non-finite activations"):
        afast(torch.full((2, 16), 1000.0))


def test_failed_check_stops_later_prints() -> None:
    def f(x):
        if (x < 0).any():
            raise ValueError(f"negative input, min {x.min().item()}")
        print("checked", x.sum())
        return x.sqrt()

    fast = compiled(f)
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(ValueError, match=r"negative input, min -1.0"):
        fast(-torch.ones(3))
    assert out.getvalue() == ""
    assert explain(f, torch.ones(3)).graph_break_count == 0


def test_check_guarding_an_index_is_kept_in_python() -> None:
    """The code after this check raises on bad data: deferring the check would change the error."""

    def f(x, idx):
        if (idx >= 4).any():  # x has 4 columns
            raise IndexError("index past the end")
        return x[:, idx]

    assert "checked after the graph" not in source_of(f)
    with pytest.raises(IndexError, match="index past the end"):
        compiled(f)(torch.ones(2, 4), torch.tensor([1, 7]))


def test_error_points_at_users_line() -> None:
    def f(x):
        print("about to fail")
        return x @ torch.ones(7, 7)  # wrong shape: the error must name this line

    line = f.__code__.co_firstlineno + 2
    fixed, _ = mend(f)
    assert fixed is not f
    with redirect_stdout(io.StringIO()), pytest.raises(RuntimeError) as info:
        fixed(torch.ones(3, 5))
    frames = [fr for fr in traceback.extract_tb(info.tb) if fr.filename == HERE]
    assert frames[-1].lineno == line


# --- where the pass must not act ---------------------------------------------------------------------


def test_option_off_keeps_the_break() -> None:
    model, x = RandomBranch(), torch.randn(4, 16)
    report = explain(model, x, mend=False)
    assert report.graph_break_count == 1
    fast = compiled(model, mend=False)
    assert "forward" not in vars(model)
    torch.manual_seed(1)
    want = model(x)
    torch.manual_seed(1)
    assert torch.allclose(fast(x), want)


def test_dynamo_switches_hold_during_the_call_only() -> None:
    cfg = torch._dynamo.config
    before = (cfg.capture_scalar_outputs, cfg.capture_dynamic_output_shape_ops, set(cfg.reorderable_logging_functions))
    seen = []

    def f(x):
        seen.append(cfg.capture_scalar_outputs)  # runs while Dynamo traces, inside the call
        return (x * 2).sum().item() + 1

    fast = compiled(f)
    assert fast(torch.ones(3)) == 7.0
    assert seen == [True]
    assert (
        cfg.capture_scalar_outputs,
        cfg.capture_dynamic_output_shape_ops,
        set(cfg.reorderable_logging_functions),
    ) == before  # the user's own torch.compile is untouched


class ItemScale(nn.Module):
    def forward(self, x):
        return x * (x.sum().item() + 1)  # .item() stays in the graph only under the switches


def test_a_compiled_module_sets_the_switches_while_dynamo_traces_only(monkeypatch) -> None:
    """A call that hits Dynamo's cache pays nothing for them; a recompile sets them again."""
    from torch._dynamo.utils import counters

    from torchmux.frontends.mend import switches as switches_module

    entered = []

    class Counting(switches_module.switches):
        __slots__ = ()

        def __enter__(self) -> None:
            entered.append(1)
            super().__enter__()

    monkeypatch.setattr(switches_module, "switches", Counting)
    cfg = torch._dynamo.config
    before = (cfg.capture_scalar_outputs, set(cfg.reorderable_logging_functions))
    counters.clear()
    model = ItemScale()
    fast = compiled(model)
    x = torch.ones(3)
    assert torch.equal(fast(x), model(x))
    traced = len(entered)
    assert traced >= 1 and not counters["graph_break"]  # traced under the switches: no break at .item()
    for _ in range(3):
        assert torch.equal(fast(x), model(x))
    assert len(entered) == traced  # cache hits: the switches were not touched
    assert torch.equal(fast(torch.ones(5)), model(torch.ones(5)))
    assert len(entered) > traced  # a new shape: Dynamo traced again, under the switches
    assert not counters["graph_break"]
    assert (cfg.capture_scalar_outputs, set(cfg.reorderable_logging_functions)) == before


class _Joins(nn.Module):
    """A random if (only torch.cond may run it whole) whose other side is zeros of ``dtype``: torch.cond
    refuses it when the sides' dtypes differ (float64), takes it when they agree (float32)."""

    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        if x.sum() > 0:
            y = torch.rand(3)
        else:
            y = torch.zeros(3, dtype=self.dtype)
        return y + x


def test_torch_cond_refusal_falls_back_to_python_in_a_module() -> None:
    """The same retry as for a function, where the switches are set while Dynamo traces."""
    from torchmux.frontends.mend import runtime as _mend_runtime

    model = _Joins()
    torch.manual_seed(0)
    want = model(torch.ones(3))
    fast = compiled(model)
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="torch.cond refused"):
        got = fast(torch.ones(3))
    assert torch.equal(got, want)
    assert _mend_runtime.COND is True  # the refusal is this program's: the process's switch is as it was


def test_torch_cond_refusal_is_the_programs_own() -> None:
    """One program that torch.cond refused branches in Python from then on; a program compiled after it
    keeps its ifs as torch.cond (the switch was process-wide: one refusal cost every later module its
    one-graph capture, and tests passed or failed by their order)."""
    from torch._dynamo.utils import counters

    refused = compiled(_Joins())
    with pytest.warns(UserWarning, match="torch.cond refused"):
        refused(torch.ones(3))
    model = _Joins(torch.float32)
    other = torchmux.compile(model, backend="eager")  # no reset: the refused program stays compiled beside it
    counters.clear()
    for sign in (1, -1):
        torch.manual_seed(0)
        want = model(sign * torch.ones(3))
        torch.manual_seed(0)
        assert torch.equal(other(sign * torch.ones(3)), want)
    assert not counters["graph_break"]  # both sides in one graph: torch.cond
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refused program stays in Python: no second trace refused, no warning
        for sign in (1, -1):
            torch.manual_seed(0)
            want = _Joins()(sign * torch.ones(3))
            torch.manual_seed(0)
            assert torch.equal(refused(sign * torch.ones(3)), want)


def test_class_and_other_instances_untouched() -> None:
    a, b = RandomBranch(), RandomBranch()
    original = RandomBranch.forward
    compiled(a)
    assert RandomBranch.forward is original
    assert "forward" in vars(a) and "forward" not in vars(b)
    c = RandomBranch()
    explain(c, torch.randn(2, 16))
    assert "forward" not in vars(c)  # explain gives the instance its own forward back


def test_no_source_means_no_change() -> None:
    namespace: dict = {"torch": torch}
    exec("def f(x):\n    if x.sum() > 0:\n        return x + 1\n    return x - 1\n", namespace)
    f = namespace["f"]
    assert mend(f)[0] is f
    assert torch.equal(compiled(f)(torch.ones(3)), torch.full((3,), 2.0))


def test_edited_source_file_means_no_change(tmp_path, monkeypatch) -> None:
    """The file on disk no longer holds the code that runs: its source must not be compiled instead."""
    import importlib
    import linecache

    path = tmp_path / "edited_model.py"
    path.write_text("import torch\n\n\ndef f(x):\n    if x.sum() > 0:\n        return x + 1\n    return x - 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_model")
    assert mend(module.f)[0] is not module.f  # the file matches: rewritten
    path.write_text("import torch\n\n\ndef f(x):\n    if x.sum() > 0:\n        return x + 100\n    return x - 1\n")
    linecache.checkcache(str(path))
    namespace: dict = {}
    exec(compile(path.read_text().replace("100", "1"), str(path), "exec"), namespace)  # the code that runs: + 1
    assert mend(namespace["f"])[0] is namespace["f"]
    assert torch.equal(compiled(namespace["f"])(torch.ones(2)), torch.full((2,), 2.0))


def test_torch_cond_refusal_falls_back_to_python() -> None:
    """Branches torch.cond cannot join (float32 vs float64): the if runs in Python, same answer."""
    from torchmux.frontends.mend import runtime as _mend_runtime

    def f(x):
        if x.sum() > 0:
            y = torch.rand(3)  # random: only torch.cond may run it
        else:
            y = torch.zeros(3, dtype=torch.float64)
        return y + x

    torch.manual_seed(0)
    want = f(torch.ones(3))
    fast = compiled(f)
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="torch.cond refused"):
        got = fast(torch.ones(3))
    assert torch.equal(got, want)
    assert _mend_runtime.COND is True  # off inside this function's calls only
    torch.manual_seed(0)
    want = f(-torch.ones(3))
    torch.manual_seed(0)
    assert torch.equal(fast(-torch.ones(3)), want)


class ElifChain(nn.Module):
    """An if/elif/else on tensors: the elif is an if nested in the else."""

    def forward(self, x):
        s = x.mean()
        if s > 0.5:
            y = x * 2
        elif s > -0.5:
            y = x + 1
            if x.max() > 3:
                y = y / 2
        else:
            y = -x
        return y + 1


class NestedWithUnboundName(nn.Module):
    """The nested if binds ``z`` on one side only, and ``z`` was not bound before: not lowered."""

    def forward(self, x):
        if x.sum() > 0:
            if x.max() > 1:
                z = x * 3
                x = z + 1
            x = x - 1
        return x


class NestedRandom(nn.Module):
    """The nested branch draws random numbers: it must not run when not taken, so it is not lowered."""

    def forward(self, x):
        if x.sum() > 0:
            if x.max() > 1:
                x = x + torch.rand_like(x)
            x = x * 2
        return x


@pytest.mark.parametrize("scale", [2.0, 0.1, -0.1, -2.0, 5.0])
def test_nested_and_elif_tensor_ifs_are_one_graph_with_the_same_values(scale: float) -> None:
    """Every path of an if/elif/else with an if inside, one graph with no break."""
    model = ElifChain()
    x = torch.linspace(-1, 1, 16) + scale
    report = explain(model, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert any("nested if on a tensor -> torch.where" in r for r in report.rewrites), report.rewrites
    fast = compiled(model)
    for s in (2.0, 0.1, -0.1, -2.0, 5.0):  # one compiled graph answers for every path
        x = torch.linspace(-1, 1, 16) + s
        torch.testing.assert_close(fast(x), model(x))


def test_nested_if_that_cannot_be_lowered_keeps_python_semantics() -> None:
    for model in (NestedWithUnboundName(), NestedRandom()):
        fast = compiled(model)
        for s in (3.0, 0.5, -3.0):
            x = torch.linspace(0, 1, 8) + s
            torch.manual_seed(0)
            expected = model(x)
            torch.manual_seed(0)
            torch.testing.assert_close(fast(x), expected)
        assert not any("nested" in r for r in explain(model, torch.ones(8)).rewrites)


def test_nested_if_whose_values_cannot_merge_breaks_but_stays_right() -> None:
    """Branches of different shapes cannot become a select: Python picks (a graph break), same values."""

    def f(x):
        if x.sum() > 0:
            y = x
            if x.max() > 2:
                y = x[:2]
        else:
            y = x[:3]
        return y * 2

    fast = compiled(f)
    for x in (torch.arange(4.0), torch.arange(4.0) / 10, -torch.arange(4.0)):
        torch.testing.assert_close(fast(x), f(x))


class ItemThreshold(nn.Module):
    def forward(self, x):
        if x.mean().item() > 0.1:  # Python compares the float32 mean as a double
            return x * 2
        return x - 1


def test_item_in_a_test_stays_in_the_graph_and_compares_as_python_does() -> None:
    """float32(0.1) > 0.1 in Python (0.100000001... against 0.1); a float32 comparison in the graph
    would say no. The graph compares in float64, so one graph gives Python's answer on both sides."""
    model = ItemThreshold()
    boundary = torch.tensor(0.1, dtype=torch.float32).item()
    report = explain(model, torch.full((4,), boundary))
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    fast = compiled(model)
    for v in (boundary, torch.nextafter(torch.tensor(boundary), torch.tensor(0.0)).item(), 0.5, -0.5):
        x = torch.full((4,), v, dtype=torch.float32)
        torch.testing.assert_close(fast(x), model(x), rtol=0, atol=0)
    assert torch.equal(fast(torch.full((4,), boundary)), torch.full((4,), boundary) * 2)


def test_not_of_a_tensor_test_is_one_graph() -> None:
    def f(x):
        if not x.sum() > 0:
            x = -x
        return x + 1

    assert (explain(f, torch.ones(3)).graph_break_count) == 0
    fast = compiled(f)
    for x in (torch.ones(3), -torch.ones(3)):
        torch.testing.assert_close(fast(x), f(x))


def halve_until_small(x):
    steps = torch.zeros(())
    while x.norm() > 1:
        x = x / 2
        if x.max() > 0.5:
            x = x - 0.1
        steps = steps + 1
    return x, steps


def test_while_on_a_tensor_test_is_one_graph_for_any_trip_count() -> None:
    report = explain(halve_until_small, torch.full((8,), 4.0))
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert any("torch.while_loop" in r for r in report.rewrites), report.rewrites
    fast = compiled(halve_until_small)
    for scale in (0.01, 1.0, 4.0, 1000.0):  # zero to many iterations, one graph
        x = torch.linspace(-1, 1, 8) * scale
        for got, want in zip(fast(x), halve_until_small(x)):
            torch.testing.assert_close(got, want)


def repeat_by_data(x):
    n = int(x.abs().sum().item()) % 4
    for _ in range(n):
        x = x * 0.5 + 1
    return x


def test_range_of_tensor_data_is_one_graph_for_every_count() -> None:
    report = explain(repeat_by_data, torch.ones(4))
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert any("range(<tensor data>) -> torch.while_loop" in r for r in report.rewrites), report.rewrites
    fast = compiled(repeat_by_data)
    for total in (4.0, 5.0, 6.0, 7.0):  # n = 0, 1, 2, 3
        x = torch.full((4,), total / 4)
        torch.testing.assert_close(fast(x), repeat_by_data(x))


def test_range_of_a_python_count_is_left_to_dynamo() -> None:
    def f(x, k: int):
        for _ in range(k):
            x = x + 1
        return x

    assert not any("while_loop" in r for r in explain(f, torch.ones(2), 3).rewrites)


def test_while_loops_that_cannot_be_graphs_run_as_python() -> None:
    def unbound_before(x):
        while x.sum() > 1:
            y = x / 2  # y is first bound inside: with zero iterations it stays unbound
            x = y
        return x

    def with_break(x):
        while x.sum() > 1:
            x = x / 2
            if x.max() > 100:
                break
        return x

    def python_counter(x):
        i = 0
        while x.sum() > 1:  # i is a Python int: the loop runs in Python, counting the same
            x = x / 2
            i = i + 1
        return x * i

    for f in (unbound_before, with_break, python_counter):
        fast = compiled(f)
        for scale in (0.1, 10.0):
            x = torch.ones(4) * scale
            torch.testing.assert_close(fast(x), f(x))
    assert not any("while_loop" in r for r in explain(with_break, torch.ones(4)).rewrites)
    assert not any("while_loop" in r for r in explain(unbound_before, torch.ones(4)).rewrites)


def test_impure_branches_are_left_alone() -> None:
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hits = 0
            self.seen: list[int] = []

        def forward(self, x):
            if x.sum() > 0:
                self.seen.append(1)  # a side effect: the branch may not run speculatively
                y = x + 1
            else:
                y = x - 1
            return y

    model = Counter()
    assert source_of(Counter.forward) == ""
    fast = compiled(model)
    fast(-torch.ones(3))
    assert model.seen == []
    fast(torch.ones(3))
    assert model.seen == [1]


def test_python_valued_test_runs_original_code() -> None:
    """A guard decides at run time: an int test keeps the user's if (and its else branch's exception)."""

    def f(x, n):
        if n > 0:
            return x * n
        else:
            return x @ torch.ones(5, 5)  # pure but fails for x: it must not run when n > 0

    assert source_of(f) != ""  # rewritten, guarded
    fast = compiled(f)
    assert torch.equal(fast(torch.ones(2), 3), torch.full((2,), 3.0))
    with pytest.raises(RuntimeError):
        fast(torch.ones(2), 0)


def test_user_module_submodule_with_helper_method() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def gate(self, h):
            if h.mean() > 0:
                h = torch.tanh(h)
            return h

        def forward(self, x):
            return self.gate(self.lin(x)) * 2

    model, x = Net().eval(), torch.randn(3, 8)
    with torch.no_grad():
        report = explain(model, x)
        assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
        assert any("torch.where" in r for r in report.rewrites)
        assert torch.allclose(compiled(model)(x), model(x))
        assert torch.allclose(compiled(model)(-x.abs() * 10), model(-x.abs() * 10))


def test_super_and_closures_survive() -> None:
    scale = 2.0

    class Base(nn.Module):
        def forward(self, x):
            return x + 1

    class Child(Base):
        def forward(self, x):
            print("child")
            return super().forward(x) * scale

    model = Child()
    with redirect_stdout(io.StringIO()) as out:
        got = compiled(model)(torch.ones(2))
    assert out.getvalue() == "child\n"
    assert torch.equal(got, torch.full((2,), 4.0))


# --- Hugging Face models from tiny configs -----------------------------------------------------------

transformers = pytest.importorskip("transformers")


def _wav2vec2():
    cfg = transformers.Wav2Vec2Config(
        vocab_size=32,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32, 32),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return transformers.Wav2Vec2Model(cfg).eval(), (torch.randn(1, 800),)


def _bart():
    cfg = transformers.BartConfig(
        vocab_size=1000,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return transformers.BartModel(cfg).eval(), (torch.randint(3, 1000, (1, 16)),)


HF = ["bert", "gpt2", "t5_encoder", "vit", "wav2vec2", "bart"]


@pytest.mark.parametrize("name", HF)
def test_hugging_face_model_has_no_break_and_same_outputs(name: str) -> None:
    from torchmux.bench.zoo import build, tensors_of

    model, args = {"wav2vec2": _wav2vec2, "bart": _bart}[name]() if name in ("wav2vec2", "bart") else build(name)
    with torch.no_grad():
        report = explain(model, *args)
        assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
        want = tensors_of(model(*args))
        got = tensors_of(compiled(model)(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-5, rtol=1e-4)
    assert all("forward" not in vars(m) or isinstance(vars(m)["forward"], types.MethodType) for m in model.modules())


def test_remaining_break_names_users_file_and_line() -> None:
    def f(x):
        print("norm", x.norm())
        while x.norm() > 1:  # a loop with a break statement is not rewritten: this graph break stays
            x = x / 2
            if x.max() > 1e9:
                break
        return x

    line = f.__code__.co_firstlineno + 2
    with redirect_stdout(io.StringIO()):
        report = explain(f, torch.full((4,), 3.0))
    assert report.graph_break_count >= 1
    assert any(r.filename == HERE and r.lineno == line for r in report.break_reasons), [
        str(r) for r in report.break_reasons
    ]
    assert any(r.startswith(f"{HERE}:{line - 1}: print") for r in report.rewrites), report.rewrites


def test_breaks_after_breaks_keep_their_lines() -> None:
    """Dynamo's resume functions of mended code still map every instruction to the user's line."""

    def g(y):
        if (y.abs() > 1e4).any():  # stays (a loop follows): a break, then a resume function
            raise ValueError("big")
        if y.sum() > 0:
            y = y.relu()
        else:
            y = y.tanh()
        while y.norm() > 1:  # not rewritten (a break statement): stays a graph break
            y = y / 2
            if y.max() > 1e9:
                break
        return y

    first = g.__code__.co_firstlineno
    with torch.no_grad():
        report = explain(g, torch.full((4,), 3.0))
    assert {r.lineno - first for r in report.break_reasons} == {1, 7}, [str(r) for r in report.break_reasons]
    assert all(r.line.strip() for r in report.break_reasons)


# --- tensor tests inside expressions, and/or, legacy Variable -----------------------------------------


def halve_or_double(x):
    y = x * 2 if x.sum() > 0 else x / 2
    return y + 1


def gated_by_optional_mask(x, mask=None):
    if mask is not None and mask.sum() > 2:  # `mask.sum()` must not run when mask is None
        x = x * 0
    return x + 1


def either_bound(x):
    if x.max() > 3 or x.min() < -3:
        x = x.clamp(-3, 3)
    return x


def per_row(x):
    return torch.stack([r * 2 if r.sum() > 0 else -r for r in x])


@pytest.mark.parametrize("fn", [halve_or_double, either_bound, per_row], ids=lambda f: f.__name__)
def test_tensor_tests_inside_expressions_are_one_graph(fn) -> None:
    report = explain(fn, torch.randn(3, 4))
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    fast = compiled(fn)
    for x in (torch.full((3, 4), 2.0), torch.full((3, 4), -2.0), torch.randn(3, 4) * 5, torch.randn(3, 4)):
        torch.testing.assert_close(fast(x), fn(x))


def test_and_keeps_pythons_short_circuit_on_none() -> None:
    report = explain(gated_by_optional_mask, torch.ones(4), torch.ones(4))
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    fast = compiled(gated_by_optional_mask)
    torch.testing.assert_close(fast(torch.ones(4)), torch.full((4,), 2.0))  # mask None: the tensor test never runs
    torch.testing.assert_close(fast(torch.ones(4), torch.ones(4)), torch.ones(4))
    torch.testing.assert_close(fast(torch.ones(4), torch.zeros(4)), torch.full((4,), 2.0))


def test_a_conditional_expression_with_side_effects_is_left_alone() -> None:
    def f(x, seen):
        y = seen.append(1) if x.sum() > 0 else x  # noqa: F841 - appending must not happen speculatively
        return x

    assert not any("conditional expression" in r for r in mend(f)[1].applied)


def test_legacy_variable_stays_in_the_graph() -> None:
    def f(x):
        h = Variable(torch.zeros(x.shape[0], 4), requires_grad=False)
        return x + Variable(h)

    report = explain(f, torch.ones(2, 4))
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert sum("Variable(t) -> t.detach()" in r for r in report.rewrites) == 2
    x = torch.randn(2, 4, requires_grad=True)
    got = compiled(f)(x)
    torch.testing.assert_close(got, f(x))
    assert got.requires_grad  # x's gradient still flows; only the wrapped zeros are detached


def test_variable_that_needs_grad_is_left_as_written() -> None:
    def f(x):
        return Variable(x, requires_grad=True)

    assert mend(f)[1].applied == []


class StopEarly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4)])

    def forward(self, x, limit):
        for layer in self.layers:
            x = layer(x) * 3
            if x.abs().sum() > limit:
                break
        return x


def test_for_over_layers_with_a_tensor_break_is_one_graph_with_eagers_values_and_gradients() -> None:
    torch.manual_seed(0)
    model = StopEarly()
    report = explain(model, torch.randn(2, 8), torch.tensor(1e9))
    assert (report.graph_count, report.graph_break_count, report.not_captured) == (1, 0, []), str(report)
    fast = compiled(model)
    x = torch.randn(2, 8)
    for limit in (0.0, 20.0, 35.0, 1e9):  # stops after the first layer, later, or never
        want = model(x, torch.tensor(limit))
        got = fast(x, torch.tensor(limit))
        torch.testing.assert_close(got, want)
        g_want = torch.autograd.grad(want.sum(), list(model.parameters()), allow_unused=True)
        g_got = torch.autograd.grad(got.sum(), list(model.parameters()), allow_unused=True)
        for a, b, w in zip(g_got, g_want, model.parameters()):
            # layers after the break get zero gradients where eager leaves None (as torch.cond's branch not taken)
            torch.testing.assert_close(a, b if b is not None else torch.zeros_like(w))


def test_selecting_values_already_computed_takes_no_torch_cond_and_keeps_gradients() -> None:
    # the masked loop's kept values and a conditional expression pick between tensors computed before the
    # choice: torch.where, which gives what torch.cond's backward gives (zeros to the side not taken)
    def pick(x, w):
        y = x * w
        return y.exp() if y.sum() > 0 else y.tanh()

    torch.manual_seed(0)
    model, x = StopEarly(), torch.randn(2, 8)
    for program, args in ((model, (x, torch.tensor(20.0))), (pick, (x, torch.randn(8, requires_grad=True)))):
        report = explain(program, *args)
        assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
        assert not any("cond" in op for g in report.graphs for op in g.torch_ops), report.graphs[0].torch_ops
    w = torch.randn(8, requires_grad=True)
    for sign in (1.0, -1.0):  # each side of the choice
        want = pick(sign * x, w)
        (g_want,) = torch.autograd.grad(want.sum(), w)
        got = compiled(pick)(sign * x, w)
        (g_got,) = torch.autograd.grad(got.sum(), w)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(g_got, g_want)


def test_for_with_a_break_over_impure_layers_is_left_to_python() -> None:
    model = StopEarly().train()
    model.layers[1].append(nn.Dropout(0.5))  # would draw numbers after the loop stopped
    fast = compiled(model)
    x = torch.randn(2, 8)
    torch.manual_seed(1)
    want = model(x, torch.tensor(0.0))
    torch.manual_seed(1)
    torch.testing.assert_close(fast(x, torch.tensor(0.0)), want)


def bounded_halving(x):
    i = 0
    while x.norm() > 1 and i < 10:  # a tensor test and a Python counter
        x = x / 2
        i += 1
    return x


def test_while_with_a_counter_nobody_reads_after_is_one_graph() -> None:
    report = explain(bounded_halving, torch.randn(4, 16) * 4)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    fast = compiled(bounded_halving)
    for scale in (0.01, 4.0, 1e6):  # 0 iterations, some, and stopped by the counter
        x = torch.randn(4, 16) * scale
        torch.testing.assert_close(fast(x), bounded_halving(x))


class _Window:
    """A plain helper object a module holds, with a static method in legacy style (ParityBench's ARC)."""

    def __init__(self, size: int) -> None:
        self.size = size

    @staticmethod
    def _bank(center: torch.Tensor, size: int) -> torch.Tensor:
        pixels = Variable(torch.arange(0, size) - (size - 1.0) / 2.0)
        return center[:, None] + pixels[None, :]

    def glimpse(self, x: torch.Tensor) -> torch.Tensor:
        return self._bank(x.mean(dim=1), self.size)


class _Glimpser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.window = _Window(5)
        self.lin = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.window.glimpse(x))


def test_static_method_of_a_held_object_is_mended_and_given_back() -> None:
    """``Variable(t)`` of a computed value in a ``staticmethod`` of a plain object the module holds: one
    graph (Dynamo breaks there), the same answer, and the object has its own methods back after explain."""
    model, x = _Glimpser().eval(), torch.randn(2, 4)
    report = explain(model, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert any("Variable(t) -> t.detach()" in r for r in report.rewrites)
    assert "_bank" not in vars(model.window) and "glimpse" not in vars(model.window)
    plain = explain(model, x, mend=False)
    assert plain.graph_break_count >= 1
    torch.testing.assert_close(compiled(model)(x), model(x))


class _Gates:
    @staticmethod
    def gate(h):
        if h.mean() > 0:
            h = torch.tanh(h)
        return h


def _module_gate(h):
    if h.sum() < 0:
        return h * 3
    return h


_gates_module = types.ModuleType("gates")
_gates_module.gate = _module_gate  # type: ignore[attr-defined]


class _DottedCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = _Gates.gate(self.lin(x))
        return _gates_module.gate(h) + 1


def test_a_static_method_or_module_function_called_by_its_dotted_name_is_mended_and_rebinding_it_holds() -> None:
    """``Class.static_method(x)`` and ``module.helper(x)`` are followed as ``helper(x)`` is: one graph where
    Dynamo breaks at each tensor ``if`` in them, eager's values both ways; a rebound name is called as
    rebound (the identity guard)."""
    model, x = _DottedCalls().eval(), torch.randn(3, 8)
    with torch.no_grad():
        report = explain(model, x)
        assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
        assert explain(model, x, mend=False).graph_break_count >= 2
        for v in (x, -x.abs() * 10, x.abs() * 10):
            torch.testing.assert_close(compiled(model)(v), model(v))
        original = _Gates.__dict__["gate"]
        try:
            _Gates.gate = staticmethod(lambda h: h * 0)  # type: ignore[method-assign]
            torch.testing.assert_close(compiled(model)(x), model(x))
            assert torch.equal(model(x), torch.ones(3, 8))
        finally:
            _Gates.gate = original  # type: ignore[method-assign]


def _neg_loss(pred, gt, alpha=2, beta=4):
    """CornerNet's focal loss as CenterNet-style code writes it (ParityBench's ninth sample: maudzung_SFA3D)."""
    pos_inds = gt.eq(1).float()
    neg_inds = gt.lt(1).float()
    neg_weights = torch.pow(1 - gt, beta)
    loss = 0
    pos_loss = (torch.log(pred) * torch.pow(1 - pred, alpha) * pos_inds).sum()
    neg_loss = (torch.log(1 - pred) * torch.pow(pred, alpha) * neg_weights * neg_inds).sum()
    num_pos = pos_inds.float().sum()
    if num_pos == 0:
        loss = loss - neg_loss
    else:
        loss = loss - (pos_loss + neg_loss) / num_pos
    return loss


class _HeldLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.neg_loss = _neg_loss

    def forward(self, out, target):
        return self.neg_loss(out, target)


def test_a_function_the_instance_holds_is_followed_and_the_instance_keeps_it() -> None:
    """``self.neg_loss = _neg_loss`` in ``__init__``, called as ``self.neg_loss(...)``: the function is
    mended as a global one is (its tensor ``if`` one graph, Dynamo breaks there), eager's value on both
    sides of the branch; the instance still holds the user's function, and rebinding it is obeyed."""
    model = _HeldLoss()
    pred = torch.rand(2, 3, 4, 4) * 0.9 + 0.05
    with_pos, without = torch.rand(2, 3, 4, 4), torch.rand(2, 3, 4, 4) * 0.5
    with_pos[0, 0, 0, 0] = 1
    report = explain(model, pred, with_pos)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert explain(model, pred, with_pos, mend=False).graph_break_count >= 1
    fast = compiled(model)
    for target in (with_pos, without):
        torch.testing.assert_close(fast(pred, target), model(pred, target))
    assert vars(model)["neg_loss"] is _neg_loss
    model.neg_loss = lambda p, t: (p * 0).sum()
    torch.testing.assert_close(fast(pred, with_pos), torch.tensor(0.0))


def test_each_remaining_break_kind_says_what_to_change() -> None:
    """The breaks left on real code are named at the user's line with a remedy."""
    from torchmux.api.explain import BreakReason, what_to_change

    for reason, words in (
        ("Attempted to call function marked as skipped\n  qualname: _LegacyVariableBase.__new__", "Variable(t)"),
        ("Could not guard on data-dependent expression Eq(u0, 1)", "torch._check"),
        ("frame skipped by Dynamo: Observed exception (Explanation: ...)", "backward that raises"),
        ("Attempted to call function marked as skipped", "allow_in_graph"),
        ("generic_jump SymNodeVariable()", "torch._check(len(y) > 0)"),
    ):
        assert words in what_to_change(reason)
        text = str(BreakReason(reason, "/user/model.py", 7, "y = f(x)"))
        assert text.startswith("/user/model.py:7: ") and "what to change:" in text
    assert what_to_change("something new") == ""
    assert "what to change" not in str(BreakReason("something new", "/user/model.py", 7))


class _BinarizeLinear(torch.nn.Linear):
    """BinaryNet's layer as its many forks write it (ParityBench: itayhubara_BinaryNet_pytorch)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.size(1) != 784:
            input.data = input.data.sign()
        if not hasattr(self.weight, "org"):
            self.weight.org = self.weight.data.clone()
        self.weight.data = self.weight.org.sign()
        return torch.nn.functional.linear(input, self.weight, self.bias)


class _BinaryNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = _BinarizeLinear(8, 8), _BinarizeLinear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


class _Calibrated(torch.nn.Module):
    """A quantizer that keeps a Python number computed from its first inputs (ParityBench:
    aaron_xichen_pytorch_playground's LinearQuant)."""

    def __init__(self) -> None:
        super().__init__()
        self.sf: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x.abs().max().item()
        sf = 7 - math.ceil(math.log2(v + 1e-12))
        self.sf = sf if self.sf is None else min(self.sf, sf)
        return x


class _DomainCheck(torch.nn.Module):
    """A spline flow's domain check (ParityBench: tonyduan_normalizing_flows' RQS): the code after it
    writes into a tensor and gathers with indices from the data, so the mend pass does not defer it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.min(x) < -3 or torch.max(x) > 3:
            raise ValueError("Input outside domain")
        bins = torch.sum(x[..., None] >= torch.linspace(-3, 3, 4), dim=-1) - 1
        x[..., 0] = 0
        return x.gather(-1, bins.clamp(min=0))


def _shifts(shape: np.ndarray, stride: int) -> np.ndarray:
    shift_x = (np.arange(0, shape[1]) + 0.5) * stride
    shift_y = (np.arange(0, shape[0]) + 0.5) * stride
    return np.vstack((shift_x.ravel(), shift_y.ravel()))


class _NumpyAnchors(torch.nn.Module):
    """Anchors built with NumPy from the input's size (ParityBench: yhenon_pytorch_retinanet's Anchors)."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        image_shape = np.array(image.shape[2:])
        shifts = [_shifts((image_shape + 2**x - 1) // 2**x, 8) for x in (3, 4)]
        return torch.from_numpy(np.concatenate(shifts, axis=1).astype(np.float32)).sum() + image.mean()


def test_a_check_before_code_that_acts_on_its_data_and_numpy_sizes_say_what_to_change() -> None:
    """Two more kinds left on a fresh ParityBench sample, from real captures, each with its remedy; the
    remedy given for the check is itself one graph that raises on data outside the domain."""
    check = explain(_DomainCheck(), torch.randn(2, 5))
    assert check.break_reasons and all("torch._assert_async" in r.advice for r in check.break_reasons), str(check)
    anchors = explain(_NumpyAnchors(), torch.randn(1, 3, 64, 64))
    assert anchors.break_reasons and all("Python ints" in r.advice for r in anchors.break_reasons), str(anchors)

    def asserted(x: torch.Tensor) -> torch.Tensor:  # the check as the advice writes it
        torch._assert_async(~((torch.min(x) < -3) | (torch.max(x) > 3)), "Input outside domain")
        return x * 2

    report = explain(asserted, torch.randn(2, 5))
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    with pytest.raises(RuntimeError, match="Input outside domain"):
        compiled(asserted)(torch.full((2, 5), 9.0))


def test_what_no_rewrite_can_take_is_named_with_what_to_change() -> None:
    """The kinds of break left on fresh ParityBench files, from real captures: ``x.data = ...`` on an
    activation (a break at that line), ``w.data = ...`` on a parameter (a graph that runs eagerly) and a
    Python number from the data kept on the module (a graph that runs eagerly), each with its remedy."""
    net = explain(_BinaryNet().eval(), torch.randn(2, 8))
    data = [r for r in net.break_reasons if "input.data = input.data.sign()" in r.line]
    assert data and "x = f(x.detach())" in str(data[0]), str(net)
    assert any("w.copy_(f(w.org))" in str(r) for r in net.not_captured), str(net)
    calibrated = explain(_Calibrated(), torch.randn(4, 4))
    reasons = calibrated.break_reasons + calibrated.not_captured
    assert any("calibration" in r.advice for r in reasons), str(calibrated)


def _fspecial_gauss(size: int, sigma: float) -> torch.Tensor:
    """The Gaussian window SSIM and MS-SSIM code builds with NumPy (a widely copied ``_fspecial_gauss``)."""
    x, y = np.mgrid[-size // 2 + 1 : size // 2 + 1, -size // 2 + 1 : size // 2 + 1]
    g = np.exp(-((x**2 + y**2) / (2.0 * sigma**2)))
    return torch.from_numpy(g / g.sum()).float()


class _GaussianGrids(torch.nn.Module):
    """Index grids built in ``forward`` from Python numbers: ``np.mgrid`` with int, float and complex
    (a count of points) steps, ``np.ogrid``, one slice and several (ParityBench: tneumann_minimal_glo's
    Laplacian pyramid loss builds its kernel from ``np.mgrid`` at each call)."""

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        window = _fspecial_gauss(5, 1.5)[None, None].expand(img.shape[1], 1, 5, 5)
        out = torch.nn.functional.conv2d(img, window, padding=2, groups=img.shape[1])
        ramp = torch.from_numpy(np.mgrid[0.0:1.0:0.25]).float()  # a float step: 4 points
        edge = torch.from_numpy(np.mgrid[0:1:4j, 0:2]).float()  # a count of points, the stop included
        rows, cols = np.ogrid[0:3, 0:4]
        table = torch.from_numpy(rows * 4 + cols).float()
        return torch.cat([out.flatten(), ramp, edge.flatten(), table.flatten()])  # each grid, element by element


def test_numpy_index_grids_are_built_by_what_dynamo_traces() -> None:
    """``np.mgrid`` / ``np.ogrid`` subscripts (Dynamo skips NumPy's ``nd_grid.__getitem__``: a break) are
    rebuilt from ``np.arange``/``np.linspace`` and ``np.meshgrid`` while Dynamo traces: one graph, eager's
    answer; outside a trace the runtime returns NumPy's own grid, the same values and dtypes."""
    from torchmux.frontends.mend import runtime as rt

    model, img = _GaussianGrids(), torch.randn(2, 3, 16, 16)
    torch._dynamo.reset()
    plain = torch._dynamo.explain(model)(img)
    assert plain.graph_break_count >= 1, plain  # Dynamo alone, the code as written
    report = explain(model, img)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert sum("grid[...] -> np.arange and np.meshgrid" in r for r in report.rewrites) == 4, report.rewrites
    torch.testing.assert_close(compiled(model)(img), model(img), rtol=1e-5, atol=1e-5)
    for bounds, several, sparse in [
        (((-2, 3, None), (-2, 3, None)), True, False),
        (((0.0, 1.0, 0.25),), False, False),
        (((0, 1, 4j), (0, 2, None)), True, False),
        (((0, 3, None), (0, 4, None)), True, True),
    ]:
        grid = np.ogrid if sparse else np.mgrid
        key = tuple(slice(*b) for b in bounds)
        want = grid[key if several else key[0]]
        got = rt.grid(0, grid, bounds, several, sparse)
        for w, g in zip(want if sparse else [want], got if sparse else [got]):
            assert w.dtype == g.dtype and np.array_equal(w, g)
