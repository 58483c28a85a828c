"""The second frontend: ``torch.export`` captures the whole program, for a package (``torchmux.export``).

Dynamo (``dynamo.py``) captures graphs behind a live module and stays in every call; a deployed
artifact must not. Here ``torch.export.export`` captures the program once, whole, and the result is
normalized into the same IR as Dynamo's graphs, so placement, tuning, verification and the backends
behind both are one:

1. **Capture.** ``torch.export.export(model, args, kwargs, dynamic_shapes=...)`` in the mode asked
   (``strict=False``, torch's default, unless told), then in the other: non-strict traces the Python as
   it runs and strict (TorchDynamo) reads its bytecode, and each takes programs the other refuses (strict
   keeps ``int(t.max())`` a symbolic size where non-strict needs a Python int). Where both refuse the
   program (a graph break: a data-dependent branch or loop) and the mend pass is on, the mend pass
   rewrites the model's source (``frontends/mend``, installed on the instances for this capture only)
   and both modes are tried again with its rewrites active: a data-dependent ``if`` becomes
   ``torch.where`` where both sides can run, else ``torch.cond``; a ``while`` on a tensor becomes
   ``torch.while_loop``; a check on the data (``if (x < 0).any(): raise ValueError(...)``, ``assert``)
   becomes ``torch._check`` on the test's value, which export keeps as a runtime assertion (the
   program raises a RuntimeError where eager raised the user's exception). Before the mend pass, where
   non-strict export refused a value read from the data, a branch on the model's own **buffers** is
   fixed (:func:`_export_fixed`): a package is frozen inference, its buffers are constants, and a test
   on them (``if self.initialized.item() == 0:``, the first-call initialization of ActNorm and
   data-dependent inits) has one answer for every call. Where it still refuses, :class:`ExportRefused` gives each mode's reason and
   lists every break with the user's file:line, from ``torchmux.explain``: never a silently partial
   package.
2. **Normalize.** ``ExportedProgram.run_decompositions()`` gives functional Core ATen with parameters,
   buffers and constant tensors lifted to placeholders (the graph signature says which is which), the
   user's inputs after them: exactly a :class:`GraphIR` with ``input_kinds``. Only inference programs
   are taken (no buffer mutation, no gradient): training goes through ``torchmux.compile``. A program
   that writes one of its inputs in place (``nn.ReLU(inplace=True)`` first in a residual block, common
   in research code) is taken with a warning: the IR returns the user's outputs, and the compiled
   graphs do not write the caller's tensors.
3. The placement layer then freezes it (``autotune/freeze.py``): the weights become ``get_attr``
   constants, as for an inference graph under ``compile()``, and the frozen graph's placeholders are the
   user's flattened inputs in ``ExportedProgram``'s order, its outputs the program's flattened outputs.

The :class:`Captured` result keeps the undecomposed ``ExportedProgram`` beside the IR: it is what the
package stores (``torch.export.load`` reads it back, so eager always works) and what backends with a
torch-level exporter of their own build their native artifact from (``CompileRequest.program``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..core.errors import BadArgumentError, TorchmuxError
from ..core.ir import GraphIR

__all__ = ["Captured", "ExportRefused", "capture", "normalize"]

_KIND = {"PARAMETER": "param", "BUFFER": "buffer", "CONSTANT_TENSOR": "buffer", "USER_INPUT": "input"}


class ExportRefused(TorchmuxError):
    """``torch.export`` refused the program, with and without the mend pass; the message lists each break."""


@dataclass
class Captured:
    """One exported program: the ``ExportedProgram`` as captured (what the package stores), its
    normalized IR with every input (weights lifted), and how capture went."""

    program: torch.export.ExportedProgram
    ir: GraphIR
    weights: list[torch.Tensor]  # the lifted weights, in the IR's placeholder order
    strict: bool
    mended: bool  # export took the program only after the mend pass rewrote it
    #: buffers the program read as Python numbers, fixed at these values (:func:`_export_fixed`)
    fixed: dict[str, torch.Tensor] = field(default_factory=dict)


def capture(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
    mend: bool = True,
    breaks: Callable[[], list[str]] | None = None,
) -> Captured:
    """Export ``model`` whole and normalize it (the module docstring's steps 1-3). ``breaks``: what a
    refusal lists as the program's graph breaks, one line each (the API layer passes ``torchmux.explain``'s;
    this layer knows nothing above the IR)."""
    if not isinstance(model, torch.nn.Module):
        raise BadArgumentError(
            f"torchmux.export needs an nn.Module (as torch.export.export does), got {type(model).__name__}; "
            "wrap a function in an nn.Module whose forward calls it"
        )
    if not isinstance(args, tuple):
        raise BadArgumentError(f"args must be a tuple of example inputs (as torch.export's), got {type(args).__name__}")
    if model.training:
        raise BadArgumentError(
            "torchmux.export makes an inference package, and the model is in training mode; call model.eval() "
            "first (to train, use torchmux.compile)"
        )
    kwargs = dict(kwargs or {})
    _check_leaves(model, args, kwargs)
    # torch.export's own modes first, the asked one before the other: non-strict (torch's default) traces
    # the Python as it runs, strict (TorchDynamo) reads the bytecode; each takes programs the other refuses
    modes = (strict, not strict)
    refusals: list[tuple[str, BaseException]] = []
    for mode in modes:
        program = _export(model, args, kwargs, dynamic_shapes, mode)
        if not isinstance(program, BaseException):
            return _captured(program, mode, False)
        if _is_argument_error(program):
            raise ExportRefused(_refusal([(_mode_name(mode), program)], breaks)) from program
        refusals.append((_mode_name(mode), program))
    if any(_data_dependent(e) for _, e in refusals):
        fixed = _export_fixed(model, args, kwargs, dynamic_shapes)
        if not isinstance(fixed, BaseException):
            return _captured(fixed[0], False, False, fixed[1])
        if not isinstance(fixed, _NothingFixed):
            refusals.append(("non-strict, the buffers it branches on fixed", fixed))
    if mend:
        mended = _export_mended(model, args, kwargs, dynamic_shapes, modes)
        if not isinstance(mended, list):
            return _captured(*mended, True)
        refusals += mended
    raise ExportRefused(_refusal(refusals, breaks)) from refusals[0][1]


#: what a package's call may take besides tensors: numbers and names it holds fixed and checks each call
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _check_leaves(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A clear error for an example input a package cannot take: a module, a function or another object
    passed as an argument (a residual block called with its sublayer), which torch.export bakes into the
    program and a saved package could neither store nor check."""
    try:
        names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        names = []
    named = [(names[i] if i < len(names) else f"#{i}", v) for i, v in enumerate(args)] + list(kwargs.items())
    for name, value in named:
        for leaf in pytree.tree_leaves(value):
            if not isinstance(leaf, (torch.Tensor, *_PLAIN)):
                raise BadArgumentError(
                    f"torchmux.export: the example input {name!r} holds a {type(leaf).__name__}; a package's inputs "
                    "are tensors and plain numbers (what it can store and check each call). Make it part of the "
                    "model (an attribute set in __init__), or export a wrapper module that holds it"
                )


def _captured(
    program: torch.export.ExportedProgram, strict: bool, mended: bool, fixed: dict[str, torch.Tensor] | None = None
) -> Captured:
    ir, weights, written = _normalize(program)
    if written:
        warnings.warn(
            f"torchmux.export: the model writes its input(s) {', '.join(written)} in place (an in-place op on an "
            "argument, such as nn.ReLU(inplace=True) first in a block); the package's compiled graphs return the "
            "same outputs and do not write the caller's tensors",
            stacklevel=3,
        )
    if fixed:
        warnings.warn(
            f"torchmux.export: the program branches on the value of buffer(s) {', '.join(sorted(fixed))}; the "
            "package holds them fixed at their values now (a package's buffers are constants), and its "
            "load_state_dict takes only those values for them: export again to change them",
            stacklevel=3,
        )
    return Captured(program, ir, weights, strict, mended, dict(fixed or {}))


def _mode_name(strict: bool) -> str:
    return "strict" if strict else "non-strict"


def _export(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any, strict: bool
) -> torch.export.ExportedProgram | Exception:
    """``torch.export.export`` in one mode, or the exception it raised (a break, an unsupported construct)."""
    try:
        with torch.no_grad():
            program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as e:  # the refusal is the answer; the caller tries the next way
        return e
    return _unsound(program) or program


def _unsound(program: torch.export.ExportedProgram) -> Exception | None:
    """A program export gave but cannot run: one holding a fake tensor (tracing's stand-in) as a weight or
    constant. Strict export gives one for ``self.weight.data`` used in the forward (torch 2.13, where
    non-strict refuses it), and decomposing it crashes the process; it is a refusal like any other."""
    from torch._subclasses.fake_tensor import is_fake

    held = {**program.state_dict, **program.constants}
    fake = [name for name, value in held.items() if isinstance(value, torch.Tensor) and is_fake(value)]
    if fake:
        return RuntimeError(
            f"torch.export gave a program whose {fake[0]} is a fake tensor (a value it could not trace, such as "
            "a parameter's .data read in the forward)"
        )
    return None


def _data_dependent(e: BaseException) -> bool:
    """A refusal on a value read from the data (``.item()``, ``bool()`` of a tensor) that a branch tests."""
    return type(e).__name__ == "GuardOnDataDependentSymNode" or "data-dependent" in str(e)


class _NothingFixed(Exception):
    """The program reads no buffer as a Python number: fixing buffers cannot take it."""


#: what turns a tensor into a Python value a branch can test
_AS_NUMBER = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__"})


class _BufferReads(torch.overrides.TorchFunctionMode):
    """While non-strict export traces: every op whose tensors are the demoted buffers (real tensors there,
    where the user's inputs and weights are fake) or values computed from them alone runs on the real
    values, outside tracing, so a test on them has its answer; records which buffers reach a Python
    number (``.item()``, ``bool()``, ...). An op that mixes them with traced (fake) values is traced as
    usual (export lifts the real tensor as a constant)."""

    def __init__(self, roots: Mapping[int, torch.Tensor], names: Mapping[int, str]) -> None:
        super().__init__()
        self.sources: dict[int, frozenset[str]] = {i: frozenset({names[i]}) for i in roots}
        self.keep: list[Any] = list(roots.values())  # the objects whose ids ``sources`` holds stay alive
        self.read: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch._subclasses.fake_tensor import is_fake
        from torch.utils._python_dispatch import _disable_current_modes

        kwargs = kwargs or {}
        tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        sources = frozenset().union(*(self.sources.get(id(t), frozenset()) for t in tensors))
        if not sources or any(is_fake(t) for t in tensors):
            return func(*args, **kwargs)
        if getattr(func, "__name__", "") in _AS_NUMBER:
            self.read |= sources
        with _disable_current_modes():
            out = func(*args, **kwargs)
        for o in pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor):
                self.sources[id(o)] = sources
                self.keep.append(o)
        return out


def _export_fixed(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any
) -> tuple[torch.export.ExportedProgram, dict[str, torch.Tensor]] | BaseException:
    """Non-strict export with the buffers the program reads as Python numbers fixed: the program and those
    buffers' values, or why not.

    Export traces buffers as fake tensors, so ``if self.initialized.item() == 0:`` is a test on unknown
    data. A package's buffers are constants (frozen inference), so the test has one answer: the model's
    buffers are demoted to plain attributes holding copies (export then keeps them real), and
    :class:`_BufferReads` computes what depends on them alone and records which reach a Python number.
    A second export demotes only those, so every other buffer stays a buffer (``load_state_dict`` can
    swap it). A copy the program writes (the branch taken initializes the state it tests) is refused: run
    the model once, then export. The user's module is left as it was."""
    names = _buffer_names(model)
    if not names:
        return _NothingFixed()
    first = _export_demoted(model, args, kwargs, dynamic_shapes, set(names.values()))
    if isinstance(first, BaseException):
        return first
    read = first[1]
    if not read:
        return _NothingFixed()
    second = _export_demoted(model, args, kwargs, dynamic_shapes, read)
    if isinstance(second, BaseException):
        return second
    program, _, values = second
    return program, values


def _buffer_names(model: torch.nn.Module) -> dict[int, str]:
    """Each buffer tensor's first name (a buffer shared by two modules has one)."""
    names: dict[int, str] = {}
    for name, buf in model.named_buffers(remove_duplicate=False):
        names.setdefault(id(buf), name)
    return names


def _export_demoted(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any, demote: set[str]
) -> tuple[torch.export.ExportedProgram, set[str], dict[str, torch.Tensor]] | BaseException:
    """Export non-strict with the buffers named ``demote`` held as plain attributes (copies); the program,
    the demoted buffers read as Python numbers, and the demoted buffers' values."""
    names = _buffer_names(model)
    copies: dict[int, torch.Tensor] = {}  # buffer id -> its copy (one copy for a shared buffer)
    saved: list[tuple[torch.nn.Module, dict[str, Any]]] = []
    try:
        for module in model.modules():
            own = module._buffers
            mine = {k: b for k, b in own.items() if b is not None and names.get(id(b)) in demote}
            if not mine:
                continue
            saved.append((module, own))
            module._buffers = {k: b for k, b in own.items() if k not in mine}
            for k, b in mine.items():
                module.__dict__[k] = copies.setdefault(id(b), b.detach().clone())
        versions = {i: c._version for i, c in copies.items()}
        reads = _BufferReads({id(c): c for c in copies.values()}, {id(c): names[i] for i, c in copies.items()})
        refused: Exception | None = None
        try:
            with torch.no_grad(), reads:
                program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
        except Exception as e:
            refused = e
        # a write to a copy is one the program would lose: refused (also where export then failed on it)
        written = sorted(names[i] for i, c in copies.items() if c._version != versions[i])
        tested = [name for name in written if name in reads.read]
        if tested:
            return BadArgumentError(
                f"the branch the program takes now writes buffer(s) {', '.join(tested)}, which it tests (a "
                "first-call initialization, as ActNorm's): call the model once on real data so it initializes, "
                "then export"
            )
        if written:
            return BadArgumentError(
                f"the exported program writes state (buffer(s) {', '.join(written)}): a package is for inference; "
                "call model.eval(), or train with torchmux.compile"
            )
        if refused is not None:
            return refused
        return program, reads.read, {names[i]: c for i, c in copies.items()}
    finally:
        for module, own in saved:
            for k in own:
                module.__dict__.pop(k, None)
            module._buffers = own


def _is_argument_error(e: BaseException) -> bool:
    """A mistake in what the user passed (dynamic_shapes that do not fit the inputs), not a break to mend:
    no other mode or rewrite can take the program then."""
    return type(e).__name__ == "UserError" and "dynamic_shapes" in str(e)


def _export_mended(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_shapes: Any,
    modes: tuple[bool, bool],
) -> tuple[torch.export.ExportedProgram, bool] | list[tuple[str, BaseException]]:
    """Export again with the mend pass's rewrites installed on the model's instances (the user's methods
    come back afterwards: the program does not need them) and Dynamo's switches on (strict mode reads
    them; the rewritten code's runtime helpers take ``torch.cond`` / ``torch.where`` /
    ``torch.while_loop`` in both modes). The program and its mode, or each mode's refusal."""
    from .mend import mended, tracing

    try:
        with mended(model, export=True) as (target, rewrites):
            if not rewrites.applied:
                return [("mend", RuntimeError("the mend pass found nothing it can rewrite"))]
            refusals: list[tuple[str, BaseException]] = []
            for mode in modes:
                with tracing():
                    program = _export(target, args, kwargs, dynamic_shapes, mode)
                if not isinstance(program, BaseException):
                    return program, mode
                refusals.append((f"{_mode_name(mode)}, after the mend pass", program))
            return refusals
    except Exception as e:  # the mend pass itself failed: the first refusal stands
        return [("mend", e)]


def _refusal(refusals: list[tuple[str, BaseException]], breaks: Callable[[], list[str]] | None) -> str:
    """Why each way of exporting refused, and the program's breaks as ``breaks`` lists them."""
    lines = [f"torch.export refused the program: {_reason(refusals[0][1], 400)}"]
    lines += [f"  {how}: {_reason(e, 300)}" for how, e in refusals]
    lines += breaks() if breaks is not None else []
    lines.append(
        "A package holds the whole program in one graph: remove each break (torch.cond for a branch on a "
        "tensor, torch._check for a size read with .item()), or use torchmux.compile, which runs Python "
        "between graphs."
    )
    return "\n".join(lines)


def _reason(e: BaseException, limit: int) -> str:
    """The exception's type and first non-empty line."""
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {first}"[:limit]


def normalize(program: torch.export.ExportedProgram) -> tuple[GraphIR, list[torch.Tensor]]:
    """The program's IR (Core ATen, weights lifted, linted) and its weights in placeholder order.

    Raises :class:`BadArgumentError` for a program that is not inference: one that mutates a buffer
    (batch norm in training); effect tokens (the order of ops with side effects, such as the error check
    of ``torch.inverse``) are no state and are removed as torch's own pass removes them. The new values of
    inputs the program writes in place (an in-place op on
    an argument) are left out of the IR's outputs: a backend's graph returns values and leaves the
    caller's tensors as they were."""
    ir, weights, _ = _normalize(program)
    return ir, weights


def _normalize(program: torch.export.ExportedProgram) -> tuple[GraphIR, list[torch.Tensor], list[str]]:
    """:func:`normalize`, and the names of the user inputs the program writes in place."""
    from torch.export.graph_signature import OutputKind

    decomposed = program.run_decompositions()
    if any(
        s.kind.name == "TOKEN"
        for s in [*decomposed.graph_signature.input_specs, *decomposed.graph_signature.output_specs]
    ):
        # effect tokens order ops with side effects (torch.inverse's error check): no state a call keeps.
        # torch's own pass puts those ops back in place, in order, without the tokens
        from torch.export._remove_effect_tokens_pass import _remove_effect_tokens

        decomposed = _remove_effect_tokens(decomposed)
    signature = decomposed.graph_signature
    buffers = {str(o.target) for o in signature.output_specs if o.kind == OutputKind.BUFFER_MUTATION}
    unread = _unread_buffers(decomposed.graph_module, signature.input_specs, buffers) if buffers else set()
    mutating = [
        o
        for o in signature.output_specs
        if o.kind not in (OutputKind.USER_OUTPUT, OutputKind.USER_INPUT_MUTATION)
        and not (o.kind == OutputKind.BUFFER_MUTATION and o.target in unread)
    ]
    if mutating:
        what = ", ".join(f"{o.kind.name.lower()} {o.target or o.arg.name}" for o in mutating[:4])
        raise BadArgumentError(
            f"the exported program writes state ({what}): a package is for inference; call model.eval(), "
            "or train with torchmux.compile"
        )
    gm = decomposed.graph_module
    specs = _tensor_inputs_only(gm, signature.input_specs)
    kinds = [_KIND.get(s.kind.name) for s in specs]
    if None in kinds:
        bad = [s.kind.name for s in signature.input_specs if s.kind.name not in _KIND]
        raise BadArgumentError(f"the exported program takes inputs of a kind a package cannot hold: {bad}")
    weights: list[torch.Tensor] = []
    for spec in signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            continue
        value = decomposed.state_dict.get(spec.target) if spec.target in decomposed.state_dict else None
        if value is None:
            value = decomposed.constants[spec.target]
        weights.append(value.detach())
    _flatten_output(gm, [o.kind == OutputKind.USER_OUTPUT for o in signature.output_specs])
    ir = GraphIR(gm, [k for k in kinds if k is not None], name="program", phase="inference").lint()
    written = [str(o.target) for o in signature.output_specs if o.kind == OutputKind.USER_INPUT_MUTATION]
    return ir, weights, written


def _unread_buffers(gm: torch.fx.GraphModule, specs: Sequence[Any], buffers: set[str]) -> set[str]:
    """Of the buffers the program writes (``buffers``), those whose values it never reads (a NoisyNet layer drawing its noise into its own
    buffers each call: ``torch.randn(..., out=self.epsilon)``): no output of the functional graph, the new
    values written back included, depends on what the buffer held, so no answer of this call or a later
    one depends on what a call leaves there, and a package may drop the write (as it drops an input's,
    ``_flatten_output``). A value flows from a node to each node that takes it, except into an op that reads
    only its argument's shape (``normal_functional``, ``*_like``) and into the base of a scatter that
    overwrites all of it (``copy``, a whole ``as_strided_scatter``)."""
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    unread = set()
    for spec in specs:
        start = placeholders.get(spec.arg.name) if spec.kind.name == "BUFFER" and spec.target in buffers else None
        if start is None:
            continue
        reached = {start}
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target in _SHAPE_ONLY:
                continue
            sources = node.all_input_nodes
            if node.target is torch.ops.aten.copy.default or _whole_scatter(node):
                sources = [a for a in node.args[1:2] if isinstance(a, torch.fx.Node)]
            if any(a in reached for a in sources):
                reached.add(node)
        if not any(a in reached for a in output.all_input_nodes):
            unread.add(str(spec.target))
    return unread


#: ops whose result takes only its tensor argument's shape, dtype and device, not its values
_SHAPE_ONLY = {
    torch.ops.aten.normal_functional.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.zeros_like.default,
    torch.ops.aten.ones_like.default,
    torch.ops.aten.full_like.default,
    torch.ops.aten.rand_like.default,
    torch.ops.aten.randn_like.default,
    torch.ops.aten.sym_size.int,
}


def _whole_scatter(node: torch.fx.Node) -> bool:
    """An ``as_strided_scatter`` that writes every element of its (contiguous) base: its result is the
    source's values, the base's shape."""
    if node.target is not torch.ops.aten.as_strided_scatter.default or len(node.args) < 4:
        return False
    base = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    offset = node.args[4] if len(node.args) > 4 else node.kwargs.get("storage_offset")
    return (
        isinstance(base, torch.Tensor)
        and base.is_contiguous()
        and list(node.args[2]) == list(base.shape)  # type: ignore[arg-type]
        and list(node.args[3]) == list(base.stride())  # type: ignore[arg-type]
        and offset in (None, 0)
    )


def _tensor_inputs_only(gm: torch.fx.GraphModule, specs: Sequence[Any]) -> list[Any]:
    """The input specs without the user's Python numbers, strings and bools: ``torch.export`` keeps each
    as a placeholder no node reads (it specialized the program to the value; the placeholder's ``val`` is
    that value, and ``core.package.constant_inputs`` tells the package's call to check it), so the IR's inputs are
    tensors only. One the program computes with (a symbolic int) is refused: say what to do instead."""
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    kept = []
    for spec in specs:
        node = placeholders.get(spec.arg.name) if spec.kind.name == "USER_INPUT" else None
        if node is None or isinstance(node.meta.get("val"), torch.Tensor):
            kept.append(spec)
            continue
        if node.users:
            raise BadArgumentError(
                f"the exported program computes with its input {spec.arg.name!r}, a Python "
                f"{type(node.meta.get('val')).__name__} it traced symbolically: a package takes tensors and fixed "
                "Python values; pass it as a tensor, or leave it out of dynamic_shapes so it is fixed"
            )
        gm.graph.erase_node(node)
    if len(kept) != len(specs):
        gm.recompile()
    return kept


def _flatten_output(gm: torch.fx.GraphModule, kept: list[bool]) -> None:
    """The IR's output node returns a flat tuple of the user's outputs: an exported graph's is flat
    already (a list in some versions), and returns the new value of each input the program writes in
    place before them (``nn.ReLU(inplace=True)`` on an argument): the IR leaves those out, as
    ``ExportedProgram.module()`` returns only the user's outputs."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    value = tuple(out.args[0])
    user = tuple(v for v, keep in zip(value, kept) if keep)
    if user != out.args[0]:
        out.args = (user,)
        gm.graph.eliminate_dead_code()
        gm.recompile()


def user_inputs(program: torch.export.ExportedProgram, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    """The flat user inputs, in the program's order, of a call with ``args`` and ``kwargs``."""
    flat, _ = pytree.tree_flatten((tuple(args), dict(kwargs)))
    return flat
