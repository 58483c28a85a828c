"""The second frontend: ``torch.export`` captures the whole program, for a package (``torchmux.export``).

Dynamo (``dynamo.py``) captures graphs behind a live module and stays in every call; a deployed
artifact must not. Here ``torch.export.export`` captures the program once, whole, and the result is
normalized into the same IR as Dynamo's graphs, so placement, tuning, verification and the backends
behind both are one:

1. **Capture.** ``torch.export.export(model, args, kwargs, dynamic_shapes=..., strict=...)``. Where it
   refuses the program (a graph break: a data-dependent branch, ``.item()`` feeding Python) and the mend
   pass is on, the mend pass rewrites the model's source (``frontends/mend``) and export is tried again
   with its rewrites active (a data-dependent ``if`` becomes ``torch.cond``, an asserted ``.item()``
   size gets its ``torch._check``). Where it still refuses, :class:`ExportRefused` lists every break with
   the user's file:line, from ``torchmux.explain``: never a silently partial package.
2. **Normalize.** ``ExportedProgram.run_decompositions()`` gives functional Core ATen with parameters,
   buffers and constant tensors lifted to placeholders (the graph signature says which is which), the
   user's inputs after them: exactly a :class:`GraphIR` with ``input_kinds``. Only inference programs
   are taken (no buffer mutation, no gradient): training goes through ``torchmux.compile``.
3. The placement layer then freezes it (``autotune/freeze.py``): the weights become ``get_attr``
   constants, as for an inference graph under ``compile()``, and the frozen graph's placeholders are the
   user's flattened inputs in ``ExportedProgram``'s order, its outputs the program's flattened outputs.

The :class:`Captured` result keeps the undecomposed ``ExportedProgram`` beside the IR: it is what the
package stores (``torch.export.load`` reads it back, so eager always works) and what backends with a
torch-level exporter of their own build their native artifact from (``CompileRequest.program``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

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


def capture(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
    mend: bool = True,
) -> Captured:
    """Export ``model`` whole and normalize it (the module docstring's steps 1-3)."""
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
    first: BaseException | None = None
    mended = False
    try:
        with torch.no_grad():
            program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as e:  # a break, an unsupported construct: the mend pass may remove it
        if not mend or _is_argument_error(e):
            raise ExportRefused(_refusal(model, args, kwargs, e, None)) from e
        first = e
        program = _export_mended(model, args, kwargs, dynamic_shapes, strict)
        if isinstance(program, BaseException):
            raise ExportRefused(_refusal(model, args, kwargs, first, program)) from first
        mended = True
    ir, weights = normalize(program)
    return Captured(program, ir, weights, strict, mended)


def _is_argument_error(e: BaseException) -> bool:
    """A mistake in what the user passed (dynamic_shapes that do not fit the inputs), not a break to mend."""
    name = type(e).__name__
    return name in ("UserError",) and "dynamic_shapes" in str(e) or isinstance(e, (TypeError, ValueError))


def _export_mended(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any, strict: bool
) -> torch.export.ExportedProgram | BaseException:
    from .mend import mend, tracing

    try:
        rewritten, _ = mend(model)
    except Exception as e:
        return e
    if rewritten is model:
        return RuntimeError("the mend pass found nothing to rewrite")
    try:
        with torch.no_grad(), tracing():
            return torch.export.export(rewritten, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as e:
        return e


def _refusal(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    error: BaseException,
    mended: BaseException | None,
) -> str:
    """What export refused, and every break ``torchmux.explain`` finds with the user's file:line."""
    reason = next((ln.strip() for ln in str(error).splitlines() if ln.strip()), type(error).__name__)
    lines = [f"torch.export refused the program: {type(error).__name__}: {reason[:400]}"]
    if mended is not None:
        again = next((ln.strip() for ln in str(mended).splitlines() if ln.strip()), type(mended).__name__)
        lines.append(f"after the mend pass rewrote its source, export refused it again: {again[:300]}")
    try:
        from ..api.explain import explain

        report = explain(model, *args, **kwargs)
        breaks = [b for b in getattr(report, "breaks", [])]
        for b in breaks:
            lines.append(f"  break: {b}")
    except Exception as e:  # explain itself failed: the first reason is still the answer
        lines.append(f"  (torchmux.explain could not list the breaks: {type(e).__name__}: {str(e)[:200]})")
    lines.append(
        "A package holds the whole program in one graph: remove each break (torch.cond for a branch on a "
        "tensor, torch._check for a size read with .item()), or use torchmux.compile, which runs Python "
        "between graphs."
    )
    return "\n".join(lines)


def normalize(program: torch.export.ExportedProgram) -> tuple[GraphIR, list[torch.Tensor]]:
    """The program's IR (Core ATen, weights lifted, linted) and its weights in placeholder order.

    Raises :class:`BadArgumentError` for a program that is not inference: one that mutates a buffer or
    an input (batch norm in training, an in-place update of an argument)."""
    from torch.export.graph_signature import OutputKind

    decomposed = program.run_decompositions()
    signature = decomposed.graph_signature
    mutating = [o for o in signature.output_specs if o.kind != OutputKind.USER_OUTPUT]
    if mutating:
        what = ", ".join(f"{o.kind.name.lower()} {o.target or o.arg.name}" for o in mutating[:4])
        raise BadArgumentError(
            f"the exported program writes state ({what}): a package is for inference; call model.eval(), "
            "or train with torchmux.compile"
        )
    kinds = [_KIND.get(s.kind.name) for s in signature.input_specs]
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
    gm = decomposed.graph_module
    _flatten_output(gm)
    ir = GraphIR(gm, [k for k in kinds if k is not None], name="program", phase="inference").lint()
    return ir, weights


def _flatten_output(gm: torch.fx.GraphModule) -> None:
    """The IR's output node returns a flat tuple: an exported graph's is one already (a list in some
    versions): make it a tuple."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    value = out.args[0]
    if isinstance(value, list):
        out.args = (tuple(value),)
        gm.recompile()


def user_inputs(program: torch.export.ExportedProgram, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    """The flat user inputs, in the program's order, of a call with ``args`` and ``kwargs``."""
    flat, _ = torch.utils._pytree.tree_flatten((tuple(args), dict(kwargs)))
    return flat
