"""Triton source for one fused kernel (fusion.Kernel): the prologue, one line per value, the stores.

The generated function reads like this (softmax over the last dim of a float16 [64, 33] input;
shapes are constants, strides arguments)::

    @triton.jit
    def tmx_softmax_8d0b833cbd(in0, in0_s0, in0_s1, out0, out0_s0, out0_s1,
                               BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
        pid = tl.program_id(0)
        r = pid * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]   # rows: the kept dims, flattened
        k = tl.arange(0, BLOCK_K)[None, :]                   # the whole reduced row
        rmask = r < 64
        kmask = k < 33
        i0 = r % 64
        i1 = k % 33
        v0 = tl.load(in0 + (i0)*in0_s0 + (i1)*in0_s1, mask=rmask & kmask, other=0)
        v1 = v0.to(tl.float32)
        v2 = tl.broadcast_to(v1, [BLOCK_R, BLOCK_K])
        v3 = tl.max(tl.where(kmask, v2, float('-inf')), axis=1)[:, None]
        v4 = v2 - v3
        v5 = tl.exp(v4)
        v6 = tl.sum(tl.where(kmask, v5, 0.0), axis=1)[:, None]
        v7 = v5 / v6
        v8 = v7.to(tl.float16).to(tl.float32)
        tl.store(out0 + tl.broadcast_to((i0)*out0_s0 + (i1)*out0_s1, [BLOCK_R, BLOCK_K]),
                 tl.broadcast_to(v8.to(tl.float16), [BLOCK_R, BLOCK_K]), mask=...)

Values are computed in float32 whatever the storage dtype (reductions accumulate in float32); a value
whose graph dtype is float16 or bfloat16 is rounded to it after each op, as eager rounds each op's
result, so fused code gives eager's answer. A static size is baked in as a constant; strides are
arguments, so any layout of the same shape reuses the kernel.

In a symbolic graph each symbol a kernel's sizes use is an argument too (``sym_s0``, written by
fusion.size_code, never specialized by Triton on its value): the row count, the masks and the
``i0 .. iN`` decomposition are computed from it, so one kernel serves every size. The block sizes are
chosen at each call from the actual sizes (:func:`block_config`), the grid from those::

    def tmx_softmax_..(in0, in0_s0, in0_s1, out0, out0_s0, out0_s1, sym_s0, BLOCK_R, BLOCK_K):
        ...
        rmask = r < sym_s0
        kmask = k < 33
        i0 = r % sym_s0
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from .fusion import (
    GATHERS,
    GETITEM,
    MAX_ROW,
    POINTWISE,
    POOLS,
    ROW,
    VIEW,
    ZERO,
    Idx,
    Index,
    Kernel,
    Size,
    arg_requests,
    args_of,
    cat_spans,
    classify,
    gather_requests,
    kwargs_of,
    op_key,
    pad_spans,
    pool_params,
    pool_taps,
    row_index,
    shape_of,
    size_code,
)

__all__ = ["KernelSource", "BlockConfig", "generate", "block_config", "block_candidates", "compute_type", "RULES"]

TL = {
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64",
    torch.int64: "tl.int64",
    torch.int32: "tl.int32",
    torch.int16: "tl.int16",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}
F32 = "tl.float32"


def compute_type(dtype: torch.dtype) -> str:
    """The type a value of ``dtype`` is held in inside a kernel: float32 for every float dtype."""
    if dtype.is_floating_point:
        return F32
    if dtype not in TL:
        raise NotImplementedError(f"dtype {dtype} has no Triton type here; the op runs in ATen instead")
    return TL[dtype]


def lit(v: Any) -> str:
    """A Python scalar as Triton source."""
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    raise NotImplementedError(f"constant {v!r} of type {type(v).__name__} in a fused op")


# ------------------------------------------------------------------------------------------------
# Pointwise rules: (args as source, node) -> source; args are already in the op's operand type
# ------------------------------------------------------------------------------------------------


def _tanh(x: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)"


def _pow(x: str, y: str) -> str:
    """x ** y for float32 x and y, with torch's rules for zero, negative bases and integer exponents."""
    mag = f"tl.exp2({y} * tl.log2(tl.abs({x})))"
    odd = f"(tl.floor({y} * 0.5) * 2.0 != {y})"
    neg = f"tl.where(tl.floor({y}) == {y}, tl.where({odd}, -{mag}, {mag}), float('nan'))"
    return f"tl.where({y} == 0, 1.0, tl.where({x} < 0, {neg}, {mag}))"


def _pow_scalar(a: list[str], n: fx.Node) -> str:
    x, e = a[0], args_of(n)[1]
    table = {
        1: x,
        2: f"({x} * {x})",
        3: f"({x} * {x} * {x})",
        4: f"(({x} * {x}) * ({x} * {x}))",
        0.5: f"tl.sqrt({x})",
        -1: f"(1.0 / {x})",
        -0.5: f"tl.rsqrt({x})",
        0: f"tl.where({x} == {x}, 1.0, 1.0)",
    }
    if e in table:
        return table[e]
    # a constant exponent: decide integer/odd here, so no Triton op runs on a Python constant
    mag = f"tl.exp2({lit(float(e))} * tl.log2(tl.abs({x})))"
    if float(e).is_integer():
        return f"tl.where({x} < 0, -{mag}, {mag})" if int(e) % 2 else mag
    return f"tl.where({x} < 0, float('nan'), {mag})"


def _round(x: str) -> str:  # half to even, as torch.round
    f = f"tl.floor({x} + 0.5)"
    return f"tl.where(({f} - {x} == 0.5) & ({f} * 0.5 != tl.floor({f} * 0.5)), {f} - 1.0, {f})"


def _clamp(x: str, lo: Any, hi: Any) -> str:
    if lo is not None:
        x = f"tl.where({x} < {lit(lo)}, {lit(lo)}, {x})"
    if hi is not None:
        x = f"tl.where({x} > {lit(hi)}, {lit(hi)}, {x})"
    return x


def _arg(n: fx.Node, i: int, name: str, default: Any) -> Any:
    if len(args_of(n)) > i:
        return args_of(n)[i]
    return kwargs_of(n).get(name, default)


def _alpha(y: str, n: fx.Node) -> str:
    alpha = kwargs_of(n).get("alpha", 1)
    return y if alpha == 1 else f"({y} * {lit(alpha)})"


def _gelu(a: list[str], n: fx.Node) -> str:
    x = a[0]
    if kwargs_of(n).get("approximate", _arg(n, 1, "approximate", "none")) == "tanh":
        return f"(0.5 * {x} * (1.0 + {_tanh(f'0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})')}))"
    return f"(0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476)))"


def _max_min(fn: str) -> Callable[[list[str], fx.Node], str]:
    def rule(a: list[str], n: fx.Node) -> str:
        if shape_dtype(n).is_floating_point:
            return f"tl.{fn}({a[0]}, {a[1]}, propagate_nan=tl.PropagateNan.ALL)"
        return f"tl.{fn}({a[0]}, {a[1]})"

    return rule


def _fmod(a: list[str], n: fx.Node) -> str:
    return f"({a[0]} % {a[1]})"  # Triton's % is C fmod (sign of the dividend), as torch.fmod


def _sign(a: list[str], n: fx.Node) -> str:
    x = a[0]
    if shape_dtype(n).is_floating_point:
        return f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, {x} * 0.0))"
    return f"tl.where({x} > 0, 1, tl.where({x} < 0, -1, 0))"


def _batch_norm(a: list[str], n: fx.Node) -> str:
    x, w, b, mean, var = a[:5]
    y = f"(({x} - {mean}) * (1.0 / tl.sqrt({var} + {lit(float(args_of(n)[6]))})))"
    if w != "None":
        y = f"({y} * {w})"
    return f"({y} + {b})" if b != "None" else y


_MUL = "@triton.jit\ndef _tmx_mul(a, b):\n    return a * b\n\n\n"


def shape_dtype(n: fx.Node) -> torch.dtype:
    val = n.meta["val"]
    return (val[0] if isinstance(val, (tuple, list)) else val).dtype


RULES: dict[str, Callable[[list[str], fx.Node], str]] = {
    "abs.default": lambda a, n: f"tl.abs({a[0]})",
    "neg.default": lambda a, n: f"(-{a[0]})",
    "exp.default": lambda a, n: f"tl.exp({a[0]})",
    "expm1.default": lambda a, n: f"(tl.exp({a[0]}) - 1.0)",
    "log.default": lambda a, n: f"tl.log({a[0]})",
    "log1p.default": lambda a, n: f"tl.log(1.0 + {a[0]})",
    "sqrt.default": lambda a, n: f"tl.sqrt({a[0]})",
    "rsqrt.default": lambda a, n: f"tl.rsqrt({a[0]})",
    "reciprocal.default": lambda a, n: f"(1.0 / {a[0]})",
    "sin.default": lambda a, n: f"tl.sin({a[0]})",
    "cos.default": lambda a, n: f"tl.cos({a[0]})",
    "tanh.default": lambda a, n: _tanh(a[0]),
    "sigmoid.default": lambda a, n: f"tl.sigmoid({a[0]})",
    "erf.default": lambda a, n: f"tl.erf({a[0]})",
    "relu.default": lambda a, n: f"tl.where({a[0]} < 0, 0, {a[0]})",
    "gelu.default": _gelu,
    "floor.default": lambda a, n: f"tl.floor({a[0]})" if shape_dtype(n).is_floating_point else a[0],
    "ceil.default": lambda a, n: f"tl.ceil({a[0]})" if shape_dtype(n).is_floating_point else a[0],
    "round.default": lambda a, n: _round(a[0]) if shape_dtype(n).is_floating_point else a[0],
    "sign.default": _sign,
    "pow.Tensor_Scalar": _pow_scalar,
    "pow.Tensor_Tensor": lambda a, n: _pow(a[0], a[1]),
    "clamp.default": lambda a, n: _clamp(a[0], _arg(n, 1, "min", None), _arg(n, 2, "max", None)),
    "hardtanh.default": lambda a, n: _clamp(a[0], _arg(n, 1, "min_val", -1.0), _arg(n, 2, "max_val", 1.0)),
    "leaky_relu.default": lambda a, n: (
        f"tl.where({a[0]} > 0, {a[0]}, {a[0]} * {lit(_arg(n, 1, 'negative_slope', 0.01))})"
    ),
    "elu.default": lambda a, n: (
        f"tl.where({a[0]} > 0, {a[0]} * {lit(float(_arg(n, 2, 'scale', 1.0)))}, "
        f"(tl.exp({a[0]} * {lit(float(_arg(n, 3, 'input_scale', 1.0)))}) - 1.0) * "
        f"{lit(float(_arg(n, 1, 'alpha', 1.0)) * float(_arg(n, 2, 'scale', 1.0)))})"
    ),
    "add.Tensor": lambda a, n: f"({a[0]} + {_alpha(a[1], n)})",
    "add.Scalar": lambda a, n: f"({a[0]} + {_alpha(a[1], n)})",
    "sub.Tensor": lambda a, n: f"({a[0]} - {_alpha(a[1], n)})",
    "sub.Scalar": lambda a, n: f"({a[0]} - {_alpha(a[1], n)})",
    "mul.Tensor": lambda a, n: f"({a[0]} * {a[1]})",
    "mul.Scalar": lambda a, n: f"({a[0]} * {a[1]})",
    "div.Tensor": lambda a, n: f"({a[0]} / {a[1]})",
    "div.Scalar": lambda a, n: f"({a[0]} / {a[1]})",
    "maximum.default": _max_min("maximum"),
    "minimum.default": _max_min("minimum"),
    "fmod.Tensor": _fmod,
    "fmod.Scalar": _fmod,
    "eq.Tensor": lambda a, n: f"({a[0]} == {a[1]})",
    "eq.Scalar": lambda a, n: f"({a[0]} == {a[1]})",
    "ne.Tensor": lambda a, n: f"({a[0]} != {a[1]})",
    "ne.Scalar": lambda a, n: f"({a[0]} != {a[1]})",
    "gt.Tensor": lambda a, n: f"({a[0]} > {a[1]})",
    "gt.Scalar": lambda a, n: f"({a[0]} > {a[1]})",
    "lt.Tensor": lambda a, n: f"({a[0]} < {a[1]})",
    "lt.Scalar": lambda a, n: f"({a[0]} < {a[1]})",
    "ge.Tensor": lambda a, n: f"({a[0]} >= {a[1]})",
    "ge.Scalar": lambda a, n: f"({a[0]} >= {a[1]})",
    "le.Tensor": lambda a, n: f"({a[0]} <= {a[1]})",
    "le.Scalar": lambda a, n: f"({a[0]} <= {a[1]})",
    "logical_and.default": lambda a, n: f"({a[0]} & {a[1]})",
    "logical_or.default": lambda a, n: f"({a[0]} | {a[1]})",
    "logical_not.default": lambda a, n: f"({a[0]} == 0)",
    "where.self": lambda a, n: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    "_to_copy.default": lambda a, n: a[0],
    "clone.default": lambda a, n: a[0],
    "alias.default": lambda a, n: a[0],
    "_native_batch_norm_legit_no_training.default": _batch_norm,
}
_COMPARE = {"eq", "ne", "gt", "lt", "ge", "le"}
_LOGICAL = {"logical_and", "logical_or", "logical_not"}


def operand_types(node: fx.Node) -> list[str]:
    """The type each positional argument is converted to before the op's rule applies."""
    key = op_key(node)
    base = key.split(".")[0]
    out_t = compute_type(shape_dtype(node))
    if base in _LOGICAL:
        return ["tl.int1"] * len(args_of(node))
    if base in _COMPARE or key in ("_to_copy.default", "clone.default", "alias.default"):
        dtypes = [a.meta["val"].dtype for a in args_of(node) if isinstance(a, fx.Node)]
        if base in _COMPARE:
            if any(isinstance(a, float) for a in args_of(node)[1:]) and not any(d.is_floating_point for d in dtypes):
                dtypes.append(torch.float32)
            promoted = dtypes[0]
            for d in dtypes[1:]:
                promoted = torch.promote_types(promoted, d)
            return [compute_type(promoted)] * len(args_of(node))
        return [compute_type(dtypes[0])]
    if key == "where.self":
        return ["tl.int1", out_t, out_t]
    return [out_t] * len(args_of(node))


def cast(var: str, have: str, want: str) -> str:
    if have == want:
        return var
    if want == "tl.int1":
        return f"({var} != 0)"
    return f"{var}.to({want})"


# ------------------------------------------------------------------------------------------------
# The emitter
# ------------------------------------------------------------------------------------------------


def _pow2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


@dataclass(frozen=True)
class BlockConfig:
    block_r: int
    block_k: int
    num_warps: int
    programs: int


def rows_of(kernel: Kernel) -> Size:
    """How many rows (kept elements) the kernel's domain has: an int, or a symbolic expression."""
    n: Size = 1
    for d, s in enumerate(kernel.domain.shape):
        if d not in kernel.domain.reduced:
            n = n * s
    return n


def block_config(kernel: Kernel, interpret: bool, rows: int | None = None, row_len: int | None = None) -> BlockConfig:
    """Block sizes by heuristic. The interpreter likes few, large programs (NumPy does the work); a GPU
    likes ~1-4K elements per program and a whole row per program for reductions.

    A symbolic kernel passes the call's ``rows`` and ``row_len``. Its row block does not follow the row
    count (each block size is a separate Triton binary): a pointwise kernel always takes the largest
    block, a reduction the largest that fits its row block, which is the one size that varies (one
    binary per power of two of the row length seen)."""
    reduced, symbolic = kernel.domain.reduced, not kernel.domain.is_static
    rows = int(rows_of(kernel)) if rows is None else rows
    if not reduced:
        cap = 1 << 14 if interpret else 1024
        block = max(cap if symbolic else min(_pow2(rows), cap), 16)
        return BlockConfig(block, 1, 4 if block <= 1024 else 8, max(1, -(-rows // block)))
    row_len = int(kernel.domain.row_len) if row_len is None else row_len
    block_k = max(2, _pow2(row_len))
    assert row_len <= MAX_ROW
    budget = (1 << 14) if interpret else 4096
    block_r = max(2, budget // block_k if symbolic else min(_pow2(rows), budget // block_k))
    elems = block_r * block_k
    warps = 4 if elems <= 4096 else 8 if elems <= 8192 else 16
    return BlockConfig(block_r, block_k, warps, max(1, -(-rows // block_r)))


def block_candidates(kernel: Kernel, interpret: bool) -> list[BlockConfig]:
    """The heuristic's choice first, then neighbours for a small autotune (mode="max-autotune").
    A symbolic kernel has none: its blocks follow each call's sizes."""
    if not kernel.domain.is_static:
        return []
    best = block_config(kernel, interpret)
    rows = int(rows_of(kernel))
    out = [best]
    for factor in (0.5, 2, 4):
        block_r = int(best.block_r * factor)
        if block_r < 2 or block_r * best.block_k > (1 << 15) or block_r > max(16, _pow2(rows)):
            continue
        elems = block_r * best.block_k
        warps = 4 if elems <= 4096 else 8 if elems <= 8192 else 16
        cfg = BlockConfig(block_r, best.block_k, warps, max(1, -(-rows // block_r)))
        if cfg not in out:
            out.append(cfg)
    return out


@dataclass
class KernelSource:
    name: str
    source: str
    inputs: list[fx.Node]  # tensors loaded, in argument order (each followed by its strides)
    outputs: list[fx.Node]  # tensors stored, in argument order (each followed by its strides)
    config: BlockConfig | None  # None for a symbolic domain: block_config() at each call
    ops: int = 0
    candidates: list[BlockConfig] = field(default_factory=list)  # for the small autotune
    kernel: Kernel | None = None  # what it computes (the runtime's ATen path, the call's block sizes)
    symbols: list[str] = field(default_factory=list)  # the symbols passed after the strides, in order


@dataclass
class _Emitter:
    kernel: Kernel
    lines: list[str] = field(default_factory=list)
    cache: dict[tuple[fx.Node, int | None, Index], tuple[str, str]] = field(default_factory=dict)
    loads: dict[fx.Node, int] = field(default_factory=dict)
    rows: dict[fx.Node, list[tuple[str, str]]] = field(default_factory=dict)
    helpers: set[str] = field(default_factory=set)  # @triton.jit helpers the kernel calls
    counter: int = 0

    def __post_init__(self) -> None:
        self.dom = self.kernel.domain
        self.reduction = bool(self.dom.reduced)
        self.inside = self.kernel.node_set

    # ------------------------------------------------------------------ helpers
    def new(self, code: str) -> str:
        var = f"v{self.counter}"
        self.counter += 1
        self.lines.append(f"{var} = {code}")
        return var

    def shape(self, dims: frozenset[int]) -> str:
        if not self.reduction:
            return "[BLOCK_R]" if dims else "[1]"
        rows = any(d not in self.dom.reduced for d in dims)
        ks = any(d in self.dom.reduced for d in dims)
        return f"[{'BLOCK_R' if rows else 1}, {'BLOCK_K' if ks else 1}]"

    def mask(self, dims: frozenset[int]) -> str | None:
        parts = []
        if any(d not in self.dom.reduced for d in dims):
            parts.append("rmask")
        if any(d in self.dom.reduced for d in dims):
            parts.append("kmask")
        return " & ".join(parts) or None

    @staticmethod
    def dims_of(index: Index) -> frozenset[int]:
        out: frozenset[int] = frozenset()
        for i in index:
            out |= i.dims
        return out

    def offset(self, base: str, index: Index) -> str:
        terms = [f"({i.code})*{base}_s{d}" for d, i in enumerate(index) if i != ZERO]
        if not terms:
            return f"tl.zeros({self.shape(frozenset())}, tl.int32)"
        return " + ".join(terms)

    # ------------------------------------------------------------------ values
    def value(self, node: fx.Node, output: int | None, index: Index) -> tuple[str, str]:
        """(variable, Triton type) of ``node`` (its ``output``) at ``index``."""
        key = (node, output, index)
        if key in self.cache:
            return self.cache[key]
        if node not in self.inside:
            res = self.load(node, index)
        else:
            kind = classify(node)
            if kind == ROW:
                assert index == row_index(node, output or 0, self.dom), f"{node.format_node()} read off its row"
                res = self.rowwise(node)[output or 0]
            elif kind == GETITEM:
                res = self.value(args_of(node)[0], args_of(node)[1], index)
            elif kind == VIEW:
                [(src, o, src_index)] = arg_requests(node, index, self.dom)  # type: ignore[misc]
                res = self.value(src, o, src_index)
            else:
                res = self.pointwise(node, index)
        self.cache[key] = res
        return res

    def load(self, node: fx.Node, index: Index) -> tuple[str, str]:
        if node not in self.loads:
            self.loads[node] = len(self.loads)
        base = f"in{self.loads[node]}"
        dtype = node.meta["val"].dtype
        dims = self.dims_of(index)
        m = self.mask(dims)
        mask = f", mask={m}, other=0" if m else ""
        var = self.new(f"tl.load({base} + {self.offset(base, index)}{mask})")
        t = compute_type(dtype)
        if t != TL[dtype]:
            var = self.new(f"{var}.to({t})")
        return var, t

    def pointwise(self, node: fx.Node, index: Index) -> tuple[str, str]:
        key = op_key(node)
        dtype = shape_dtype(node)
        out_t = compute_type(dtype)
        if key in ("full.default", "scalar_tensor.default"):
            value = args_of(node)[1] if key == "full.default" else args_of(node)[0]
            return self.new(f"tl.full({self.shape(frozenset())}, {lit(value)}, {out_t})"), out_t
        if key.startswith("arange."):
            a = args_of(node)
            start, step = (0, 1) if key == "arange.default" else (a[0], a[2] if len(a) > 2 else 1)
            i = index[0] if index else ZERO
            if i == ZERO:
                return self.new(f"tl.full({self.shape(frozenset())}, {lit(start)}, {out_t})"), out_t
            return self.new(f"({i.code}).to({out_t}) * {lit(step)} + {lit(start)}"), out_t
        if key in ("constant_pad_nd.default", "cat.default"):
            return self.pad_or_cat(node, index), out_t
        if key in GATHERS:
            return self.gathered(node, index)
        if key in POOLS:
            return self.pool(node, index), out_t
        types = operand_types(node)
        reqs = iter(arg_requests(node, index, self.dom) or [])
        args: list[str] = []
        for a, want in zip(args_of(node), types):
            if isinstance(a, fx.Node):
                src, o, src_index = next(reqs)
                var, have = self.value(src, o, src_index)
                args.append(cast(var, have, want))
            else:
                args.append(lit(a))
        code = RULES[key](args, node)
        if key == "_to_copy.default":
            code = cast(code, types[0], out_t)
        var = code if code.isidentifier() else self.new(code)
        return self.rounded(var, dtype), out_t

    def gathered(self, node: fx.Node, index: Index) -> tuple[str, str]:
        """Load the integer index, wrap negatives as torch does, then load the source there."""

        def data(t: fx.Node, t_index: Index) -> Idx:
            var, _ = self.value(t, None, t_index)
            src = args_of(node)[0]
            dim = 0 if op_key(node) != "gather.default" else args_of(node)[1] % len(shape_of(src))
            size = size_code(shape_of(src)[dim]) if shape_of(src) else "1"
            wrapped = self.new(f"tl.where({var} < 0, {var} + {size}, {var})")
            return Idx(wrapped, self.dims_of(t_index))

        reqs = gather_requests(node, index, data)
        return self.value(*reqs[-1])

    def pool(self, node: fx.Node, index: Index) -> str:
        """A 2-d pooling window, unrolled: one load per tap; padding taps are masked out by a where."""
        is_max = op_key(node) == "max_pool2d_with_indices.default"
        pad = "float('-inf')" if is_max else "0.0"
        parts = []
        for tap, conds in pool_taps(node, index):
            v = cast(*self.value(args_of(node)[0], None, tap), F32)
            if "False" in conds:
                v = pad
            elif conds:
                v = f"tl.where({' & '.join(conds)}, {v}, {pad})"
            parts.append(v)
        if is_max:
            acc = parts[0]
            for p in parts[1:]:
                acc = self.new(f"tl.maximum({acc}, {p}, propagate_nan=tl.PropagateNan.ALL)")
            return self.rounded(acc if acc not in parts else self.new(acc), shape_dtype(node))
        kernel, _, _, _, _ = pool_params(node)
        a = list(args_of(node)) + [None] * 8
        count_pad = True if a[5] is None else bool(a[5])
        if a[6] is not None:
            divisor = lit(float(a[6]))
        elif count_pad:
            divisor = lit(float(kernel[0] * kernel[1]))
        else:  # the taps that are not padding
            terms = [
                f"tl.where({' & '.join(c)}, 1.0, 0.0)" if c and "False" not in c else ("0.0" if c else "1.0")
                for _, c in pool_taps(node, index)
            ]
            divisor = self.new(" + ".join(terms))
        return self.rounded(self.new(f"({' + '.join(parts)}) / {divisor}"), shape_dtype(node))

    def pad_or_cat(self, node: fx.Node, index: Index) -> str:
        """Loads at clamped (always valid) indices, then a ``tl.where`` on the position picks the answer."""
        out_t = compute_type(shape_dtype(node))
        vals = [cast(*self.value(a, o, i), out_t) for a, o, i in arg_requests(node, index, self.dom) or []]
        if op_key(node) == "constant_pad_nd.default":
            fill = lit(args_of(node)[2] if len(args_of(node)) > 2 else kwargs_of(node).get("value", 0))
            conds = []
            for d, lo, size in pad_spans(node):
                i = index[d]
                if i == ZERO:
                    if not isinstance(size, int):
                        raise NotImplementedError("a symbolic padded span at a size-1 position")
                    if not lo <= 0 < lo + size:
                        return self.new(f"tl.full({self.shape(frozenset())}, {fill}, {out_t})")
                    continue
                conds.append(f"(({i.code}) >= {lo}) & (({i.code}) < {size_code(lo + size)})")
            return self.new(f"tl.where({' & '.join(conds)}, {vals[0]}, {fill})") if conds else vals[0]
        dim, spans = cat_spans(node)
        i = index[dim]
        if i == ZERO:  # the output has one position along dim: the first non-empty input holds it
            return vals[next(j for j, (_, _, size) in enumerate(spans) if size != 0)]
        res = vals[-1]
        for j in range(len(spans) - 2, -1, -1):
            res = self.new(f"tl.where(({i.code}) < {size_code(spans[j + 1][1])}, {vals[j]}, {res})")
        return res

    def rounded(self, var: str, dtype: torch.dtype) -> str:
        """Round a float32 value to a narrower graph dtype, as eager stores each op's result."""
        if dtype in (torch.float16, torch.bfloat16):
            return self.new(f"{var}.to({TL[dtype]}).to(tl.float32)")
        return var

    def rowwise(self, node: fx.Node) -> list[tuple[str, str]]:
        if node in self.rows:
            return self.rows[node]
        key = op_key(node)
        reqs = arg_requests(node, self.dom.full_index(), self.dom) or []
        x, have = self.value(*reqs[0])
        x = self.new(f"tl.broadcast_to({cast(x, have, F32)}, [BLOCK_R, BLOCK_K])")
        row_len = self.dom.row_len
        n = lit(float(row_len)) if isinstance(row_len, int) else f"{size_code(row_len)}.to(tl.float32)"

        def total(v: str) -> str:
            return self.new(f"tl.sum(tl.where(kmask, {v}, 0.0), axis=1)[:, None]")

        outs: list[str]
        types = [F32]
        if key == "argmax.default":  # the first maximal lane, as torch
            types = ["tl.int64"]
            outs = [self.new(f"tl.argmax(tl.where(kmask, {x}, float('-inf')), axis=1).to(tl.int64)[:, None]")]
        elif key == "any.dim":
            types = ["tl.int1"]
            outs = [self.new(f"tl.max(tl.where(kmask, {x}, 0.0), axis=1)[:, None] != 0")]
        elif key == "prod.dim_int":
            self.helpers.add(_MUL)
            outs = [self.new(f"tl.reduce(tl.where(kmask, {x}, 1.0), 1, _tmx_mul)[:, None]")]
        elif key == "cumsum.default":
            outs = [self.new(f"tl.cumsum(tl.where(kmask, {x}, 0.0), axis=1)")]
        elif key in ("sum.dim_IntList", "sum.default"):
            outs = [total(x)]
        elif key in ("mean.dim", "mean.default"):
            outs = [self.new(f"{total(x)} / {n}")]
        elif key in ("amax.default", "amin.default"):
            fn, init = ("max", "float('-inf')") if key == "amax.default" else ("min", "float('inf')")
            outs = [self.new(f"tl.{fn}(tl.where(kmask, {x}, {init}), axis=1)[:, None]")]
        elif key == "var.correction":
            corr = float(
                kwargs_of(node).get("correction", 1) if kwargs_of(node).get("correction", 1) is not None else 1
            )
            mean = self.new(f"{total(x)} / {n}")
            d = self.new(f"tl.where(kmask, {x} - {mean}, 0.0)")
            dof = (
                lit(max(0.0, float(row_len) - corr))
                if isinstance(row_len, int)
                else f"tl.maximum({n} - {lit(corr)}, 0.0)"
            )
            outs = [self.new(f"{total(f'{d} * {d}')} / {dof}")]
        elif key in ("_softmax.default", "_log_softmax.default"):
            mx = self.new(f"tl.max(tl.where(kmask, {x}, float('-inf')), axis=1)[:, None]")
            z = self.new(f"{x} - {mx}")
            e = self.new(f"tl.exp({z})")
            s = total(e)
            outs = [self.new(f"{e} / {s}" if key == "_softmax.default" else f"{z} - tl.log({s})")]
        elif key in ("native_layer_norm.default", "native_group_norm.default"):
            layer = key == "native_layer_norm.default"
            a = args_of(node)
            eps, weight, bias = (a[4], a[2], a[3]) if layer else (a[7], a[1], a[2])
            mean = self.new(f"{total(x)} / {n}")
            d = self.new(f"tl.where(kmask, {x} - {mean}, 0.0)")
            var = self.new(f"{total(f'{d} * {d}')} / {n}")
            rstd = self.new(f"1.0 / tl.sqrt({var} + {lit(float(eps))})")
            y = self.new(f"{d} * {rstd}")
            affine = {id(a[0]): a for a in reqs[1:]}
            for arg, op in ((weight, "*"), (bias, "+")):
                if isinstance(arg, fx.Node):
                    w, wt = self.value(*affine[id(arg)])
                    y = self.new(f"{y} {op} {cast(w, wt, F32)}")
            outs = [y, mean, rstd]
        else:  # pragma: no cover - fusion.ROWWISE and this list agree
            raise NotImplementedError(key)
        vals = node.meta["val"] if isinstance(node.meta["val"], (tuple, list)) else [node.meta["val"]]
        res = [(self.rounded(v, t.dtype) if ty == F32 else v, ty) for v, t, ty in zip(outs, vals, types * len(outs))]
        self.rows[node] = res
        return res

    # ------------------------------------------------------------------ stores
    def store(self, j: int, node: fx.Node, index: Index) -> None:
        var, have = self.value(node, None, index)
        dtype = node.meta["val"].dtype
        dims = self.dims_of(index)
        ks = bool(dims & set(self.dom.reduced))
        conds = []
        for d, s in enumerate(self.dom.shape):
            if s == 1 or d in dims or (d in self.dom.reduced and not ks):
                continue  # (a row value has one lane per row already)
            conds.append(f"(i{d} == 0)")  # a broadcast dim: store once, at 0
        shape = f"[BLOCK_R, {'BLOCK_K' if ks else 1}]" if self.reduction else "[BLOCK_R]"
        mask = " & ".join(["rmask"] + (["kmask"] if ks else []) + conds)
        base = f"out{j}"
        value = cast(var, have, TL[dtype])
        self.lines.append(
            f"tl.store({base} + tl.broadcast_to({self.offset(base, index)}, {shape}), "
            f"tl.broadcast_to({value}, {shape}), mask=tl.broadcast_to({mask}, {shape}))"
        )


def kernel_name(kernel: Kernel, body: str) -> str:
    """``tmx_<first ops>_<hash of the source>``: equal kernels get equal names, in every graph and process."""
    tags: list[str] = []
    for n in kernel.nodes:
        if classify(n) in (POINTWISE, ROW):
            tag = op_key(n).split(".")[0].strip("_").replace("native_", "").replace("_legit_no_training", "")
            if tag not in tags:
                tags.append(tag)
    digest = hashlib.sha256(body.encode()).hexdigest()[:10]
    return f"tmx_{'_'.join(tags[:3])}_{digest}"


def generate(kernel: Kernel, interpret: bool) -> KernelSource:
    """The source of ``kernel`` as a module defining one @triton.jit function (see :func:`kernel_name`)."""
    em = _Emitter(kernel)
    for j, (node, index) in enumerate(kernel.stores):
        em.store(j, node, index)
    dom = kernel.domain
    cfg = block_config(kernel, interpret) if dom.is_static else None
    kept = [d for d, s in enumerate(dom.shape) if s != 1 and d not in dom.reduced]
    red = [d for d, s in enumerate(dom.shape) if s != 1 and d in dom.reduced]
    # (a symbolic domain of 2**31 elements or more runs in ATen: the runtime checks each call)
    wide = dom.is_static and math.prod(dom.shape) >= 2**31
    pro = ["pid = tl.program_id(0)"]
    if dom.reduced:
        pro += ["r = pid * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]", "k = tl.arange(0, BLOCK_K)[None, :]"]
    else:
        pro += ["r = pid * BLOCK_R + tl.arange(0, BLOCK_R)"]
    if wide:
        pro.append("r = r.to(tl.int64)")
    pro.append(f"rmask = r < {size_code(rows_of(kernel))}")
    if dom.reduced:
        pro.append(f"kmask = k < {size_code(dom.row_len)}")
    for var, dims in (("r", kept), ("k", red)):
        inner: Size = 1
        for d in reversed(dims):
            size = size_code(dom.shape[d])
            pro.append(f"i{d} = ({var} // {size_code(inner)}) % {size}" if inner != 1 else f"i{d} = {var} % {size}")
            inner = inner * dom.shape[d]
    params: list[str] = []
    inputs = sorted(em.loads, key=em.loads.get)  # type: ignore[arg-type]
    for j, node in enumerate(inputs):
        params += [f"in{j}"] + [f"in{j}_s{d}" for d in range(len(shape_of(node)))]
    for j, (node, _) in enumerate(kernel.stores):
        params += [f"out{j}"] + [f"out{j}_s{d}" for d in range(len(shape_of(node)))]
    body = "\n".join("    " + line for line in pro + em.lines)
    symbols = sorted(set(re.findall(r"\bsym_(\w+)\b", body)))
    params += [f"sym_{sym}" for sym in symbols]
    params += ["BLOCK_R: tl.constexpr", "BLOCK_K: tl.constexpr"]
    ops = sum(1 for n in kernel.nodes if classify(n) in (POINTWISE, ROW))
    name = kernel_name(kernel, f"{params}\n{body}\n{sorted(em.helpers)}")
    # a size is not specialized on its value (Triton would compile again for 1 and multiples of 16)
    jit = f"@triton.jit(do_not_specialize={[f'sym_{sym}' for sym in symbols]})" if symbols else "@triton.jit"
    source = (
        f"# torchmux triton kernel: {ops} ops over {list(dom.shape)}"
        f"{f', reducing dims {list(dom.reduced)}' if dom.reduced else ''}\n"
        f"# ops: {', '.join(op_key(n) for n in kernel.nodes)}\n"
        "import triton\nimport triton.language as tl\n\n\n"
        + "".join(sorted(em.helpers))
        + f"{jit}\ndef {name}({', '.join(params)}):\n{body}\n"
    )
    return KernelSource(
        name,
        source,
        inputs,
        [n for n, _ in kernel.stores],
        cfg,
        ops,
        block_candidates(kernel, interpret),
        kernel,
        symbols,
    )
