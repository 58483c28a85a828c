"""How torchmux decides that two answers are the same: dtype-aware tolerances.

A backend's output is accepted when, for every output tensor, shapes and dtypes match and
``|out - ref| <= atol * max(1, max|ref|) + rtol * |ref|`` holds elementwise (NaNs where the reference
has NaNs; integers and booleans exactly). The absolute term scales with the output's magnitude, so
large activations are not held to an absolute 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

#: (rtol, atol) per dtype; atol is relative to max(1, max |reference|)
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (2e-4, 2e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (3e-2, 1e-2),
}


def mismatch(out: Sequence[Any], ref: Sequence[Any], scale: float = 1.0) -> str | None:
    """None if ``out`` matches ``ref``; otherwise one line saying where and by how much it differs.

    ``scale`` multiplies both tolerances (the conformance suite uses it for ops known to round differently).
    """
    out, ref = list(out), list(ref)
    if len(out) != len(ref):
        return f"returned {len(out)} outputs, expected {len(ref)}"
    for i, (o, r) in enumerate(zip(out, ref)):
        if not isinstance(r, torch.Tensor):
            if o != r and not (isinstance(o, torch.Tensor) and o.numel() == 1 and o.item() == r):
                return f"output {i}: {o!r} != {r!r}"
            continue
        if not isinstance(o, torch.Tensor):
            return f"output {i}: got {type(o).__name__}, expected a tensor"
        if tuple(o.shape) != tuple(r.shape):
            return f"output {i}: shape {tuple(o.shape)} != expected {tuple(r.shape)}"
        if o.dtype != r.dtype:
            return f"output {i}: dtype {o.dtype} != expected {r.dtype}"
        if r.numel() == 0:
            continue
        o_, r_ = o.detach().cpu(), r.detach().cpu()
        if not r.dtype.is_floating_point and not r.dtype.is_complex:
            if not torch.equal(o_, r_):
                return f"output {i}: {int((o_ != r_).sum())} of {r.numel()} elements differ (exact dtype {r.dtype})"
            continue
        rtol, atol = TOLERANCES.get(r.dtype, (1e-3, 1e-3))
        rtol, atol = rtol * scale, atol * scale
        if not r.dtype.is_complex and _close(o_, r_, rtol, atol):
            continue  # the common answer: all finite and within tolerance, in eight passes
        o64, r64 = o_.double(), r_.double()
        nan_r, nan_o = torch.isnan(r64), torch.isnan(o64)
        if not torch.equal(nan_r, nan_o):
            return (
                f"output {i}: NaN in {int((nan_r != nan_o).sum())} places where the reference has none (or the reverse)"
            )
        finite = torch.isfinite(r64)
        if not torch.equal(r64[~finite & ~nan_r], o64[~finite & ~nan_r]):
            return f"output {i}: infinities differ from the reference"
        r64, o64 = r64[finite], o64[finite]
        if r64.numel() == 0:
            continue
        peak = max(1.0, float(r64.abs().max()))
        diff = (o64 - r64).abs()
        bound = atol * peak + rtol * r64.abs()
        bad = diff > bound
        if bool(bad.any()):
            j = int(torch.argmax(diff - bound))
            return (
                f"output {i}: {int(bad.sum())} of {r.numel()} elements outside tolerance "
                f"(worst |diff| {float(diff[j]):.3g} vs allowed {float(bound[j]):.3g}, dtype {r.dtype})"
            )
    return None


def _close(o: torch.Tensor, r: torch.Tensor, rtol: float, atol: float) -> bool:
    """True when every value of ``r`` is finite and ``o`` lies within the tolerance above of it: the rule of
    :func:`mismatch`, in the outputs' own precision (float32 for 16-bit types) and about eight passes.

    A check must cost about what the call it checks costs (autotune/verify.py): the full rule, in float64
    with masks for NaN and infinities, took 45 ms on a 256x1024 float32 output, six eager calls of the
    pointwise chain it checked. Anything this refuses (a NaN, an infinity, a value out of tolerance) goes
    through the full rule, which decides and says where."""
    if r.dtype in (torch.float16, torch.bfloat16):
        o, r = o.float(), r.float()
    if r.device.type == "cpu" and r.numel() <= _SMALL:
        # on copies: a NumPy view marks a storage as never resizable again, and an output may be storage
        # its program resizes later (FSDP frees an all-gathered weight that a training graph returns)
        try:
            return _close_numpy(o.clone().numpy(), r.clone().numpy(), rtol, atol)
        except (RuntimeError, TypeError):  # a tensor NumPy cannot hold (a conjugate or negative bit): torch's way
            pass
    lo, hi = torch.aminmax(r)  # one pass; NaN if any value is NaN
    low, high = float(lo), float(hi)
    if not (math.isfinite(low) and math.isfinite(high)):
        return False
    peak = max(1.0, -low, high)
    diff = torch.sub(o, r).abs_()  # NaN or inf where o has one: refused by le() below
    bound = r.abs().mul_(rtol).add_(atol * peak)
    return bool(torch.le(diff, bound).all())


#: outputs up to this many elements are compared in NumPy: a torch op costs ~5 us of dispatch on this CPU
#: (eight of them took ~80 us on a 256-float output, more than the MLP call they checked); a NumPy
#: op ~1 us. Past it both are bound by memory and torch's ops are the ones that run in place
_SMALL = 1 << 16


def _close_numpy(o: Any, r: Any, rtol: float, atol: float) -> bool:
    """:func:`_close`'s rule on NumPy views of CPU outputs."""
    low, high = float(r.min()), float(r.max())  # NaN if any value is NaN
    if not (math.isfinite(low) and math.isfinite(high)):
        return False
    peak = max(1.0, -low, high)
    with np.errstate(invalid="ignore", over="ignore"):
        return bool((np.abs(o - r) <= np.abs(r) * rtol + atol * peak).all())
