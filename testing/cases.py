"""The op cases of the backend conformance suite: one small program per Core ATen op.

Each case names the ATen overload it exercises (the traced graph must contain it: the suite checks),
a function, and the shapes of its inputs. Inputs are random and never zeros: floats ~ N(0, 1) (or
positive where the op needs it), integers in range for indexing. Ops that are alike (most unary
pointwise ops) keep one case each and small shapes so the matrix stays lean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

FLOAT = "float"
POS = "positive"
INDEX = "index"  # int64 in [0, high)
BOOL = "bool"


@dataclass(frozen=True)
class Arg:
    shape: tuple[int, ...]
    kind: str = FLOAT
    high: int = 4

    def make(self, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
        if self.kind == INDEX:
            return torch.randint(0, self.high, self.shape, generator=gen)
        if self.kind == BOOL:
            return torch.randint(0, 2, self.shape, generator=gen).bool()
        t = torch.randn(self.shape, generator=gen)
        if self.kind == POS:
            t = t.abs() + 0.5
        return t.to(dtype)


@dataclass(frozen=True)
class Case:
    op: str  # the ATen overload the traced graph must contain, e.g. "aten.add.Tensor"
    fn: Callable[..., Any]
    args: Sequence[Arg]
    family: str
    tol: float = 1.0  # multiplies the dtype tolerance (ops that legitimately round differently)
    floats: bool = True  # False: runs once, in the dtype its inputs have (integer/bool ops)
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def id(self) -> str:
        return self.op.replace("aten.", "")

    def inputs(self, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return [a.make(dtype, gen) for a in self.args]

    def nonfinite_inputs(self, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
        """The same inputs with NaN, +inf and -inf planted in the first elements of each floating input
        (a "positive" input gets +inf and NaN only: its op is undefined below zero anyway)."""
        out = self.inputs(dtype, seed)
        for a, t in zip(self.args, out):
            if a.kind in (FLOAT, POS) and t.numel():
                flat = t.view(-1)
                planted = [math.nan, math.inf] if a.kind == POS else [math.nan, math.inf, -math.inf]
                for i, v in enumerate(planted[: flat.numel()]):
                    flat[i * max(1, flat.numel() // len(planted))] = v
        return out


A = Arg
X = (A((4, 8)),)
XY = (A((4, 8)), A((4, 8)))
P = (A((4, 8), POS),)
IMG = A((2, 3, 8, 8))

CASES: list[Case] = [
    # ---- pointwise, unary
    Case("aten.abs.default", torch.abs, X, "pointwise"),
    Case("aten.neg.default", torch.neg, X, "pointwise"),
    Case("aten.exp.default", torch.exp, X, "pointwise"),
    Case("aten.expm1.default", torch.expm1, X, "pointwise"),
    Case("aten.log.default", torch.log, P, "pointwise"),
    Case("aten.log1p.default", torch.log1p, P, "pointwise"),
    Case("aten.sqrt.default", torch.sqrt, P, "pointwise"),
    Case("aten.rsqrt.default", torch.rsqrt, P, "pointwise"),
    Case("aten.reciprocal.default", torch.reciprocal, P, "pointwise"),
    Case("aten.sin.default", torch.sin, X, "pointwise"),
    Case("aten.cos.default", torch.cos, X, "pointwise"),
    Case("aten.tanh.default", torch.tanh, X, "pointwise"),
    Case("aten.sigmoid.default", torch.sigmoid, X, "pointwise"),
    Case("aten.erf.default", torch.erf, X, "pointwise"),
    Case("aten.relu.default", torch.relu, X, "pointwise"),
    Case("aten.gelu.default", F.gelu, X, "pointwise"),
    Case("aten.floor.default", lambda x: torch.floor(x * 3), X, "pointwise"),
    Case("aten.ceil.default", lambda x: torch.ceil(x * 3), X, "pointwise"),
    Case("aten.round.default", lambda x: torch.round(x * 3), X, "pointwise"),
    Case("aten.sign.default", torch.sign, X, "pointwise"),
    Case("aten.pow.Tensor_Scalar", lambda x: x**3, X, "pointwise"),
    Case("aten.clamp.default", lambda x: x.clamp(-0.5, 0.5), X, "pointwise"),
    Case("aten.leaky_relu.default", lambda x: F.leaky_relu(x, 0.1), X, "pointwise"),
    Case("aten.hardtanh.default", F.hardtanh, X, "pointwise"),
    Case("aten.elu.default", F.elu, X, "pointwise"),
    # ---- pointwise, binary and comparisons (with broadcasting)
    Case("aten.add.Tensor", lambda x, y: x + y, (A((4, 8)), A((8,))), "pointwise"),
    Case("aten.sub.Tensor", lambda x, y: x - y, (A((4, 8)), A((4, 1))), "pointwise"),
    Case("aten.mul.Tensor", lambda x, y: x * y, XY, "pointwise"),
    Case("aten.div.Tensor", lambda x, y: x / y, (A((4, 8)), A((4, 8), POS)), "pointwise"),
    Case("aten.maximum.default", torch.maximum, XY, "pointwise"),
    Case("aten.minimum.default", torch.minimum, XY, "pointwise"),
    Case("aten.pow.Tensor_Tensor", torch.pow, (A((4, 8), POS), A((4, 8))), "pointwise"),
    Case("aten.fmod.Tensor", lambda x, y: torch.fmod(x * 4, y), (A((4, 8)), A((4, 8), POS)), "pointwise"),
    Case("aten.eq.Tensor", lambda x, y: torch.eq(torch.round(x), torch.round(y)), XY, "compare"),
    Case("aten.ne.Tensor", lambda x, y: torch.ne(torch.round(x), torch.round(y)), XY, "compare"),
    Case("aten.gt.Tensor", torch.gt, XY, "compare"),
    Case("aten.lt.Tensor", torch.lt, XY, "compare"),
    Case("aten.le.Tensor", torch.le, XY, "compare"),
    Case("aten.ge.Scalar", lambda x: x >= 0.1, X, "compare"),
    Case("aten.le.Scalar", lambda x: x <= 0.1, X, "compare"),
    Case("aten.gt.Scalar", lambda x: x > 0.1, X, "compare"),
    Case("aten.lt.Scalar", lambda x: x < 0.1, X, "compare"),
    Case("aten.logical_and.default", torch.logical_and, (A((4, 8), BOOL), A((4, 8), BOOL)), "compare", floats=False),
    Case("aten.logical_not.default", torch.logical_not, (A((4, 8), BOOL),), "compare", floats=False),
    Case("aten.where.self", lambda c, x, y: torch.where(c, x, y), (A((4, 8), BOOL), A((4, 8)), A((1, 8))), "pointwise"),
    Case("aten.full_like.default", lambda x: torch.full_like(x, 2.5) * x, X, "pointwise"),
    Case("aten.scalar_tensor.default", lambda x: torch.masked_fill(x, x > 0, -3.0), X, "pointwise"),
    Case("aten._to_copy.default", lambda x: (x * 4).to(torch.int32), X, "pointwise"),
    # ---- reductions
    Case("aten.sum.dim_IntList", lambda x: x.sum(-1), (A((4, 33)),), "reduction"),
    Case("aten.mean.dim", lambda x: x.mean(0), (A((6, 8)),), "reduction"),
    Case("aten.amax.default", lambda x: x.amax(-1), (A((4, 33)),), "reduction"),
    Case("aten.amin.default", lambda x: x.amin(1), (A((4, 6, 5)),), "reduction"),
    Case("aten.var.correction", lambda x: x.var(-1), (A((4, 33)),), "reduction"),
    Case("aten.argmax.default", lambda x: x.argmax(-1), (A((4, 33)),), "reduction"),
    Case("aten.prod.dim_int", lambda x: x.prod(-1), (A((4, 5), POS),), "reduction"),
    Case("aten.cumsum.default", lambda x: x.cumsum(-1), (A((4, 9)),), "reduction"),
    Case("aten.any.dim", lambda x: x.any(-1), (A((4, 8), BOOL),), "reduction", floats=False),
    # ---- matmul / linear
    Case("aten.mm.default", torch.mm, (A((8, 16)), A((16, 12))), "matmul", tol=5),
    Case("aten.bmm.default", torch.bmm, (A((2, 8, 16)), A((2, 16, 12))), "matmul", tol=5),
    Case("aten.addmm.default", lambda x, w, b: F.linear(x, w, b), (A((8, 16)), A((12, 16)), A((12,))), "matmul", tol=5),
    # ---- convolution, pooling, normalization
    Case(
        "aten.convolution.default",
        lambda x, w, b: F.conv2d(x, w, b, padding=1),
        (IMG, A((4, 3, 3, 3)), A((4,))),
        "conv",
        tol=5,
    ),
    Case("aten.max_pool2d_with_indices.default", lambda x: F.max_pool2d(x, 2), (IMG,), "conv"),
    Case("aten.avg_pool2d.default", lambda x: F.avg_pool2d(x, 2), (IMG,), "conv"),
    Case(
        "aten._native_batch_norm_legit_no_training.default",
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
        (IMG, A((3,)), A((3,), POS), A((3,)), A((3,))),
        "norm",
    ),
    Case(
        "aten.native_layer_norm.default",
        lambda x, w, b: F.layer_norm(x, (8,), w, b),
        (A((4, 8)), A((8,)), A((8,))),
        "norm",
    ),
    Case("aten._softmax.default", lambda x: torch.softmax(x, -1), (A((4, 33)),), "norm"),
    Case("aten._log_softmax.default", lambda x: torch.log_softmax(x, -1), (A((4, 33)),), "norm"),
    Case(
        "aten.native_group_norm.default",
        lambda x, w, b: F.group_norm(x, 2, w, b),
        (A((2, 4, 5, 5)), A((4,)), A((4,))),
        "norm",
    ),
    # ---- views, shape, indexing
    Case("aten.view.default", lambda x: (x + 1).view(8, 4), X, "view"),
    Case("aten.permute.default", lambda x: (x + 1).permute(2, 0, 1), (A((2, 3, 4)),), "view"),
    Case("aten.expand.default", lambda x: (x + 1).expand(3, 4, 8), (A((1, 4, 8)),), "view"),
    Case("aten.unsqueeze.default", lambda x: (x + 1).unsqueeze(1), X, "view"),
    Case("aten.squeeze.dims", lambda x: (x + 1).squeeze(1), (A((4, 1, 8)),), "view"),
    Case("aten.cat.default", lambda x, y: torch.cat([x, y], 1), (A((4, 8)), A((4, 3))), "view"),
    Case("aten.slice.Tensor", lambda x: (x + 1)[:, 2:7], X, "view"),
    Case("aten.select.int", lambda x: (x + 1)[:, 3], X, "view"),
    Case("aten.index.Tensor", lambda x, i: x[i], (A((6, 8)), A((5,), INDEX, 6)), "view"),
    Case("aten.gather.default", lambda x, i: torch.gather(x, 1, i), (A((4, 8)), A((4, 3), INDEX, 8)), "view"),
    Case("aten.embedding.default", F.embedding, (A((7,), INDEX, 10), A((10, 6))), "view"),
    Case("aten.constant_pad_nd.default", lambda x: F.pad(x, (1, 2)), X, "view"),
    Case("aten.clone.default", lambda x: x.transpose(0, 1).contiguous(), X, "view"),
    Case("aten.split_with_sizes.default", lambda x: torch.split(x, [3, 5], 1), X, "view"),
    Case("aten.arange.start_step", lambda x: x + torch.arange(8, device=x.device), X, "view"),
    Case("aten.full.default", lambda x: x + torch.full((4, 8), 2.0, device=x.device, dtype=x.dtype), X, "view"),
]

CASES_BY_OP = {c.op: c for c in CASES}
