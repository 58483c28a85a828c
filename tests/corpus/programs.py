"""The graph-break corpus: small programs that use the Python patterns that break Dynamo graphs.

Each :class:`Program` builds a callable and its inputs and says how many graphs (and breaks) it should
give after torchmux mends it. Programs print, log and warn on purpose: the harness
(``tests/corpus/harness.py``) compares that text, the outputs and any exception with eager Python.
Programs that still break after mending say so (``breaks``) and why (``note``).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

log = logging.getLogger("torchmux.corpus")


@dataclass(frozen=True)
class Program:
    name: str
    category: str  # what kind of break it has (coverage.py reports per category)
    pattern: str  # the Python pattern it exercises
    build: Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]
    graphs: int = 1  # graph count after mending
    breaks: int = 0  # remaining break sites after mending
    note: str = ""  # why a break remains


def x16(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 16)


# --- the four programs of the "common torch.compile mistakes" article --------------------------------


class RandomBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h = nn.Linear(16, 16)

    def forward(self, x):
        if torch.rand(1) > 0.5:
            return self.h(x) + 1
        else:
            return self.h(x) - 1


class ItemUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h = nn.Linear(16, 16)

    def forward(self, x):
        y = self.h(x)
        m = y.mean().item()  # noqa: F841 - the article's program: a value computed and never used
        return y


class RangeLoop(nn.Module):
    def forward(self, x):
        out = x
        for i in range(5):
            out = out + i
        return out


class ShapeBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        if x.shape[1] == 16:
            return self.a(x)
        else:
            return self.b(x)


# --- control flow on tensor values -------------------------------------------------------------------


class IfElseAssign(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            y = x * 2
        else:
            y = x - 1
        return y.relu()


class IfNoElse(nn.Module):
    def forward(self, x):
        y = x + 1
        if x.mean() > 0:
            y = y.cos()
        return y * 3


class EarlyExit(nn.Module):
    def forward(self, x):
        if x.abs().max() > 10:
            return x.clamp(-10, 10)
        y = x * 2
        return y + 1


class TupleBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        h = self.lin(x)
        if h.norm() > 1.0:
            a, b = h.tanh(), h.sigmoid()
        else:
            a, b = h, -h
        return a + b


class BranchWithPrint(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            print("positive sum")
            y = x + 1
        else:
            print("non-positive sum")
            y = x - 1
        return y


class DropoutBranch(nn.Module):
    """A branch that draws random numbers: only the taken one may run (torch.cond)."""

    def forward(self, x):
        if x.mean() > 0:
            y = F.dropout(x, 0.5, True)
        else:
            y = x * 0.5
        return y


class GuardedIndex(nn.Module):
    """The untaken branch would raise (index out of range): it must not run (torch.cond, not torch.where)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(8, 16), requires_grad=False)

    def forward(self, x, idx):
        if (idx < 8).all():
            y = self.table[idx] + x
        else:
            y = x * 0
        return y


def helper_gate(x):
    if x.max() > 1:
        return x / x.max()
    return x


class CallsHelper(nn.Module):
    def forward(self, x):
        return helper_gate(x * 3) + 1


class Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return F.gelu(x)
        else:
            return F.silu(x)


class SubmoduleBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.gate = Gate()

    def forward(self, x):
        return self.gate(self.lin(x))


class NestedTensorIf(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            if x.max() > 2:
                x = x / 2
            x = x + 1
        return x


class ElifChain(nn.Module):
    def forward(self, x):
        s = x.mean()
        if s > 0.5:
            y = x * 2
        elif s > -0.5:
            y = x + 1
        else:
            y = -x
        return y


class NotTest(nn.Module):
    def forward(self, x):
        if not (x.sum() > 0):
            x = x.abs()
        return x * 2


class ItemAsTest(nn.Module):
    """A float compared through ``.item()``: the common way to branch on a loss or a norm."""

    def forward(self, x):
        if x.norm().item() > 4.0:
            x = x / x.norm()
        return x + 1


class IntItemAsTest(nn.Module):
    """An integer compared through ``.item()`` (argmax): compared as a symbolic int (exact), then selected
    in the graph."""

    def forward(self, x):
        if x.sum(0).argmax().item() == 3:
            x = x * 2
        return x - 1


# --- I/O inside the captured region ------------------------------------------------------------------


class PrintTensor(nn.Module):
    def forward(self, x):
        y = x * 2
        print("sum:", y.sum())
        return y + 1


class PrintFString(nn.Module):
    def forward(self, x):
        loss = (x**2).mean()
        print(f"loss {loss.item():.4f} of {x.shape}")
        return loss


class PrintShape(nn.Module):
    def forward(self, x):
        print("input", x.shape, x.size(), sep=" | ")
        return x.t()


class PercentFormat(nn.Module):
    def forward(self, x):
        y = x.exp()
        print("max %.3f min %.3f" % (y.max().item(), y.min().item()))
        return y


class LoggingInfo(nn.Module):
    def forward(self, x):
        y = torch.tanh(x)
        log.info("mean %.4f", y.mean().item())
        log.debug("not shown at INFO")
        return y * 2


class LoggingFString(nn.Module):
    def forward(self, x):
        y = x.relu()
        log.warning(f"{int((y > 0).sum())} active")
        return y


class WarnsUnconditionally(nn.Module):
    def forward(self, x):
        warnings.warn("this layer is deprecated", DeprecationWarning)
        return x * 3


class PrintInLoop(nn.Module):
    def forward(self, x):
        for i in range(3):
            x = x * 2
            print("step", i, x.sum().item())
        return x


def bump(t):
    t.add_(1)


def print_then_inplace(x):
    y = x[:2, :3] * 2
    print("before", y)
    bump(y)  # changes the printed tensor in place, in a callee
    return y


# --- .item() / .tolist() -----------------------------------------------------------------------------


class ItemForLogging(nn.Module):
    def forward(self, x):
        y = x.softmax(-1)
        top = y.max().item()
        print("top probability", top)
        return y


class TolistForLogging(nn.Module):
    def forward(self, x):
        y = x.round()
        first = y[0, :3].tolist()
        print("first row", first)
        return y


class ItemInArithmetic(nn.Module):
    def forward(self, x):
        s = x.abs().sum().item()
        return x / (s + 1.0)


def tolist_as_python(x):
    return x * len(x.argsort(-1)[0].tolist())


# --- NumPy round trips -------------------------------------------------------------------------------


def numpy_roundtrip(x):
    a = x.numpy()
    b = np.tanh(a) * 2
    return torch.from_numpy(b) + 1


def numpy_constant(x):
    scale = np.float32(math.pi)
    return x * torch.tensor(np.arange(16, dtype=np.float32)) * float(scale)


# --- checks ------------------------------------------------------------------------------------------


class RaiseCheck(nn.Module):
    def forward(self, x):
        if (x.abs() > 100).any():
            raise ValueError("input out of range")
        return x.sin()


class AssertCheck(nn.Module):
    def forward(self, x):
        y = x.exp()
        assert torch.isfinite(y).all(), "non-finite activations"
        return y.log1p()


class NotRaiseCheck(nn.Module):
    def forward(self, x):
        if not (x.std() > 0):
            raise RuntimeError(f"constant input: {x.std().item()}")
        return (x - x.mean()) / x.std()


# --- try/except, generators, closures ---------------------------------------------------------------


def try_except(x):
    try:
        y = x.exp()
    except RuntimeError:
        y = x
    return y


def generator_sum(x):
    return sum(t * t for t in x.unbind(0))


def closure_scale(x):
    factor = 3.0

    def scale(t):
        return t * factor

    return scale(x) + scale(x.flip(0))


# --- mutation of lists, dicts and attributes ---------------------------------------------------------


def list_mutation(x):
    outs = []
    for i in range(3):
        outs.append(x * i)
    outs.insert(0, x)
    return torch.stack(outs)


def dict_mutation(x):
    d = {"a": x + 1}
    d["b"] = d["a"] * 2
    d.update(c=d["b"].sin())
    return d["c"] + d.pop("a")


class AttributeMutation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        self.last_norm = x.norm()
        return x * 2


# --- recursion, loops --------------------------------------------------------------------------------


def recursive_halve(x, n=3):
    if n == 0:
        return x
    return recursive_halve(x / 2, n - 1) + 1


def data_dependent_while(x):
    while x.norm() > 1:
        x = x / 2
    return x


def data_dependent_range(x):
    n = int(x.abs().sum().item()) % 3 + 1
    for _ in range(n):
        x = x + 1
    return x


# --- dynamic output shapes ---------------------------------------------------------------------------


def boolean_mask(x):
    return x[x > 0].sum()


def nonzero_count(x):
    idx = torch.nonzero(x > 0)
    return idx.float().mean()


def unique_values(x):
    return torch.unique(x.round()).sum()


PROGRAMS: list[Program] = [
    Program("article_random_branch", "article", "if on torch.rand (article 1)", lambda: (RandomBranch(), (x16(),))),
    Program("article_item_unused", "article", ".item() never used (article 2)", lambda: (ItemUnused(), (x16(),))),
    Program("article_range_loop", "article", "for over range (article 3)", lambda: (RangeLoop(), (x16(),))),
    Program("article_shape_branch", "article", "if on a shape (article 4)", lambda: (ShapeBranch(), (x16(),))),
    Program("if_else_assign", "branches", "tensor if/else assigning a name", lambda: (IfElseAssign(), (x16(),))),
    Program("if_no_else", "branches", "tensor if without else", lambda: (IfNoElse(), (x16(),))),
    Program("early_exit", "branches", "early return on a tensor test", lambda: (EarlyExit(), (x16() * 20,))),
    Program("tuple_branch", "branches", "tensor if/else assigning a tuple", lambda: (TupleBranch(), (x16(),))),
    Program("branch_with_print", "branches", "tensor if/else with prints", lambda: (BranchWithPrint(), (x16(),))),
    Program(
        "dropout_branch", "branches", "tensor if/else drawing random numbers", lambda: (DropoutBranch(), (x16().abs(),))
    ),
    Program(
        "guarded_index",
        "branches",
        "tensor if guarding an index",
        lambda: (GuardedIndex(), (x16(), torch.tensor([1, 9, 2, 3]))),
    ),
    Program("calls_helper", "branches", "global helper with an early exit", lambda: (CallsHelper(), (x16(),))),
    Program("submodule_branch", "branches", "user submodule with a tensor if", lambda: (SubmoduleBranch(), (x16(),))),
    Program("nested_tensor_if", "branches", "nested tensor ifs", lambda: (NestedTensorIf(), (x16(),))),
    Program("elif_chain", "branches", "tensor if/elif/else", lambda: (ElifChain(), (x16(),))),
    Program("not_test", "branches", "if not <tensor test>", lambda: (NotTest(), (x16(),))),
    Program("item_as_test", "branches", ".item() of a float in an if-test", lambda: (ItemAsTest(), (x16(),))),
    Program(
        "int_item_as_test",
        "branches",
        ".item() of an integer in an if-test",
        lambda: (IntItemAsTest(), (x16(),)),
    ),
    Program("print_tensor", "effects", "print of a tensor", lambda: (PrintTensor(), (x16(),))),
    Program(
        "print_fstring", "effects", "print of an f-string with .item() and a shape", lambda: (PrintFString(), (x16(),))
    ),
    Program("print_shape", "effects", "print of shapes with sep=", lambda: (PrintShape(), (x16(),))),
    Program("percent_format", "effects", "print of a %-format with .item()", lambda: (PercentFormat(), (x16(),))),
    Program("logging_info", "effects", "logger.info/debug with .item()", lambda: (LoggingInfo(), (x16(),))),
    Program(
        "logging_fstring", "effects", "logger.warning of an f-string with int()", lambda: (LoggingFString(), (x16(),))
    ),
    Program("warns", "effects", "warnings.warn with a category", lambda: (WarnsUnconditionally(), (x16(),))),
    Program("print_in_loop", "effects", "print with .item() in an unrolled loop", lambda: (PrintInLoop(), (x16(),))),
    Program(
        "print_then_inplace",
        "effects",
        "print of a tensor changed in place later",
        lambda: (print_then_inplace, (x16(),)),
    ),
    Program("item_for_logging", "effects", ".item() only printed", lambda: (ItemForLogging(), (x16(),))),
    Program("tolist_for_logging", "effects", ".tolist() only printed", lambda: (TolistForLogging(), (x16(),))),
    Program(
        "item_in_arithmetic",
        "data-dependent ints",
        ".item() used in arithmetic",
        lambda: (ItemInArithmetic(), (x16(),)),
    ),
    Program(
        "tolist_as_python",
        "data-dependent ints",
        ".tolist() used as a Python list",
        lambda: (tolist_as_python, (x16(),)),
    ),
    Program("numpy_roundtrip", "data-dependent ints", "NumPy round trip", lambda: (numpy_roundtrip, (x16(),))),
    Program("numpy_constant", "data-dependent ints", "NumPy constants", lambda: (numpy_constant, (x16(),))),
    Program("raise_check", "checks", "if tensor: raise", lambda: (RaiseCheck(), (x16(),))),
    Program("assert_check", "checks", "assert on a tensor", lambda: (AssertCheck(), (x16(),))),
    Program("not_raise_check", "checks", "if not tensor: raise with an f-string", lambda: (NotRaiseCheck(), (x16(),))),
    Program("try_except", "python", "try/except", lambda: (try_except, (x16(),))),
    Program("generator_sum", "python", "generator expression", lambda: (generator_sum, (x16(),))),
    Program("closure", "python", "closure", lambda: (closure_scale, (x16(),))),
    Program("list_mutation", "python", "list append/insert", lambda: (list_mutation, (x16(),))),
    Program("dict_mutation", "python", "dict store/update/pop", lambda: (dict_mutation, (x16(),))),
    Program(
        "attribute_mutation", "python", "attribute mutation on the module", lambda: (AttributeMutation(), (x16(),))
    ),
    Program("recursion", "python", "recursion with a Python depth", lambda: (recursive_halve, (x16(),))),
    Program("data_dependent_while", "loops", "while on a tensor test", lambda: (data_dependent_while, (x16() * 4,))),
    Program(
        "data_dependent_range",
        "data-dependent ints",
        "range(int(tensor.item()))",
        lambda: (data_dependent_range, (x16(),)),
    ),
    Program("boolean_mask", "dynamic shapes", "boolean mask (dynamic output shape)", lambda: (boolean_mask, (x16(),))),
    Program("nonzero", "dynamic shapes", "torch.nonzero (dynamic output shape)", lambda: (nonzero_count, (x16(),))),
    Program("unique", "dynamic shapes", "torch.unique (dynamic output shape)", lambda: (unique_values, (x16(),))),
]
