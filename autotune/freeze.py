"""Frozen inference: an inference graph's weights reach the backends as constants.

A graph that AOTAutograd produced for inference (``ir.phase == "inference"``: no autograd, so no
weight can be trained through it) gets a *frozen* twin: every ``"param"`` and ``"buffer"``
placeholder becomes a ``get_attr`` of the tensor it held on the first call, registered as a buffer of
the twin's ``GraphModule``, and only the user's inputs remain placeholders. Backends then optimize
with the weights in hand: ONNX Runtime gets initializers (constant folding, pre-packed GEMM weights),
Inductor its freezing path, TVM bound params, the Triton code generator constants.

**Staleness.** A backend may have copied, transposed or pre-packed a weight, so a weight that changes
after compiling would give a stale answer. :class:`FrozenCall` checks, before every call, that each
weight argument is the tensor that was frozen and that its autograd version counter has not moved
(about 0.15 us a weight): an in-place change (``load_state_dict``, an optimizer step, ``p.copy_`` or
``p.add_`` under ``no_grad``) bumps the version counter; a new Parameter object fails the identity
test. Any change sends the call back to the runner, which freezes the new weights and rebuilds its
chosen backend only (no new measurement). A graph whose weights changed ``MAX_REFREEZES`` times runs
unfrozen from then on: its weights are not constants, and rebuilding on every change would cost more
than freezing gains.

Writes through ``p.data`` (``p.data.copy_(t)``, ``p.data = t``) are invisible to any cheap check:
PyTorch gives ``.data`` a version counter of its own on purpose, and ``p.data = t`` keeps ``p``'s
counter (only the data pointer moves; reading every weight's pointer per call would double the
check's cost). Code that writes weights that way compiles with ``options={"freeze": False}``; the
README says so.

**Caches.** The twin's fingerprint covers the weights' values (a SHA-256 of their bytes), so on-disk
artifacts keyed by fingerprint (ONNX Runtime's models, TVM's libraries) never serve another set of
weights. Decisions (which backend won) are keyed by structure and remember only a name.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from operator import attrgetter, is_not, itemgetter
from typing import Any

import torch
from torch import fx

from ..core.ir import GraphIR

MAX_REFREEZES = 3  # a graph whose weights changed this often runs unfrozen: its weights are not constants
WEIGHT_KINDS = ("param", "buffer")


def can_freeze(ir: GraphIR) -> bool:
    """Inference graphs with at least one weight, and static shapes (every backend that freezes needs them)."""
    return ir.phase == "inference" and any(k in WEIGHT_KINDS for k in ir.input_kinds) and ir.is_static


def weight_positions(ir: GraphIR) -> list[int]:
    return [i for i, k in enumerate(ir.input_kinds) if k in WEIGHT_KINDS]


def freeze(ir: GraphIR, args: Sequence[Any]) -> GraphIR:
    """The frozen twin of ``ir`` with the weights in ``args`` (see the module docstring); linted.

    Pre: ``can_freeze(ir)``, ``args`` are the graph's full inputs. Post: the twin's placeholders are
    ``ir``'s ``"input"`` placeholders in order; its ``get_attr`` buffers alias the weights (no copy)."""
    # control-flow branches and embedded constants (get_attr of ir.gm) come along, shared, not copied
    gm = fx.GraphModule(ir.gm, copy.deepcopy(ir.gm.graph))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    digest = hashlib.sha256()
    for k, (node, kind, value) in enumerate(zip(placeholders, ir.input_kinds, args)):
        if kind not in WEIGHT_KINDS:
            continue
        name = f"_frozen_{k}"
        tensor = value.detach()
        gm.register_buffer(name, tensor)
        with gm.graph.inserting_before(first_op):
            const = gm.graph.get_attr(name)
        const.meta.update(node.meta)
        node.replace_all_uses_with(const)
        gm.graph.erase_node(node)
        digest.update(f"{k}:{tensor.dtype}:{list(tensor.shape)}:{list(tensor.stride())}".encode())
        digest.update(_bytes(tensor))
    gm.recompile()
    kinds = [k for k in ir.input_kinds if k not in WEIGHT_KINDS]
    frozen = GraphIR(gm, kinds, name=f"{ir.name}_frozen", phase=ir.phase).lint()
    # artifacts keyed by fingerprint hold the weights now: the fingerprint must name them
    frozen._fingerprint = hashlib.sha256(f"{frozen.fingerprint()}|weights={digest.hexdigest()}".encode()).hexdigest()[
        :32
    ]
    return frozen


def _bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else memoryview(b"")


class FrozenCall:
    """What the runner calls for a frozen decision: checks the weights, then runs the compiled twin on
    the user's inputs. ``on_change(args)`` is called instead when a weight is not what was frozen.

    The check is two C-level passes over the weights, about 0.15 us a weight: each argument is the
    very tensor that was frozen (Dynamo passes the Parameter objects themselves; ``load_state_dict(...,
    assign=True)`` or a new module gives other ones), and its version counter has not moved."""

    __slots__ = ("_user", "_weights", "fn", "on_change", "tensors", "versions")

    def __init__(
        self, fn: Callable[..., Any], ir: GraphIR, args: Sequence[Any], on_change: Callable[[Sequence[Any]], Any]
    ) -> None:
        self.fn = fn
        weights = weight_positions(ir)
        self._weights = _picker(weights)
        self._user = _picker([i for i in range(len(ir.input_kinds)) if i not in set(weights)])
        self.tensors = self._weights(args)
        self.versions = tuple(map(_VERSION, self.tensors))
        self.on_change = on_change

    def unchanged(self, args: Sequence[Any]) -> bool:
        return (
            not any(map(is_not, self._weights(args), self.tensors))
            and tuple(map(_VERSION, self.tensors)) == self.versions
        )

    def __call__(self, *args: Any) -> Any:
        if any(map(is_not, self._weights(args), self.tensors)) or tuple(map(_VERSION, self.tensors)) != self.versions:
            return self.on_change(args)(*args)  # unchanged(), inlined: this is every call's path
        return self.fn(*self._user(args))


_VERSION = attrgetter("_version")


def _picker(positions: Sequence[int]) -> Callable[[Sequence[Any]], tuple]:
    """A C-level function that returns ``tuple(args[i] for i in positions)``."""
    if len(positions) == 1:  # a slice of the argument tuple is a tuple: no Python frame per call
        only = positions[0]
        return itemgetter(slice(only, only + 1))
    if not positions:
        return lambda args: ()
    return itemgetter(*positions)


class UserInputs:
    """Adapts a callable of the frozen twin (user inputs only) to the full argument list, for the
    tuner's placements; no check (the tuner calls it on the weights it froze)."""

    def __init__(self, fn: Callable[..., Any], user: Sequence[int]) -> None:
        self.fn, self.user = fn, list(user)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*[args[i] for i in self.user])
