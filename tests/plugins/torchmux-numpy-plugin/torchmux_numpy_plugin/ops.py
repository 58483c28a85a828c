"""The NumPy implementation of each Core ATen op this backend may claim: the keys are the candidates
the probe tries; claims.json lists those that passed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _axes(dims: Sequence[int] | int | None) -> tuple[int, ...] | None:
    return None if dims is None or dims == [] else tuple(dims) if isinstance(dims, (list, tuple)) else (dims,)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)


def _softmax(x: np.ndarray, dim: int, half_to_float: bool = False) -> np.ndarray:
    shifted = x - np.max(x, axis=dim, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=dim, keepdims=True)


OPS: dict[str, Callable[..., Any]] = {
    "aten.add.Tensor": lambda a, b, alpha=1: a + alpha * b if alpha != 1 else a + b,
    "aten.sub.Tensor": lambda a, b, alpha=1: a - alpha * b if alpha != 1 else a - b,
    "aten.mul.Tensor": lambda a, b: a * b,
    "aten.div.Tensor": lambda a, b: a / b,
    "aten.neg.default": np.negative,
    "aten.exp.default": np.exp,
    "aten.tanh.default": np.tanh,
    "aten.sigmoid.default": _sigmoid,
    "aten.relu.default": lambda x: np.where(x > 0, x, np.zeros_like(x)),
    "aten.permute.default": lambda x, dims: np.transpose(x, dims),
    "aten.view.default": lambda x, shape: np.reshape(x, shape),
    "aten.mm.default": lambda a, b: a @ b,
    "aten.addmm.default": lambda bias, a, b, beta=1, alpha=1: beta * bias + alpha * (a @ b),
    "aten.sum.dim_IntList": lambda x, dims, keepdim=False, dtype=None: np.sum(x, axis=_axes(dims), keepdims=keepdim),
    "aten.mean.dim": lambda x, dims, keepdim=False, dtype=None: np.mean(x, axis=_axes(dims), keepdims=keepdim),
    "aten.amax.default": lambda x, dims=(), keepdim=False: np.max(x, axis=_axes(dims), keepdims=keepdim),
    "aten._softmax.default": _softmax,
}
