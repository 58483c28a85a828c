"""The one graph IR that every backend receives.

A **normalized graph** (:class:`GraphIR`) is a ``torch.fx.GraphModule`` that satisfies these
invariants, checked by :meth:`GraphIR.lint`:

1. *Op set.* Every ``call_function`` node targets an ATen ``OpOverload`` from the Core ATen op set
   (after ``torch._decomp.core_aten_decompositions()``; a few ops that have no core decomposition, such
   as ``aten.embedding``, may remain), ``operator.getitem`` on a multi-output op, or a symbolic-shape
   helper (``torch.sym_*`` / ``operator`` arithmetic on SymInts) when the graph was captured with
   ``dynamic=True``, or a control-flow operator (``torch.cond``, ``torch.while_loop``) whose branch and
   body graphs (``get_attr`` submodules) are normalized graphs themselves. There are no
   ``call_module`` or ``call_method`` nodes.
2. *Functional.* No node mutates anything: no op whose schema is mutable (``add_``, ``copy_``,
   ``out=`` variants). View ops (``view``, ``permute``, ``t``, ``slice``...) are allowed: they only read.
   Mutations of the user's inputs (batch-norm running statistics in training) are kept outside the
   graph by AOTAutograd, which applies them after the graph ran.
3. *Typed values.* Every placeholder and every op node carries ``node.meta["val"]`` (a FakeTensor, a
   SymInt or a tuple of those) from which :class:`TensorSpec` reads shape, dtype, device and strides.
   The one exception: run-time checks (``aten._assert_scalar``, ``aten._assert_async``) return nothing,
   are used by nothing, and carry no value.
4. *Flat signature.* Placeholders are positional tensors (or SymInts), in the order the compiled
   callable receives its arguments, and come before every other node; ``get_attr`` nodes follow them,
   then the ops; the output node returns a flat tuple of tensors, except that a backward graph's tuple
   may hold ``None`` (the gradient of an input that needs none), and a compiled backward graph returns
   ``None`` in the same places. :attr:`GraphIR.input_kinds` labels each placeholder ``"input"``,
   ``"param"`` or ``"buffer"``.

**What a backend receives** (``CompileRequest.ir``). This section is the specification a backend
author reads; the examples below are printed from real graphs by tests/core/test_ir_docs.py, which
fails when they stop being what a backend gets. Weights reach a backend in one of two forms, and a
backend must read both:

- *Frozen*, the common case: an inference graph (``phase == "inference"``: Dynamo captured it with no
  gradient needed, e.g. under ``torch.no_grad()``) with static shapes, when ``options={"freeze": ...}``
  is left on. Every parameter and buffer is a ``get_attr`` node named ``_frozen_<k>`` (``k``: its
  position among the unfrozen graph's placeholders); the tensor is an attribute of ``ir.gm``
  (:meth:`GraphIR.constants` maps each name to it). It is the model's live weight, not a copy: read
  it, never write it. Only the user's inputs remain placeholders (all ``"input"``). If a weight
  changes, torchmux freezes again and calls ``compile()`` again (autotune/freeze.py).
- *Lifted*: a training step's forward graph, an inference graph with ``freeze=False`` or with
  symbolic shapes. Weights are placeholders labelled ``"param"`` or ``"buffer"``, passed on every call,
  and may change between calls (an optimizer step): treat them as arguments, not constants.
- A *backward* graph's placeholders are all ``"input"``: the values the forward saved for it (a weight
  among them) and the incoming gradients (``tangents_N``).
- *Constants* the program itself creates (``torch.tensor([...])`` in ``forward``) are ``get_attr``
  nodes named ``_tensor_constant<N>`` in every phase.
- A *region* (a backend with ``granularity="regions"`` or ``"ops"`` that leaves some ops to eager) is
  a normalized graph under the same rules: its placeholders are the values it reads from the rest of
  the graph, first and in argument order, labelled as in the whole graph (a lifted weight stays
  ``"param"``/``"buffer"``, anything computed eagerly is ``"input"``); a frozen weight or constant it
  reads stays a ``get_attr`` of the region's own ``gm``.

The printed form (``str(ir)``) shows the placeholders with their spec and kind, then one line per
``get_attr`` and op with the spec of its result; the ``# phase=... input_kinds=...`` line below each
example is the test's, not part of the printed form. One ``nn.Linear(16, 16)`` and a buffer
(``relu(lin(x)) * scale``), called with ``x: f32[8, 16]``:

Example inference (``torch.no_grad()``; the default freeze)::

    graph graph_0_frozen(arg2_1: f32[8, 16] input):
      %_frozen_0 : f32[16, 16] = get_attr _frozen_0
      %_frozen_1 : f32[16] = get_attr _frozen_1
      %_frozen_3 : f32[16] = get_attr _frozen_3
      %permute : f32[16, 16] = aten.permute.default(%_frozen_0, [1, 0])
      %addmm : f32[8, 16] = aten.addmm.default(%_frozen_1, %arg2_1, %permute)
      %relu : f32[8, 16] = aten.relu.default(%addmm)
      %mul : f32[8, 16] = aten.mul.Tensor(%relu, %_frozen_3)
      return (%mul)
      # phase=inference input_kinds=['input']

Example training (gradients enabled: a forward and a backward graph; the forward returns what the
backward needs after the user's outputs, inputs included)::

    graph graph_0_forward(primals_1: f32[16, 16] param, primals_2: f32[16] param, primals_3: f32[8, 16] input, primals_4: f32[16] buffer):
      %permute : f32[16, 16] = aten.permute.default(%primals_1, [1, 0])
      %addmm : f32[8, 16] = aten.addmm.default(%primals_2, %primals_3, %permute)
      %relu : f32[8, 16] = aten.relu.default(%addmm)
      %alias : f32[8, 16] = aten.alias.default(%relu)
      %mul : f32[8, 16] = aten.mul.Tensor(%relu, %primals_4)
      return (%mul, %primals_3, %primals_4, %alias)
      # phase=forward input_kinds=['param', 'param', 'input', 'buffer']
    graph graph_0_backward(primals_3: f32[8, 16] input, primals_4: f32[16] input, alias: f32[8, 16] input, tangents_1: f32[8, 16] input):
      %mul_1 : f32[8, 16] = aten.mul.Tensor(%tangents_1, %primals_4)
      %alias_1 : f32[8, 16] = aten.alias.default(%alias)
      %le : b8[8, 16] = aten.le.Scalar(%alias_1, 0)
      %scalar_tensor : f32[] = aten.scalar_tensor.default(0, dtype=torch.float32, layout=torch.strided, device=device(type='cpu'))
      %where : f32[8, 16] = aten.where.self(%le, %scalar_tensor, %mul_1)
      %permute_1 : f32[16, 8] = aten.permute.default(%where, [1, 0])
      %mm : f32[16, 16] = aten.mm.default(%permute_1, %primals_3)
      %permute_2 : f32[16, 16] = aten.permute.default(%mm, [1, 0])
      %sum_1 : f32[1, 16] = aten.sum.dim_IntList(%where, [0], True)
      %view : f32[16] = aten.view.default(%sum_1, [16])
      %permute_3 : f32[16, 16] = aten.permute.default(%permute_2, [1, 0])
      return (%permute_3, %view, None, None)
      # phase=backward input_kinds=['input', 'input', 'input', 'input']

Example region (a backend claiming only ``addmm``, ``permute`` and ``relu``, on ``sort(relu(lin(x)) *
scale).values + 1`` under ``torch.no_grad()``: the region it is handed; ``mul``, ``sort`` and ``add``
run eagerly)::

    graph graph_0_frozen.irdoc_region0(arg2_1: f32[8, 16] input):
      %_frozen_0 : f32[16, 16] = get_attr _frozen_0
      %_frozen_1 : f32[16] = get_attr _frozen_1
      %permute : f32[16, 16] = aten.permute.default(%_frozen_0, [1, 0])
      %addmm : f32[8, 16] = aten.addmm.default(%_frozen_1, %arg2_1, %permute)
      %relu : f32[8, 16] = aten.relu.default(%addmm)
      return (%relu)
      # phase=inference input_kinds=['input']

Example unfrozen (``torch.no_grad()``, ``options={"freeze": False}``)::

    graph graph_0(arg0_1: f32[16, 16] param, arg1_1: f32[16] param, arg2_1: f32[8, 16] input, arg3_1: f32[16] buffer):
      %permute : f32[16, 16] = aten.permute.default(%arg0_1, [1, 0])
      %addmm : f32[8, 16] = aten.addmm.default(%arg1_1, %arg2_1, %permute)
      %relu : f32[8, 16] = aten.relu.default(%addmm)
      %mul : f32[8, 16] = aten.mul.Tensor(%relu, %arg3_1)
      return (%mul)
      # phase=inference input_kinds=['param', 'param', 'input', 'buffer']

Example constant (``x * torch.tensor([1.0, 2.0, 3.0, 4.0])``, ``x: f32[2, 4]``)::

    graph graph_0(arg0_1: f32[2, 4] input):
      %_tensor_constant0 : f32[4] = get_attr _tensor_constant0
      %lift_fresh_copy : f32[4] = aten.lift_fresh_copy.default(%_tensor_constant0)
      %mul : f32[2, 4] = aten.mul.Tensor(%arg0_1, %lift_fresh_copy)
      return (%mul)
      # phase=inference input_kinds=['input']

Example dynamic (``dynamic=True``, called at batch 8 then 5: one graph for both; a backend with
``dynamic_shapes=True`` gets it, weights lifted; see "Symbolic dimensions")::

    graph graph_0(arg0_1: f32[16, 16] param, arg1_1: f32[16] param, arg2_1: SymInt(s77) input, arg3_1: f32[s77, 16] input, arg4_1: f32[16] buffer):
      %permute : f32[16, 16] = aten.permute.default(%arg0_1, [1, 0])
      %addmm : f32[s77, 16] = aten.addmm.default(%arg1_1, %arg3_1, %permute)
      %relu : f32[s77, 16] = aten.relu.default(%addmm)
      %mul_4 : f32[s77, 16] = aten.mul.Tensor(%relu, %arg4_1)
      return (%mul_4)
      # phase=inference input_kinds=['param', 'param', 'input', 'input', 'buffer']

**Fingerprint.** :meth:`GraphIR.fingerprint` is a SHA-256 over that structure with value names
replaced by their position: every node's opcode, target, arguments (references as positions, constants
by ``repr``) and result spec (shape, dtype, device, strides), plus each input's kind and the
fingerprints of control-flow branches. It does not see
weight values, node names or the Python process, so it is stable across processes and keys every
on-disk cache. A ``get_attr`` tensor of 64 elements or fewer (a program constant) is hashed by value;
a frozen graph's fingerprint also covers its weights' bytes (autotune/freeze.py), so an artifact keyed
by it never serves other weights.

**Symbolic dimensions.** A graph captured with dynamic shapes (``dynamic=True``, or ``dynamic=None``
after a dimension changed, or ``torch._dynamo.mark_dynamic``) has sizes that are SymInts. A
dimension is then a *symbol* (``s0``) or an expression of symbols (``2*s0``); :class:`TensorSpec`
holds it as its string, and the printed form shows it bare (``f32[s0, 16]``). A symbol's value
arrives as an integer placeholder (``arg0: SymInt(s0) input``) as well as in the tensors' sizes.
:attr:`GraphIR.symbols` maps each symbol to :class:`Symbol`: the range Dynamo's ShapeEnv proved
(``var_to_range``; Dynamo specializes 0 and 1, so a batch symbol starts at 2) and the guards it holds
on it. ``lint()`` checks that every symbol used in a spec is defined by an input (a placeholder's
size or value): a backend can always read each size from its arguments. The fingerprint hashes the
symbols' names and ranges with the specs (names come from Dynamo's sources, so they are the same in
every process).

**Backward.** Graphs come from AOTAutograd, so a training step yields a forward and a backward graph,
both normalized the same way; :attr:`GraphIR.phase` says which.

:class:`ReferenceInterpreter` runs a normalized graph op by op through ATen: it is the correctness
oracle for the conformance suite and the autotuner. Subclass it (like ``torch.fx.Interpreter``) to
observe or override single ops.
"""

from __future__ import annotations

import hashlib
import operator
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from .errors import IRLintError

__all__ = ["TensorSpec", "GraphIR", "ReferenceInterpreter", "spec_of"]

_DTYPE_ABBR = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
    torch.complex64: "c64",
}
INPUT_KINDS = ("input", "param", "buffer")


@dataclass(frozen=True)
class TensorSpec:
    """What a backend may assume about a value: shape (ints, or strings for symbols), dtype, device, strides."""

    shape: tuple[int | str, ...]
    dtype: torch.dtype
    device: str
    stride: tuple[int | str, ...]

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def short(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"{_DTYPE_ABBR.get(self.dtype, str(self.dtype).replace('torch.', ''))}[{dims}]"

    def key(self) -> str:
        return f"{self.dtype}|{self.device}|{self.shape}|{self.stride}"

    def matches(self, t: torch.Tensor) -> bool:
        return (
            t.dtype == self.dtype
            and str(t.device) == self.device
            and all(isinstance(s, str) or s == d for s, d in zip(self.shape, t.shape))
            and len(self.shape) == t.dim()
        )


def _dim(d: Any) -> int | str:
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt):  # a symbol prints as its expression ("s0"); a constant as its value
        expr = d.node.expr
        return int(expr) if getattr(expr, "is_number", False) else str(expr)
    return int(d)


def spec_of(value: Any) -> TensorSpec | None:
    """The spec of a tensor (real or fake); None for anything else."""
    if not isinstance(value, torch.Tensor):
        return None
    return TensorSpec(
        tuple(_dim(d) for d in value.shape), value.dtype, str(value.device), tuple(_dim(s) for s in value.stride())
    )


#: higher-order control flow allowed in a graph; each branch is a get_attr GraphModule, itself normalized
_CONTROL_FLOW = tuple(
    op for op in (getattr(torch.ops.higher_order, name, None) for name in ("cond", "while_loop")) if op is not None
)


def is_check(node: fx.Node) -> bool:
    """An op that only checks a condition at run time (and raises): it returns nothing, so it has no spec."""
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and not t._schema.returns and not t._schema.is_mutable


def _is_sym_helper(target: Any) -> bool:
    mod = getattr(target, "__module__", "") or ""
    return (
        mod in ("_operator", "operator", "math")
        or getattr(target, "__name__", "").startswith("sym_")
        or ("torch.fx.experimental.sym_node" in mod)
    )


@dataclass(frozen=True)
class Symbol:
    """A symbolic dimension: its name, the range of values Dynamo proved for it (``hi`` None: unbounded),
    and the guards Dynamo holds that mention it (as text)."""

    name: str
    lo: int
    hi: int | None
    guards: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.name} in [{self.lo}, {'inf' if self.hi is None else self.hi}]"


def _symbols_of(value: Any) -> set[str]:
    out: set[str] = set()
    for v in value if isinstance(value, (tuple, list)) else [value]:
        sizes = (
            list(v.shape) + list(v.stride())
            if isinstance(v, torch.Tensor)
            else [v]
            if isinstance(v, torch.SymInt)
            else []
        )
        for d in sizes:
            if isinstance(d, torch.SymInt):
                out.update(str(s) for s in d.node.expr.free_symbols)
    return out


def _symbol_info(size: torch.SymInt, name: str) -> Symbol:
    env = size.node.shape_env
    sym = next((s for s in size.node.expr.free_symbols if str(s) == name), None)
    r = env.var_to_range.get(sym) if sym is not None else None
    lo, hi = 0, None
    if r is not None:
        try:
            lo = int(r.lower)
        except (TypeError, ValueError, OverflowError, AttributeError):
            lo = 0
        try:
            hi = int(r.upper)
            hi = hi if hi < 2**62 else None
        except (TypeError, ValueError, OverflowError, AttributeError):
            hi = None
    guards = tuple(
        sorted(str(g.expr) for g in getattr(env, "guards", []) if name in {str(s) for s in g.expr.free_symbols})
    )
    return Symbol(name, lo, hi, guards)


class GraphIR:
    """A normalized graph (see the module docstring for the invariants and the printed form)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        input_kinds: Sequence[str] | None = None,
        *,
        name: str = "graph",
        phase: str = "inference",
    ) -> None:
        self.gm = gm
        self.name = name
        self.phase = phase  # "inference", "forward" or "backward"
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        kinds = tuple(input_kinds) if input_kinds is not None else ("input",) * len(placeholders)
        if len(kinds) != len(placeholders):
            raise IRLintError(f"{name}: {len(kinds)} input kinds given for {len(placeholders)} placeholders")
        bad = [k for k in kinds if k not in INPUT_KINDS]
        if bad:
            raise IRLintError(f"{name}: input kinds must be one of {INPUT_KINDS}, got {bad}")
        self.input_kinds: tuple[str, ...] = kinds
        self._fingerprint: str | None = None

    # ----------------------------------------------------------------------------- structure
    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    @property
    def placeholders(self) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op == "placeholder"]

    @property
    def output_node(self) -> fx.Node:
        return next(n for n in reversed(self.graph.nodes) if n.op == "output")

    @property
    def outputs(self) -> list[Any]:
        out = self.output_node.args[0]
        return list(out) if isinstance(out, (tuple, list)) else [out]

    @property
    def op_nodes(self) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op == "call_function"]

    @property
    def constants(self) -> dict[str, torch.Tensor]:
        """The tensors the graph holds as ``get_attr`` (frozen weights ``_frozen_<k>``, program constants
        ``_tensor_constant<N>``), by target name: read them, never write them."""
        out: dict[str, torch.Tensor] = {}
        for node in self.graph.nodes:
            if node.op == "get_attr":
                value: Any = self.gm
                for part in str(node.target).split("."):
                    value = getattr(value, part)
                if isinstance(value, torch.Tensor):
                    out[str(node.target)] = value
        return out

    @property
    def input_specs(self) -> list[TensorSpec | None]:
        return [spec_of(n.meta.get("val")) for n in self.placeholders]

    @property
    def output_specs(self) -> list[TensorSpec | None]:
        return [spec_of(o.meta.get("val")) if isinstance(o, fx.Node) else None for o in self.outputs]

    @property
    def is_static(self) -> bool:
        return all(s is None or s.is_static for s in self.input_specs) and all(
            isinstance(n.meta.get("val"), torch.Tensor) for n in self.placeholders
        )

    @property
    def symbols(self) -> dict[str, Symbol]:
        """Each symbolic dimension the inputs define, with its range and guards (empty when static)."""
        out: dict[str, Symbol] = {}
        for n in self.placeholders:
            val = n.meta.get("val")
            sizes = [val] if isinstance(val, torch.SymInt) else list(val.shape) if isinstance(val, torch.Tensor) else []
            for d in sizes:
                if isinstance(d, torch.SymInt):
                    for name in sorted(str(s) for s in d.node.expr.free_symbols):
                        if name not in out:
                            out[name] = _symbol_info(d, name)
        return out

    def op_counts(self) -> Counter[str]:
        return Counter(op_name(n) for n in self.op_nodes)

    # ----------------------------------------------------------------------------- invariants
    def lint(self) -> GraphIR:
        """Check the invariants of the module docstring; raise IRLintError naming the node that breaks one."""
        self.graph.lint()
        defined = set(self.symbols)
        for node in self.graph.nodes:
            where = f"{self.name}: node {node.format_node()}"
            if node.op in ("call_module", "call_method"):
                raise IRLintError(f"{where}: {node.op} nodes are not allowed; normalize to ATen ops first")
            if node.op == "placeholder" and "val" not in node.meta:
                raise IRLintError(f"{where}: has no meta['val'] (every value must carry its spec)")
            unknown = _symbols_of(node.meta.get("val")) - defined
            # a data-dependent size (u0: nonzero, .item()) is defined by the op that makes it
            defined |= {u for u in unknown if u.startswith("u")}
            unknown -= defined
            if unknown and node.op != "get_attr":
                raise IRLintError(
                    f"{where}: uses symbolic size(s) {sorted(unknown)} that no input defines "
                    f"(inputs define {sorted(defined) or 'none'}); a backend could not know their value"
                )
            if node.op != "call_function":
                continue
            target = node.target
            if "val" not in node.meta and not (is_check(node) and not node.users):
                raise IRLintError(f"{where}: has no meta['val'] (every value must carry its spec)")
            if isinstance(target, torch._ops.OpOverload):
                if target._schema.is_mutable:
                    raise IRLintError(f"{where}: {target} mutates its arguments; graphs must be functional")
            elif target in _CONTROL_FLOW:
                for sub in node.args:
                    if isinstance(sub, fx.Node) and sub.op == "get_attr":
                        GraphIR(getattr(self.gm, str(sub.target)), name=f"{self.name}.{sub.target}").lint()
            elif target is operator.getitem or _is_sym_helper(target):
                continue
            else:
                raise IRLintError(f"{where}: target {target!r} is not an ATen OpOverload")
        return self

    # ----------------------------------------------------------------------------- identity
    def fingerprint(self) -> str:
        """Stable hash of ops, wiring and specs (not weight values); see the module docstring."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            index: dict[fx.Node, int] = {}

            def enc(a: Any) -> str:
                if isinstance(a, fx.Node):
                    return f"%{index[a]}"
                if isinstance(a, (list, tuple)):
                    return "[" + ",".join(enc(x) for x in a) + "]"
                if isinstance(a, dict):
                    return "{" + ",".join(f"{k}:{enc(v)}" for k, v in sorted(a.items())) + "}"
                if isinstance(a, torch.dtype | torch.device | torch.layout | torch.memory_format):
                    return str(a)
                return repr(a)

            for i, node in enumerate(self.graph.nodes):
                index[node] = i
                val = node.meta.get("val")
                spec = spec_of(val)
                parts = [node.op, _target_name(node), enc(node.args), enc(node.kwargs)]
                if spec is not None:
                    parts.append(spec.key())
                elif isinstance(val, (tuple, list)):
                    parts.append(",".join(s.key() if (s := spec_of(v)) else repr(v) for v in val))
                if node.op == "get_attr":
                    attr = getattr(self.gm, str(node.target))
                    if isinstance(attr, fx.GraphModule):  # a control-flow branch: its body is part of the program
                        parts.append(GraphIR(attr, phase=self.phase).fingerprint())
                    elif isinstance(attr, torch.Tensor):
                        parts.append(spec_of(attr).key())  # type: ignore[union-attr]
                        if attr.numel() <= 64:  # a program constant, not a weight: its value matters
                            parts.append(repr(attr.detach().cpu().tolist()))
                h.update("|".join(parts).encode())
                h.update(b"\n")
            h.update(("kinds:" + ",".join(self.input_kinds) + "|" + self.phase).encode())
            h.update(("symbols:" + ",".join(str(s) for s in self.symbols.values())).encode())
            self._fingerprint = h.hexdigest()[:32]
        return self._fingerprint

    # ----------------------------------------------------------------------------- printing
    def __str__(self) -> str:
        def ref(a: Any) -> str:
            if isinstance(a, fx.Node):
                return f"%{a.name}"
            if isinstance(a, (list, tuple)):
                return "[" + ", ".join(ref(x) for x in a) + "]"
            return repr(a)

        def ann(val: Any) -> str:
            spec = spec_of(val)
            if spec is not None:
                return spec.short()
            if isinstance(val, (tuple, list)):
                return "(" + ", ".join(ann(v) for v in val) + ")"
            if isinstance(val, torch.SymInt):
                return f"SymInt({val.node.expr})"
            return type(val).__name__ if val is not None else "?"

        head = ", ".join(f"{n.name}: {ann(n.meta.get('val'))} {k}" for n, k in zip(self.placeholders, self.input_kinds))
        lines = [f"graph {self.name}({head}):"]
        for node in self.graph.nodes:
            if node.op == "call_function":
                args = [ref(a) for a in node.args] + [f"{k}={ref(v)}" for k, v in node.kwargs.items()]
                lines.append(f"  %{node.name} : {ann(node.meta.get('val'))} = {_target_name(node)}({', '.join(args)})")
            elif node.op == "get_attr":
                lines.append(
                    f"  %{node.name} : {ann(getattr(self.gm, str(node.target), None))} = get_attr {node.target}"
                )
        lines.append("  return (" + ", ".join(ref(o) for o in self.outputs) + ")")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"GraphIR({self.name}, {len(self.op_nodes)} ops, fingerprint={self.fingerprint()[:12]})"

    # ----------------------------------------------------------------------------- helpers
    def example_inputs(self, seed: int = 0) -> list[Any]:
        """Random inputs that match the input specs (never zeros): floats ~ N(0,1), ints in [0, 4)."""
        g = torch.Generator().manual_seed(seed)
        out: list[Any] = []
        for n in self.placeholders:
            val = n.meta.get("val")
            if not isinstance(val, torch.Tensor):
                out.append(int(val) if val is not None else 1)
                continue
            shape = [int(d) for d in val.shape]
            if val.dtype.is_floating_point or val.dtype.is_complex:
                t = torch.randn(shape, generator=g, dtype=torch.float32).to(val.dtype)
            elif val.dtype == torch.bool:
                t = torch.randint(0, 2, shape, generator=g).bool()
            else:
                t = torch.randint(0, 4, shape, generator=g).to(val.dtype)
            out.append(t.to(val.device))
        return out

    def run_reference(self, *args: Any) -> list[Any]:
        """Run the graph through the reference interpreter; returns the flat list of outputs."""
        result = ReferenceInterpreter(self.gm).run(*args)
        return list(result) if isinstance(result, (tuple, list)) else [result]


def _target_name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"aten.{t.__name__}" if t.namespace == "aten" else f"{t.namespace}.{t.__name__}"
    if isinstance(t, str):
        return t
    return getattr(t, "__qualname__", getattr(t, "__name__", repr(t)))


def op_name(node: fx.Node) -> str:
    """The name the capability tables use: ``aten.add.Tensor`` style for ATen ops."""
    return _target_name(node)


def viewed(node: Any) -> Any:
    """What ``node`` is a view of, through any chain of views (``node`` itself where it is none): each
    step an op whose schema says its result aliases its first argument."""
    while isinstance(node, fx.Node) and node.op == "call_function":
        schema = getattr(node.target, "_schema", None)
        returns = schema.returns if schema is not None else ()
        if not (returns and returns[0].alias_info is not None and node.args):
            break
        node = node.args[0]
    return node


class ReferenceInterpreter(fx.Interpreter):
    """Runs a normalized graph one ATen op at a time: the correctness oracle.

    Errors are re-raised with the failing node (``While executing %addmm = aten.addmm(...)``), as
    torch.fx does, so a wrong graph points at its op.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=True)

    def run_node(self, n: fx.Node) -> Any:
        try:
            return super().run_node(n)
        except Exception as e:
            msg = f"{e}\nWhile executing {n.format_node()} in the reference interpreter"
            try:
                err = type(e)(msg)
            except Exception:  # an exception type whose constructor takes other arguments
                err = RuntimeError(msg)
            raise err from e


def ops_in(graphs: Iterable[GraphIR]) -> Counter[str]:
    total: Counter[str] = Counter()
    for g in graphs:
        total.update(g.op_counts())
    return total
