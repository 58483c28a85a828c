"""What a backend is: the object a plugin's ``torchmux_add_backends`` hook returns.

A backend subclasses :class:`Backend` (or provides the same attributes and methods). Keep the class
cheap: importing the module that defines it and calling :meth:`Backend.availability` must not import
the heavy library it wraps; import that inside :meth:`Backend.compile` (see backends/eager.py, the
smallest backend, and plugins.md).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch
import torch.fx as fx

from .ir import GraphIR, op_name

__all__ = ["Availability", "Backend", "CompiledGraph", "CompileRequest", "package_version", "has_cuda"]


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here; if not, ``reason`` says why and what to install or change."""

    ok: bool
    reason: str = ""

    @classmethod
    def yes(cls) -> "Availability":
        return cls(True, "")

    @classmethod
    def no(cls, reason: str) -> "Availability":
        return cls(False, reason)


class CompiledGraph(Protocol):
    """What :meth:`Backend.compile` returns: called with the graph's flat positional inputs, returns
    the flat list (or tuple) of its outputs, in the order of the graph's output node."""

    def __call__(self, *args: Any) -> Sequence[torch.Tensor]: ...


@dataclass(frozen=True)
class CompileRequest:
    """Everything a backend is told when asked to compile one graph."""

    ir: GraphIR
    example_inputs: Sequence[Any]  # real tensors with the input specs (the first call's values)
    mode: str | None = None  # None/"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
    options: Mapping[str, Any] = field(default_factory=dict)  # this backend's options, prefix stripped

    @property
    def device(self) -> str:
        for t in self.example_inputs:
            if isinstance(t, torch.Tensor):
                return t.device.type
        return "cpu"


class Backend:
    """Base class of a backend. Override the attributes and the three methods below."""

    #: unique name users pass as ``backend=``; lower case, no spaces
    name: str = ""
    #: device types it runs on ("cpu", "cuda")
    devices: tuple[str, ...] = ("cpu",)
    #: the distribution whose version :attr:`version` reports (None: report ``"-"``)
    package: str | None = None
    #: one line for ``torchmux list``
    description: str = ""
    #: whether it accepts graphs with symbolic shapes (compile(dynamic=True))
    dynamic_shapes: bool = False
    #: whether "auto" may pick it without the user naming it
    auto: bool = True
    #: device types where it is not competitive untuned: auto does not build it there in default mode
    #: unless this machine saw it come close on a graph of the same kind (autotune/screen.py)
    needs_tuning: tuple[str, ...] = ()
    #: floating dtypes it computes in (integer and bool values pass through any backend that claims the op)
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    #: the Core ATen ops it claims, per floating dtype name (``{"float32": frozenset({"aten.add.Tensor",
    #: ...}), "float16": ...}``), read from the conformance suite's results with
    #: :func:`torchmux.extend.load_claims`; a node whose floating values are all float32 is claimed when
    #: its op is under "float32", and so on. None: :attr:`ops` decides.
    claims: Mapping[str, frozenset[str]] | None = None
    #: the ATen ops it claims in every dtype it lists (``aten.add.Tensor`` style, as
    #: :func:`torchmux.extend.op_name` spells them); None claims every op. Older plugins set this;
    #: :attr:`claims` says more. Claims come from the conformance suite, never from guesses.
    ops: frozenset[str] | None = None

    @property
    def version(self) -> str:
        return package_version(self.package) or "-" if self.package else "-"

    def availability(self) -> Availability:
        """Cheap check (no heavy import): is the package there, the right version, the device present?"""
        return Availability.yes()

    def supports(self, node: fx.Node) -> bool:
        """Per-node capability: True if this backend runs ``node`` correctly. Pure; no side effects.

        The default: every floating value it reads or writes has a dtype in :attr:`dtypes`, and the op
        is claimed in each of those dtypes (:attr:`claims`; in any dtype when the node has no floating
        value), or is in :attr:`ops` (or ``ops`` is None) when ``claims`` is None.
        """
        name = op_name(node)
        floats = node_float_dtypes(node)
        if not all(d in self.dtypes for d in floats):
            return False
        if name == "getitem":
            return True
        if self.claims is not None:
            if floats:
                return all(name in self.claims.get(str(d).removeprefix("torch."), ()) for d in floats)
            return any(name in ops for ops in self.claims.values())
        return self.ops is None or name in self.ops

    def supports_device(self, device: str) -> bool:
        return device in self.devices

    def compile(self, request: CompileRequest) -> CompiledGraph:
        """Compile ``request.ir`` into a callable. Raise any exception to say it cannot: torchmux records
        it as a failed candidate and falls back; it never reaches the user."""
        raise NotImplementedError


def package_version(dist: str | None) -> str | None:
    """The installed version of a distribution, or None; never imports it."""
    if not dist:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def module_present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def has_cuda() -> bool:
    return torch.cuda.is_available()


def version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


Factory = Callable[[], Backend]


def node_float_dtypes(node: fx.Node) -> set[torch.dtype]:
    """The floating dtypes of a node's result and of its tensor arguments."""
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    out: set[torch.dtype] = set()
    for v in vals:
        for t in v if isinstance(v, (tuple, list)) else [v]:
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
                out.add(t.dtype)
    return out
