"""Grouping: cut a normalized graph into fused kernels and external ATen calls.

Pure Python over the fx graph (no Triton import), so the cheap backend module can ask it what the
code generator handles.

**Kernels.** A kernel iterates over one *domain*: a static shape ``S`` and a set of reduced dims
``D`` (empty for a pointwise kernel). A program owns ``BLOCK_R`` rows (the flattened kept dims) and,
in a reduction kernel, a whole row (the flattened reduced dims, ``BLOCK_K >= K``), so a reduction's
result lives in registers next to the row it came from: softmax, layer norm, RMS norm and
``x - x.mean(-1, keepdim=True)`` become one kernel each.

**Indexing.** Every value in a kernel is a function of an *index*: one expression per dim of the
value, over the domain's coordinates ``i0 .. iN`` (Inductor's loader style). A pointwise op asks for
its arguments at the broadcast of its own index; a view (permute, expand, unsqueeze, squeeze, slice,
select, a view that only adds or drops size-1 dims) rewrites the index; padding and concatenation
read at clamped indices under a ``tl.where``; embedding, gather and ``x[i]`` read at a position loaded
from their index tensor. A value from outside the kernel (a graph input, an ATen result, an earlier
kernel's buffer) is loaded through its strides, so broadcasting, transposed and sliced inputs cost
nothing. A *row-resident* value (a reduction, softmax, layer norm, cumsum) exists only at its row
index: a consumer that asks for it anywhere else cannot join the kernel, which then ends and its
values go to memory. Rows longer than ``MAX_ROW`` are reduced by ATen.

**External ATen calls.** Matmuls and convolutions (``mm``, ``addmm``, ``bmm``, ``convolution``), views
of values that are already in memory (free: ATen returns a strided alias), reshapes that regroup dims
and ``split`` run as ATen calls between kernels.

**Grouping** is greedy in graph order with one open kernel: a node joins it if the kernel's domain can
take it (a pointwise kernel grows by broadcasting, or moves to a padded shape; a reduction fixes the
domain) and every node that may have to be stored still has an index that visits each of its elements
once. An ATen call that reads the open kernel's values closes it first.

**Symbolic sizes.** In a symbolic graph (core/ir.py, "Symbolic dimensions") a size is a sympy
expression of Dynamo's symbols (``s0``, ``2*s0``) instead of an int (:data:`Size`). Grouping treats it
like any size: two dims agree when their expressions are equal, and a symbol is never 1 (Dynamo
specializes 0 and 1). In source a size is written by :func:`size_code`: ``sym_s0`` names the kernel
argument that carries the symbol's value at run time, so one kernel serves every size. A symbolic row
length is not known to fit ``MAX_ROW`` until the call: the runtime checks it then.

The pass is ``plan(graph) -> list[Kernel | Extern]``: the steps in an order that respects every
dependency. Each kernel lists the nodes it computes and, once closed, the ones it stores.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

__all__ = [
    "Idx",
    "Size",
    "size_code",
    "is_static_size",
    "Domain",
    "Kernel",
    "Extern",
    "plan",
    "classify",
    "FUSIBLE_POINTWISE",
    "ROWWISE",
    "INDEX_VIEWS",
    "EXTERN_OPS",
    "HANDLED_OPS",
    "MAX_ROW",
]

aten = torch.ops.aten


def args_of(node: fx.Node) -> tuple[Any, ...]:
    """``node.args`` as the op's schema has them: torch.fx types every argument as the union of every
    kind of argument, which no lowering rule can use without a cast at each read."""
    return node.args


def kwargs_of(node: fx.Node) -> dict[str, Any]:
    """``node.kwargs``, typed like :func:`args_of`."""
    return dict(node.kwargs)


#: the longest row (product of reduced dims) a reduction kernel keeps in registers; longer reductions run in ATen
MAX_ROW = 8192

#: ops lowered to Triton expressions (codegen.py has one rule per op)
FUSIBLE_POINTWISE = frozenset(
    {
        "abs.default",
        "neg.default",
        "exp.default",
        "expm1.default",
        "log.default",
        "log1p.default",
        "sqrt.default",
        "rsqrt.default",
        "reciprocal.default",
        "sin.default",
        "cos.default",
        "tanh.default",
        "sigmoid.default",
        "erf.default",
        "relu.default",
        "gelu.default",
        "floor.default",
        "ceil.default",
        "round.default",
        "sign.default",
        "pow.Tensor_Scalar",
        "pow.Tensor_Tensor",
        "clamp.default",
        "leaky_relu.default",
        "hardtanh.default",
        "elu.default",
        "add.Tensor",
        "add.Scalar",
        "sub.Tensor",
        "sub.Scalar",
        "mul.Tensor",
        "mul.Scalar",
        "div.Tensor",
        "div.Scalar",
        "maximum.default",
        "minimum.default",
        "fmod.Tensor",
        "fmod.Scalar",
        "eq.Tensor",
        "eq.Scalar",
        "ne.Tensor",
        "ne.Scalar",
        "gt.Tensor",
        "gt.Scalar",
        "lt.Tensor",
        "lt.Scalar",
        "ge.Tensor",
        "ge.Scalar",
        "le.Tensor",
        "le.Scalar",
        "logical_and.default",
        "logical_or.default",
        "logical_not.default",
        "where.self",
        "_to_copy.default",
        "clone.default",
        "alias.default",
        "full.default",
        "arange.start_step",
        "arange.start",
        "arange.default",
        "scalar_tensor.default",
        "_native_batch_norm_legit_no_training.default",
        "constant_pad_nd.default",
        "cat.default",
        "embedding.default",
        "gather.default",
        "index.Tensor",
        "avg_pool2d.default",
        "max_pool2d_with_indices.default",
    }
)
POOLS = frozenset({"avg_pool2d.default", "max_pool2d_with_indices.default"})
#: ops that read at positions taken from an integer tensor
GATHERS = frozenset({"embedding.default", "gather.default", "index.Tensor"})
BATCH_NORM = "_native_batch_norm_legit_no_training.default"
#: reductions and the normalizations built on them: evaluated once per row, kept in registers
ROWWISE = frozenset(
    {
        "sum.dim_IntList",
        "sum.default",
        "mean.dim",
        "mean.default",
        "amax.default",
        "amin.default",
        "var.correction",
        "_softmax.default",
        "_log_softmax.default",
        "native_layer_norm.default",
        "argmax.default",
        "prod.dim_int",
        "cumsum.default",
        "any.dim",
        "native_group_norm.default",
    }
)
GROUP_NORM = "native_group_norm.default"
#: views that are index rewrites inside a kernel (and ATen aliases outside one)
INDEX_VIEWS = frozenset(
    {
        "permute.default",
        "t.default",
        "transpose.int",
        "expand.default",
        "unsqueeze.default",
        "squeeze.dim",
        "squeeze.dims",
        "squeeze.default",
        "view.default",
        "_unsafe_view.default",
        "reshape.default",
        "slice.Tensor",
        "select.int",
    }
)
#: ops that always run as ATen calls between kernels: matmul and convolution, and split (it returns views)
EXTERN_OPS = frozenset(
    {"mm.default", "addmm.default", "bmm.default", "convolution.default", "split_with_sizes.default"}
)
HANDLED_OPS = FUSIBLE_POINTWISE | ROWWISE | INDEX_VIEWS | EXTERN_OPS


def op_key(node: fx.Node) -> str:
    """``add.Tensor`` for ``aten.add.Tensor``; ``getitem`` for ``operator.getitem``; else the target's name."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload) and t.namespace == "aten":
        return f"{t._schema.name.split('::')[-1]}.{t._overloadname}"
    if t is operator.getitem:
        return "getitem"
    return getattr(t, "__name__", str(t))


#: a dimension's size: an int, or a sympy expression of the graph's symbols (a symbolic graph)
Size = Any


def _size(d: Any) -> Size:
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return int(expr) if expr.is_number else expr
    return int(d)


def is_static_size(size: Size) -> bool:
    return isinstance(size, int)


def size_code(size: Size) -> str:
    """A size as source that Python and Triton both read: an int's digits, or the expression over the
    ``sym_<name>`` arguments that carry each symbol's value. Raises NotImplementedError for an
    expression it cannot write (the graph then runs elsewhere)."""
    if isinstance(size, int):
        return str(size)
    if size.is_Integer:
        return str(int(size))
    if size.is_Symbol:
        return f"sym_{size.name}"
    if size.is_Add or size.is_Mul:
        return "(" + (" + " if size.is_Add else " * ").join(size_code(a) for a in size.args) + ")"
    if size.is_Pow and size.exp.is_Integer and 0 < int(size.exp) <= 4:
        return "(" + " * ".join([size_code(size.base)] * int(size.exp)) + ")"
    kind = type(size).__name__
    if kind in ("FloorDiv", "CleanDiv"):
        return f"({size_code(size.args[0])} // {size_code(size.args[1])})"
    if kind in ("Mod", "PythonMod"):
        return f"({size_code(size.args[0])} % {size_code(size.args[1])})"
    raise NotImplementedError(f"symbolic size {size} ({kind}) has no Triton source here")


def shape_of_value(val: torch.Tensor, d: int) -> Size:
    return _size(val.shape[d])


def stride_of_value(val: torch.Tensor, d: int) -> Size:
    return _size(val.stride()[d])


def shape_of(node: Any) -> tuple[Size, ...]:
    """The shape of a node's value (of its first output, for a multi-output op): ints, and sympy
    expressions for symbolic dims."""
    val = node.meta["val"]
    if isinstance(val, (tuple, list)):
        val = val[0]
    return tuple(_size(d) for d in val.shape)


def broadcast_shapes(a: Sequence[Size], b: Sequence[Size]) -> tuple[Size, ...] | None:
    """torch's broadcasting over sizes that may be symbolic; None if the shapes do not broadcast."""
    out: list[Size] = []
    for j in range(1, max(len(a), len(b)) + 1):
        x = a[-j] if j <= len(a) else 1
        y = b[-j] if j <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


def is_multi(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (tuple, list))


# ------------------------------------------------------------------------------------------------
# Index expressions
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Idx:
    """One dim of an index: Triton source over domain coordinates, and which domain dims it reads."""

    code: str
    dims: frozenset[int] = frozenset()


ZERO = Idx("0")
Index = tuple[Idx, ...]


def normalize(index: Sequence[Idx], shape: Sequence[int]) -> Index:
    """A size-1 dim is always at 0: write it so, so that broadcast indices compare equal."""
    return tuple(ZERO if s == 1 else i for i, s in zip(index, shape))


def _broadcast(index: Index, out_shape: Sequence[int], arg_shape: Sequence[int]) -> Index:
    lead = len(out_shape) - len(arg_shape)
    return normalize(index[lead:], arg_shape)


def _non_unit_map(index: Index, out_shape: Sequence[int], in_shape: Sequence[int]) -> Index | None:
    """Index into ``in_shape`` for a view that only adds or drops size-1 dims; None for a real reshape."""
    if [s for s in out_shape if s != 1] != [s for s in in_shape if s != 1]:
        return None
    carried = iter(i for i, s in zip(index, out_shape) if s != 1)
    return tuple(ZERO if s == 1 else next(carried) for s in in_shape)


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def clamped(i: Idx, offset: int, size: int) -> Idx:
    """``i - offset`` clamped into ``[0, size)``: an index that is always safe to load, to be masked
    by a ``tl.where`` (padding, concatenation)."""
    if i == ZERO:
        if not (is_static_size(offset) and is_static_size(size)):
            raise NotImplementedError("a symbolic span at a size-1 position")
        return Idx(str(min(max(-offset, 0), size - 1)))
    return Idx(f"tl.minimum(tl.maximum({i.code} - {size_code(offset)}, 0), {size_code(size - 1)})", i.dims)


def pad_spans(node: fx.Node) -> list[tuple[int, int, int]]:
    """(dim, first input position in the output, input size) per dim ``constant_pad_nd`` pads."""
    shape, pad = shape_of(args_of(node)[0]), list(args_of(node)[1])
    rank = len(shape)
    return [(rank - 1 - j, pad[2 * j], shape[rank - 1 - j]) for j in range(len(pad) // 2)]


def cat_spans(node: fx.Node) -> tuple[int, list[tuple[fx.Node, int, int]]]:
    """(dim, [(input, offset in the output, size)]) of ``cat``."""
    rank = len(shape_of(node))
    dim = _dim(args_of(node)[1] if len(args_of(node)) > 1 else kwargs_of(node).get("dim", 0), rank)
    spans, offset = [], 0
    for t in args_of(node)[0]:
        size = shape_of(t)[dim]
        spans.append((t, offset, size))
        offset += size
    return dim, spans


def pool_params(node: fx.Node) -> tuple[list[int], list[int], list[int], list[int], bool]:
    """(kernel, stride, padding, dilation, ceil_mode) of a 2-d pooling op, each a pair."""
    a = list(args_of(node)) + [None] * 8

    def pair(v: Any, default: list[int]) -> list[int]:
        if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
            return default
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return v * 2 if len(v) == 1 else v

    kernel = pair(a[1], [1, 1])
    stride = pair(a[2], kernel)
    padding = pair(a[3], [0, 0])
    if op_key(node) == "avg_pool2d.default":
        return kernel, stride, padding, [1, 1], bool(a[4])
    return kernel, stride, padding, pair(a[4], [1, 1]), bool(a[5])


def pool_taps(node: fx.Node, index: Index) -> list[tuple[Index, list[str]]]:
    """Per window tap: the (clamped, always valid) input index, and the conditions that it is not padding."""
    kernel, stride, padding, dilation, _ = pool_params(node)
    in_shape = shape_of(args_of(node)[0])
    rank = len(in_shape)
    taps = []
    for a in range(kernel[0]):
        for b in range(kernel[1]):
            res, conds = list(index), []
            for j, tap in ((0, a), (1, b)):
                d = rank - 2 + j
                i, shift, size = index[d], tap * dilation[j] - padding[j], in_shape[d]
                pos = f"({i.code})*{stride[j]} + {shift}" if i != ZERO else str(shift)
                if i == ZERO:
                    if not is_static_size(size):
                        raise NotImplementedError("a symbolic pooling window at a size-1 position")
                    res[d] = Idx(str(min(max(shift, 0), size - 1)))
                    if not 0 <= shift < size:
                        conds.append("False")
                else:
                    res[d] = Idx(f"tl.minimum(tl.maximum({pos}, 0), {size_code(size - 1)})", i.dims)
                    if padding[j]:
                        conds.append(f"({pos} >= 0) & ({pos} < {size_code(size)})")
            taps.append((normalize(res, in_shape), conds))
    return taps


def gather_requests(node: fx.Node, index: Index, data: Any) -> list[tuple[fx.Node, int | None, Index]]:
    """For embedding, gather and ``x[i]``: read the integer tensor, then the source at the position it
    holds. ``data(tensor, its index) -> Idx`` turns the integer value into an index expression (code
    generation emits the load; planning uses a placeholder that equals no other index)."""
    key = op_key(node)
    if key == "embedding.default":
        weight, ids = args_of(node)[0], args_of(node)[1]
        id_index = normalize(index[:-1], shape_of(ids))
        return [(ids, None, id_index), (weight, None, normalize((data(ids, id_index), index[-1]), shape_of(weight)))]
    if key == "index.Tensor":
        x, ids = args_of(node)[0], args_of(node)[1][0]
        lead = len(shape_of(ids))
        id_index = normalize(index[:lead], shape_of(ids))
        return [(ids, None, id_index), (x, None, normalize((data(ids, id_index),) + index[lead:], shape_of(x)))]
    x, dim, ids = args_of(node)[0], _dim(args_of(node)[1], len(shape_of(node))), args_of(node)[2]  # gather
    id_index = normalize(index, shape_of(ids))
    src = index[:dim] + (data(ids, id_index),) + index[dim + 1 :]
    return [(ids, None, id_index), (x, None, normalize(src, shape_of(x)))]


def _placeholder(t: fx.Node, index: Index) -> Idx:
    dims: frozenset[int] = frozenset()
    for i in index:
        dims |= i.dims
    return Idx(f"<{t.name}[{','.join(i.code for i in index)}]>", dims)


def view_input_index(node: fx.Node, index: Index) -> Index | None:
    """The index into a view's input that gives the view's element at ``index``; None if no cheap one."""
    key = op_key(node)
    src = args_of(node)[0]
    out_shape, in_shape = shape_of(node), shape_of(src)
    rank = len(in_shape)
    if key == "permute.default":
        perm = [_dim(d, rank) for d in args_of(node)[1]]
        res = [ZERO] * rank
        for j, d in enumerate(perm):
            res[d] = index[j]
        return normalize(res, in_shape)
    if key in ("t.default", "transpose.int"):
        d0, d1 = (0, 1) if key == "t.default" else (_dim(args_of(node)[1], rank), _dim(args_of(node)[2], rank))
        res = list(index)
        if rank >= 2:
            res[d0], res[d1] = index[d1], index[d0]
        return normalize(res, in_shape)
    if key == "expand.default":
        return _broadcast(index, out_shape, in_shape)
    if key in (
        "unsqueeze.default",
        "squeeze.dim",
        "squeeze.dims",
        "squeeze.default",
        "view.default",
        "_unsafe_view.default",
        "reshape.default",
    ):
        return _non_unit_map(index, out_shape, in_shape)
    if key == "slice.Tensor":
        dim = _dim(args_of(node)[1] if len(args_of(node)) > 1 else 0, rank)
        start = args_of(node)[2] if len(args_of(node)) > 2 and args_of(node)[2] is not None else 0
        step = args_of(node)[4] if len(args_of(node)) > 4 else 1
        if not (isinstance(start, int) and isinstance(step, int)):
            return None  # a symbolic start or step: ATen slices
        if not is_static_size(in_shape[dim]):
            if start < 0:
                return None  # counted from a symbolic end, and clamped: ATen slices
        else:
            start = max(0, min(start + in_shape[dim] if start < 0 else start, in_shape[dim]))
        res = list(index)
        i = index[dim]
        res[dim] = Idx(str(start), frozenset()) if i == ZERO else Idx(f"({i.code}*{step}+{start})", i.dims)
        return normalize(res, in_shape)
    if key == "select.int":
        dim = _dim(args_of(node)[1], rank)
        pos = args_of(node)[2]
        if not isinstance(pos, int):
            return None  # a symbolic position: ATen selects
        pos = size_code(pos + in_shape[dim]) if pos < 0 else str(pos)
        return normalize(list(index[:dim]) + [Idx(pos)] + list(index[dim:]), in_shape)
    return None


# ------------------------------------------------------------------------------------------------
# Domains and row-resident values
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Domain:
    shape: tuple[Size, ...]
    reduced: tuple[int, ...] = ()  # sorted; () for a pointwise kernel

    def full_index(self) -> Index:
        return normalize([Idx(f"i{d}", frozenset({d})) for d in range(len(self.shape))], self.shape)

    def row_index(self, keepdim: bool) -> Index:
        full = self.full_index()
        if keepdim:
            return tuple(ZERO if d in self.reduced else i for d, i in enumerate(full))
        return tuple(i for d, i in enumerate(full) if d not in self.reduced)

    @property
    def is_static(self) -> bool:
        return all(is_static_size(s) for s in self.shape)

    @property
    def numel(self) -> Size:
        n: Size = 1
        for s in self.shape:
            n = n * s
        return n

    @property
    def row_len(self) -> Size:
        n: Size = 1
        for d in self.reduced:
            n *= self.shape[d]
        return n


def rowwise_domain(node: fx.Node) -> Domain:
    """The domain a row-resident node computes over: its input's shape and the dims it reduces."""
    key = op_key(node)
    shape = shape_of(args_of(node)[0])
    rank = len(shape)
    if key == GROUP_NORM:  # [N, C, *spatial] seen as [N, G, C/G, *spatial], reducing all but N and G
        groups = args_of(node)[6]
        return Domain((shape[0], groups, shape[1] // groups) + shape[2:], tuple(range(2, rank + 1)))
    dims: Any
    if key in ("sum.default", "mean.default"):
        dims = list(range(rank))
    elif key in ("_softmax.default", "_log_softmax.default", "prod.dim_int", "cumsum.default"):
        dims = [args_of(node)[1]]
    elif key == "native_layer_norm.default":
        dims = list(range(rank - len(args_of(node)[1]), rank))
    else:
        dims = args_of(node)[1] if len(args_of(node)) > 1 else kwargs_of(node).get("dim")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(rank))
        elif isinstance(dims, int):
            dims = [dims]
    return Domain(shape, tuple(sorted({_dim(d, max(rank, 1)) for d in dims} & set(range(rank)))))


def _keepdim(node: fx.Node) -> bool:
    key = op_key(node)
    if key in (
        "sum.dim_IntList",
        "mean.dim",
        "amax.default",
        "amin.default",
        "argmax.default",
        "prod.dim_int",
        "any.dim",
    ):
        return bool(args_of(node)[2] if len(args_of(node)) > 2 else kwargs_of(node).get("keepdim", False))
    if key == "var.correction":
        return bool(kwargs_of(node).get("keepdim", args_of(node)[3] if len(args_of(node)) > 3 else False))
    return False


def row_index(node: fx.Node, output: int, domain: Domain) -> Index:
    """Where a row-resident node's ``output`` lives: the only index a consumer may read it at."""
    key = op_key(node)
    if key in ("_softmax.default", "_log_softmax.default", "cumsum.default") or (
        key == "native_layer_norm.default" and output == 0
    ):
        return domain.full_index()
    if key == "native_layer_norm.default":
        return domain.row_index(keepdim=True)
    if key == GROUP_NORM:
        return group_norm_input_index(node, domain) if output == 0 else domain.row_index(keepdim=False)
    return domain.row_index(_keepdim(node))


def group_norm_input_index(node: fx.Node, domain: Domain) -> Index:
    """The [N, C, *spatial] index of the group-norm domain's element (n, g, c, *spatial): channel g*C/G + c."""
    full = domain.full_index()
    per_group = domain.shape[2]
    g, c = full[1], full[2]
    parts = ([f"({g.code})*{size_code(per_group)}"] if g != ZERO else []) + ([f"({c.code})"] if c != ZERO else [])
    channel = Idx(" + ".join(parts), g.dims | c.dims) if parts else ZERO
    return normalize((full[0], channel) + full[3:], shape_of(args_of(node)[0]))


# ------------------------------------------------------------------------------------------------
# Classification and argument indices
# ------------------------------------------------------------------------------------------------

POINTWISE, VIEW, ROW, GETITEM, EXTERN = "pointwise", "view", "rowwise", "getitem", "extern"


def classify(node: fx.Node) -> str:
    key = op_key(node)
    if key == "getitem":
        return GETITEM
    if _takes_symbolic_scalar(node):
        return EXTERN
    if key in ROWWISE:
        row_len = rowwise_domain(node).row_len
        if is_static_size(row_len) and row_len > MAX_ROW:  # too long for one block: ATen reduces it
            return EXTERN  # (a symbolic row's length is checked at each call: runtime.py)
        if (
            not args_of(node)[0].meta["val"].dtype.is_floating_point and key != "any.dim"
        ):  # integer sums and extrema: ATen
            return EXTERN
        if not rowwise_domain(node).reduced:  # a reduction of a 0-d tensor: nothing to reduce
            return EXTERN
        return ROW
    if key in INDEX_VIEWS:
        return VIEW
    if key == "_to_copy.default" and any(k in kwargs_of(node) for k in ("device", "layout")):
        return EXTERN
    if key in POOLS and pool_params(node)[4]:
        return EXTERN  # ceil_mode windows: ATen
    if key in (BATCH_NORM, "max_pool2d_with_indices.default") and any(
        op_key(u) != "getitem" or args_of(u)[1] != 0 for u in node.users
    ):
        return EXTERN  # its saved statistics are wanted: ATen computes them
    if key == "cat.default" and any(
        0 in shape_of(t) or len(shape_of(t)) != len(shape_of(node)) for t in args_of(node)[0]
    ):
        return EXTERN  # legacy empty inputs
    if key == "index.Tensor" and not (
        isinstance(args_of(node)[1][0], fx.Node)
        and all(i is None for i in args_of(node)[1][1:])
        and not args_of(node)[1][0].meta["val"].dtype.is_floating_point
        and args_of(node)[1][0].meta["val"].dtype != torch.bool
    ):
        return EXTERN  # only x[i] with one integer index tensor on dim 0
    if key in FUSIBLE_POINTWISE:
        return POINTWISE
    return EXTERN


def arg_requests(node: fx.Node, index: Index, domain: Domain) -> list[tuple[fx.Node, int | None, Index]] | None:
    """For ``node`` evaluated at ``index``: each (input node, which output or None, index) it reads.

    None when some input cannot be read at a cheap index (a real reshape)."""
    kind = classify(node)
    if kind == POINTWISE and op_key(node) in POOLS:
        return [(args_of(node)[0], None, tap) for tap, _ in pool_taps(node, index)]
    if kind == POINTWISE and op_key(node) in GATHERS:
        return gather_requests(node, index, _placeholder)
    if kind == POINTWISE and op_key(node) == "constant_pad_nd.default":
        res = list(index)
        for d, lo, size in pad_spans(node):
            res[d] = clamped(index[d], lo, size)
        return [(args_of(node)[0], None, normalize(res, shape_of(args_of(node)[0])))]
    if kind == POINTWISE and op_key(node) == "cat.default":
        dim, spans = cat_spans(node)
        return [
            (t, None, normalize(index[:dim] + (clamped(index[dim], off, size),) + index[dim + 1 :], shape_of(t)))
            for t, off, size in spans
        ]
    if kind == POINTWISE and op_key(node) == BATCH_NORM:  # per-channel statistics along dim 1
        channel = (index[1],) if len(index) > 1 else (ZERO,)
        return [
            (a, None, index if i == 0 else normalize(channel, shape_of(a)))
            for i, a in enumerate(args_of(node)[:5])
            if isinstance(a, fx.Node)
        ]
    if kind == POINTWISE:
        out_shape = shape_of(node)
        return [(a, None, _broadcast(index, out_shape, shape_of(a))) for a in args_of(node) if isinstance(a, fx.Node)]
    if kind == VIEW:
        src_index = view_input_index(node, index)
        return None if src_index is None else [(args_of(node)[0], None, src_index)]
    if kind == GETITEM:
        return [(args_of(node)[0], args_of(node)[1], index)]
    if kind == ROW:
        full = domain.full_index()
        x = args_of(node)[0]
        reqs: list[tuple[fx.Node, int | None, Index]] = [(x, None, full)]
        if op_key(node) == "native_layer_norm.default":
            for a in args_of(node)[2:4]:
                if isinstance(a, fx.Node):
                    reqs.append((a, None, _broadcast(full, domain.shape, shape_of(a))))
        if op_key(node) == GROUP_NORM:
            x_index = group_norm_input_index(node, domain)
            reqs = [(x, None, x_index)]
            reqs += [
                (a, None, normalize(x_index[1:2], shape_of(a))) for a in args_of(node)[1:3] if isinstance(a, fx.Node)
            ]
        return reqs
    return None


# ------------------------------------------------------------------------------------------------
# Kernels and the plan
# ------------------------------------------------------------------------------------------------


@dataclass
class Kernel:
    domain: Domain
    nodes: list[fx.Node] = field(default_factory=list)
    stores: list[tuple[fx.Node, Index]] = field(default_factory=list)  # filled when the kernel closes

    @property
    def node_set(self) -> set[fx.Node]:
        return set(self.nodes)


@dataclass
class Extern:
    node: fx.Node


def _index_candidates(node: fx.Node, domain: Domain) -> list[Index]:
    """Indices that visit every element of ``node`` exactly once (broadcast dims are masked to 0)."""
    if classify(node) == ROW:
        return [row_index(node, 0, domain)]
    if classify(node) == GETITEM and classify(args_of(node)[0]) == ROW:
        return [row_index(args_of(node)[0], args_of(node)[1], domain)]
    shape = shape_of(node)
    out: list[Index] = []
    if domain.reduced:
        kept = [s for d, s in enumerate(domain.shape) if d not in domain.reduced]
        if list(shape) == kept:
            out.append(domain.row_index(keepdim=False))
    lead = len(domain.shape) - len(shape)
    if lead >= 0 and all(s == 1 or s == domain.shape[lead + j] for j, s in enumerate(shape)):
        out.append(_broadcast(domain.full_index(), domain.shape, shape))
    return out


class _Checker:
    """Can every node of a candidate kernel be evaluated where it is needed? (row-resident rule)."""

    def __init__(self, nodes: Iterable[fx.Node], domain: Domain) -> None:
        self.inside, self.domain = set(nodes), domain
        self.memo: dict[tuple[fx.Node, int | None, Index], bool] = {}

    def ok(self, node: fx.Node, output: int | None, index: Index) -> bool:
        if node not in self.inside:
            return True  # loaded from memory: any index works
        key = (node, output, index)
        if key not in self.memo:
            self.memo[key] = True  # (graphs are acyclic; this only guards re-entry)
            self.memo[key] = self._ok(node, output, index)
        return self.memo[key]

    def _ok(self, node: fx.Node, output: int | None, index: Index) -> bool:
        if classify(node) == ROW:
            if index != row_index(node, output or 0, self.domain) or rowwise_domain(node) != self.domain:
                return False
        reqs = arg_requests(node, index, self.domain)
        return reqs is not None and all(self.ok(a, o, i) for a, o, i in reqs)

    def home(self, node: fx.Node) -> Index | None:
        for index in _index_candidates(node, self.domain):
            if self.ok(node, None, index):
                return index
        return None


def _grow(kernel: Kernel, node: fx.Node) -> Domain | None:
    """The domain of ``kernel`` with ``node`` added, or None if their iteration spaces differ."""
    dom = kernel.domain
    kind = classify(node)
    if kind == ROW:
        want = rowwise_domain(node)
        if dom.reduced:
            return dom if want == dom else None
        return want if broadcast_shapes(dom.shape, want.shape) == want.shape else None
    if dom.reduced or kind == GETITEM:
        return dom
    shape = broadcast_shapes(dom.shape, shape_of(node))
    return None if shape is None else Domain(shape)


def _fits(kernel: Kernel, node: fx.Node) -> Domain | None:
    """The kernel's new domain if ``node`` can join it, else None.

    Every node that may have to be stored (a user outside the kernel) needs a home index in the
    domain; a node only its kernel-mates read is evaluated where they read it. A pointwise kernel may
    also move to the new node's own shape (padding, concatenation) when its values allow it."""
    nodes = kernel.nodes + [node]
    inside = set(nodes)
    candidates = [_grow(kernel, node)]
    if not kernel.domain.reduced and classify(node) == POINTWISE:
        candidates.append(Domain(shape_of(node)))
    for dom in candidates:
        if dom is None:
            continue
        checker = _Checker(nodes, dom)
        # (a multi-output node is stored, and checked, through its getitem nodes)
        stored = [n for n in nodes if not is_multi(n) and (n is node or any(u not in inside for u in n.users))]
        if all(checker.home(n) is not None for n in stored):
            return dom
    return None


def _start_domain(node: fx.Node) -> Domain:
    return rowwise_domain(node) if classify(node) == ROW else Domain(shape_of(node))


def plan(graph: fx.Graph) -> list[Kernel | Extern]:
    """Cut ``graph`` into kernels and external calls, in an order that respects every dependency."""
    steps: list[Kernel | Extern] = []
    open_k: Kernel | None = None

    def close() -> None:
        nonlocal open_k
        if open_k is None:
            return
        inside = open_k.node_set
        checker = _Checker(open_k.nodes, open_k.domain)
        for n in open_k.nodes:
            if is_multi(n):
                continue  # its outputs are stored through its getitem nodes
            if any(u not in inside for u in n.users):
                home = checker.home(n)
                assert home is not None, f"internal error: no store index for {n.format_node()}"
                open_k.stores.append((n, home))
        steps.append(open_k)
        open_k = None

    for node in graph.nodes:
        if node.op != "call_function":
            continue
        kind = classify(node)
        inputs_inside = open_k is not None and any(a in open_k.node_set for a in node.all_input_nodes)
        if kind == EXTERN or (kind in (VIEW, GETITEM) and not inputs_inside) or not _is_tensor(node):
            if inputs_inside:
                close()
            steps.append(Extern(node))
            continue
        if open_k is not None:
            dom = _fits(open_k, node)
            if dom is not None:
                open_k.domain = dom
                open_k.nodes.append(node)
                continue
            close()
        if kind in (VIEW, GETITEM):  # its input is in memory now: an ATen alias
            steps.append(Extern(node))
            continue
        open_k = Kernel(_start_domain(node), [node])
    close()
    return steps


def _is_tensor(node: fx.Node) -> bool:
    val = node.meta.get("val")
    if is_multi(node) and classify(node) in (ROW, POINTWISE):
        return True
    return isinstance(val, torch.Tensor)


#: the argument that may be a symbolic size (an fx node holding a SymInt) in an op a kernel computes;
#: it only says the output's shape, which the kernel reads from the node's value
_SHAPE_ARG = {
    "full.default": 0,
    "arange.default": 0,
    "expand.default": 1,
    "view.default": 1,
    "_unsafe_view.default": 1,
    "reshape.default": 1,
}


def _takes_symbolic_scalar(node: fx.Node) -> bool:
    """Whether an argument other than the output's shape is a symbolic integer (``x * x.shape[0]``,
    ``arange(s0, 2*s0)``): a kernel has no rule for one; ATen computes the op."""
    skip = _SHAPE_ARG.get(op_key(node))
    for j, a in enumerate(list(args_of(node)) + list(kwargs_of(node).values())):
        if j == skip:
            continue
        for x in a if isinstance(a, (list, tuple)) else [a]:
            if isinstance(x, fx.Node) and not isinstance(x.meta.get("val"), (torch.Tensor, tuple, list)):
                return True
    return False
