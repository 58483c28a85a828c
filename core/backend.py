"""What a backend is: the object a plugin's ``torchmux_add_backends`` hook returns.

A backend subclasses :class:`Backend` (or provides the same attributes and methods). Keep the class
cheap: importing the module that defines it and calling :meth:`Backend.availability` must not import
the heavy library it wraps; import that inside :meth:`Backend.compile` (see backends/eager.py, the
smallest backend, and plugins.md).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.fx as fx

from .ir import GraphIR, op_name

_log = logging.getLogger("torchmux")

__all__ = [
    "CONTRACT_VERSION",
    "Availability",
    "Backend",
    "CompiledGraph",
    "CompileRequest",
    "LoadRequest",
    "Option",
    "SavedGraph",
    "has_cuda",
    "kernel_count_of",
    "package_version",
]

#: The version of the backend contract this torchmux implements. A backend says which version it was
#: written against in :attr:`Backend.contract_version`; the registry refuses a backend written for a
#: newer contract (it may rely on what this torchmux does not do) and accepts every older one.
#: 1: name, devices, dtypes, ops/claims, availability(), supports(), compile().
#: 2: + phases, granularity, min_region_ops, options_schema, estimate_seconds(), kernel_count.
#: 3: + save(), load() (a compiled graph in a package, ``torchmux.export``), CompileRequest.program.
CONTRACT_VERSION = 3

PHASES = ("inference", "forward", "backward")
GRANULARITIES = ("ops", "regions", "graph")


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here; if not, ``reason`` says why and what to install or change."""

    ok: bool
    reason: str = ""

    @classmethod
    def yes(cls) -> Availability:
        return cls(True, "")

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


class CompiledGraph(Protocol):
    """What :meth:`Backend.compile` returns: called with the graph's flat positional inputs, returns
    the flat list (or tuple) of its outputs, in the order of the graph's output node (a backward
    graph's outputs may hold ``None`` for inputs that need no gradient: return ``None`` there too).

    A code generator may also give the callable an int attribute ``kernel_count`` (how many kernels
    the graph became); ``torchmux.explain`` reports it. :func:`kernel_count_of` reads it.
    """

    def __call__(self, *args: Any) -> Sequence[torch.Tensor | None]: ...


def kernel_count_of(fn: Any) -> int | None:
    """The compiled callable's ``kernel_count`` if it declares one as a non-negative int, else None."""
    count = getattr(fn, "kernel_count", None)
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


@dataclass(frozen=True)
class Option:
    """One option a backend accepts (``options={"<backend>.<name>": value}``), checked at ``compile()``.

    ``type`` is the type (or tuple of types) a value must have (an int passes for float); ``default``
    is what the backend uses when the option is not given (documentation: the backend applies it).
    """

    type: type | tuple[type, ...]
    default: Any
    help: str

    def check(self, value: Any) -> bool:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            return True
        return isinstance(value, types)

    @property
    def type_name(self) -> str:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        return " or ".join(t.__name__ for t in types)


@dataclass(frozen=True)
class CompileRequest:
    """Everything a backend is told when asked to compile one graph."""

    ir: GraphIR
    example_inputs: Sequence[Any]  # real tensors with the input specs (the first call's values)
    mode: str | None = None  # None/"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
    options: Mapping[str, Any] = field(default_factory=dict)  # this backend's options, prefix stripped
    #: the CPU threads the compiled graph may use: torch's intra-op thread count when the request was made
    #: (the user's ``torch.set_num_threads``; a trial child runs under its parent's). A library with a
    #: pool of its own (ONNX Runtime, TVM, NumPy's BLAS) is not bound by torch's setting: size it to this
    threads: int = field(default_factory=torch.get_num_threads)
    #: the whole program as ``torch.export`` captured it (an ``ExportedProgram``, not decomposed), when the
    #: graph comes from ``torchmux.export``; else None. ``ir`` is this program normalized and frozen: its
    #: placeholders are the program's flattened user inputs, its outputs the program's flattened outputs.
    #: A backend with a torch-level exporter of its own (torch.onnx, AOTInductor) may build from this
    #: instead of ``ir``, and must then answer as ``ir`` does; the others ignore it
    program: Any = None

    @property
    def device(self) -> str:
        for t in self.example_inputs:
            if isinstance(t, torch.Tensor):
                return t.device.type
        return "cpu"


@dataclass(frozen=True)
class SavedGraph:
    """A compiled graph in its native deployable form, as :meth:`Backend.save` returns it and a package
    stores it: named files (an ``.onnx`` model, an AOTInductor ``.pt2``), JSON-able ``meta`` (how to
    open them: providers, options), and whether the files hold machine code (``native``: a package
    loads those only when their signature verifies, ``core/package.py``)."""

    files: Mapping[str, bytes]
    meta: Mapping[str, Any] = field(default_factory=dict)
    native: bool = False


@dataclass(frozen=True)
class LoadRequest:
    """What :meth:`Backend.load` is told: the saved graph, where and with how many threads it runs,
    this backend's options, the stored program (``program()`` reads it: for a backend whose artifact
    is the program itself, and to answer ``in_spec``-shaped calls), and the program's weights and
    constant tensors (``weights()``: name -> NumPy array on the CPU, read from the package without
    deserializing the program; views of the package's checked buffer, shared by every backend that loads
    from it: read them, never write into them): a backend whose :meth:`Backend.save` left the program's weights out of
    its files, naming them instead (the package stores each weight once), takes them from here. ``recorded``:
    see the field."""

    saved: SavedGraph
    device: str
    threads: int
    options: Mapping[str, Any]
    program: Callable[[], Any]
    weights: Callable[[], Mapping[str, Any]] = dict
    #: the loaded call will be recorded and replayed as one CUDA graph (``core/cudagraph.py``): load a form
    #: that can be (no host sync, no CUDA call a stream capture forbids; AOTInductor loads single-threaded)
    recorded: bool = False


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
    #: whether it takes symbolic graphs (core/ir.py, "Symbolic dimensions"): one compile must then run
    #: every size the graph's symbols take, reading them from the call's arguments. False: torchmux
    #: hands it static graphs only, specializing a symbolic one per size, bounded (autotune/shapes.py)
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
    #: the contract version it was written against (:data:`CONTRACT_VERSION`); a backend that does not
    #: say is taken as written for version 1 and keeps working
    contract_version: int = 1
    #: the graph phases it can compile: "inference" (no autograd), "forward" and "backward" (a
    #: training step's two graphs, :attr:`GraphIR.phase`); a graph of another phase never reaches it
    phases: frozenset[str] = frozenset(PHASES)
    #: how much of a graph it takes: "regions" (connected regions of claimed ops, the unclaimed ops run
    #: eagerly in between), "ops" (each claimed op compiled on its own: a kernel library that does not
    #: fuse), "graph" (whole graphs only: a graph with an unclaimed op is not compiled at all)
    granularity: str = "regions"
    #: the fewest ops that move data (not views, reshapes or getitem) a region must hold to be worth a
    #: call; smaller regions run eagerly ("regions" only)
    min_region_ops: int = 1
    #: the options it accepts, by name (``{"providers": Option(list, None, "...")}``); compile() refuses
    #: any other name and a value of the wrong type, saying which names are allowed. None: not
    #: declared, every name is passed through unchecked (free-form options, or an older plugin)
    options_schema: Mapping[str, Option] | None = None
    #: claimed ops that differ from eager when their inputs hold NaN or ±inf (the conformance suite's
    #: non-finite variants, ``"nonfinite_unsafe"`` in claims.json): a graph holding one is re-checked on
    #: every call whose inputs are not all finite (autotune/verify.py)
    nonfinite_unsafe: frozenset[str] = frozenset()
    #: whether :meth:`compile` builds from ``CompileRequest.program`` when one is given (contract 3): the
    #: whole program then goes to it whatever its claims say (they describe single ATen ops, which a
    #: program exporter does not translate one by one); answers are checked as always
    exports_programs: bool = False

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

    def estimate_seconds(self, request: CompileRequest) -> float | None:
        """Optional, cheap (no compilation): a guess of one call's latency on ``request``, or None (no
        guess, the default). ``auto`` skips a candidate whose estimate is :data:`ESTIMATE_SKIP_FACTOR`
        times the best estimate or worse, without compiling it; an estimate that raises counts as None."""
        return None

    def compile(self, request: CompileRequest) -> CompiledGraph:
        """Compile ``request.ir`` into a callable. Raise any exception to say it cannot: torchmux records
        it as a failed candidate and falls back; it never reaches the user."""
        raise NotImplementedError

    def save(self, compiled: CompiledGraph, request: CompileRequest) -> SavedGraph | None:
        """Optional (contract 3): ``compiled`` (what :meth:`compile` returned for ``request``, a program
        from ``torchmux.export``) in its native deployable form, for a package. None (the default): this
        backend cannot save; a package then rebuilds it from the stored program at load, and says so."""
        return None

    def load(self, request: LoadRequest) -> CompiledGraph:
        """Optional (contract 3): the callable :meth:`compile` would have returned, from what :meth:`save`
        wrote, without the graph: called with the program's flattened user inputs, it returns the flat
        outputs. Raise to say it cannot here (a library missing, another version): the package takes its
        next candidate, and says so."""
        raise NotImplementedError(f"backend {self.name!r} does not load saved graphs")

    def prepare(self, device: str) -> None:
        """Optional: do now what this backend's first compile on ``device`` would otherwise wait for in
        this process (probing the CPU, loading a library). ``torchmux.compile`` calls it once per process
        and device, in a background thread, while Dynamo captures the model: torchmux's own backends', and
        a plugin's only with ``isolate="off"`` (its code has not proved itself in a trial child yet); the
        trial child prepares torchmux's own while it waits for its first trial. It must be safe beside a
        compile of this backend in another thread; anything it raises is logged and ignored. Work that
        holds the GIL (importing, building tables in Python) gains nothing here: only waiting (a
        subprocess, I/O) overlaps."""


_PREPARED: set[tuple[str, str]] = set()
_PREPARING = threading.Lock()


def prepare_in_background(backends: Sequence[Any], device: str) -> None:
    """Run each backend's :meth:`Backend.prepare` for ``device`` in one daemon thread named
    ``torchmux-prepare``, each backend once per process and device."""
    with _PREPARING:
        todo = [b for b in backends if callable(getattr(b, "prepare", None)) and (b.name, device) not in _PREPARED]
        _PREPARED.update((b.name, device) for b in todo)
    if not todo:
        return

    def run() -> None:
        for b in todo:
            try:
                b.prepare(device)
            except Exception as e:  # noqa: BLE001 -- a head start, never a failure: the compile does it again
                _log.debug("torchmux: %s.prepare(%r) failed: %s", b.name, device, e)

    threading.Thread(target=run, name="torchmux-prepare", daemon=True).start()


#: auto does not compile a candidate whose estimate is this many times the best candidate's estimate
ESTIMATE_SKIP_FACTOR = 10.0


def contract_problem(backend: Any) -> str | None:
    """Why ``backend`` (any object a plugin returned) cannot be used by this torchmux, or None."""
    if (
        not isinstance(getattr(backend, "name", None), str)
        or not backend.name
        or not callable(getattr(backend, "compile", None))
    ):
        return f"returned {backend!r}, which is not a Backend (needs a name and compile())"
    version = getattr(backend, "contract_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return (
            f"backend {backend.name!r} has contract_version={version!r}; it must be an int from 1 to {CONTRACT_VERSION}"
        )
    if version > CONTRACT_VERSION:
        return (
            f"backend {backend.name!r} was written for torchmux backend contract {version}, and this torchmux "
            f"implements contract {CONTRACT_VERSION}; upgrade torchmux (pip install -U torchmux) or install "
            "an older release of the plugin"
        )
    phases = getattr(backend, "phases", frozenset(PHASES))
    if not phases or not set(phases) <= set(PHASES):
        return f"backend {backend.name!r} has phases={set(phases)!r}; it must be a non-empty subset of {set(PHASES)}"
    if getattr(backend, "granularity", "regions") not in GRANULARITIES:
        return f"backend {backend.name!r} has granularity={backend.granularity!r}; it must be one of {GRANULARITIES}"
    schema = getattr(backend, "options_schema", None)
    if schema is not None and not all(isinstance(k, str) and isinstance(v, Option) for k, v in dict(schema).items()):
        return f"backend {backend.name!r}: options_schema must map option names to torchmux.extend.Option"
    return None


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
