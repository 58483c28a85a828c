"""``torchmux.load``: a package opened and called with no Dynamo (steps 4 and 5 of ``api/export.py``).

4. **Load** (``torchmux.load``): the chosen artifact is opened by its backend (``Backend.load``); where
   that backend is missing, fails to load, or its native code is not signed by a key this user trusts
   (or was built by another torch or for another machine), the next candidate is taken: a stored
   artifact, else the backend rebuilt from the stored program (a backend that cannot save, such as
   CUDA graphs or the Triton generator), else eager on the program itself. One
   :class:`TorchmuxFallbackWarning` says what and why.
5. **Call** (:class:`LoadedModel`): each input's type, dtype, device, rank and every dimension (a
   static size, or a declared symbol within its range and equal wherever the symbol recurs) is checked,
   then the artifact runs on the flat inputs; a fixed Python value among them (an int the program was
   exported with) must equal the exported one, and is left out of what the artifact takes. No Dynamo
   frame, no guard.

This module imports only what loading needs (the package reader, the one plugin that provides the
stored backend): ``torchmux.load`` never imports TorchDynamo, the tuner or the exporters; rebuilding a
backend from the program (:meth:`LoadedModel._rebuild`) imports them when it happens.
"""

from __future__ import annotations

import collections
import functools
import io
import operator
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..core import package as pkg
from ..core.backend import Backend, CompileRequest, LoadRequest, SavedGraph
from ..core.errors import BadArgumentError, TorchmuxError, TorchmuxFallbackWarning
from ..core.package import PackageError
from ..core.registry import find_backend, get_registry
from ..core.version import __version__

__all__ = ["LoadedModel", "PackageInputError", "Pieces", "inspect_package", "load"]


def _dtype(name: str) -> torch.dtype:
    """The torch dtype a plan names (``"float32"``): looked up by name, not from a table of all of torch's
    (building one walks ``vars(torch)``, ~0.7 ms of a load's start-up)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise PackageError(f"the package's plan names an input dtype {name!r} this torch does not have")
    return dtype


class PackageInputError(TorchmuxError, ValueError):
    """A call of a loaded package with inputs it was not exported for; the message names the input."""


def _spec(text: str) -> pytree.TreeSpec:
    """A stored pytree spec; a container type of a library (a Hugging Face ``ModelOutput``) is known only
    once that library registered it: the error says which module to import (none is imported from a file)."""
    try:
        return pytree.treespec_loads(text)
    except NotImplementedError as e:
        found = [w for w in str(e).split() if w.count(".") >= 2 and w[0].isalpha()]
        module = found[0].rsplit(".", 1)[0] if found else "the library that defines it"
        raise PackageError(
            f"the package's inputs or outputs hold a type this process does not know yet ({e}); import {module} "
            "before torchmux.load (the package names types, it never imports code)"
        ) from e


def _builder(spec: pytree.TreeSpec) -> Callable[[Sequence[Any]], Any]:
    """A function of the flat outputs that rebuilds ``spec``'s structure, as ``tree_unflatten`` does, made
    once at load so that a call pays no generic walk of the spec: a leaf is an index, a tuple, list or
    dict is built in place, any other registered node calls its own ``unflatten_fn``.

    One such node costs more than the rest of a package's call at batch 1: a Hugging Face ``ModelOutput``,
    whose constructor (a dataclass ``__init__`` and ``__post_init__``) takes 17-30 us on this CPU. A node
    that is a dict subclass whose constructor only sets each child as an item and as an attribute of the
    same name is built the same way without it: ``cls.__new__`` and the two setters. Which nodes qualify
    is decided by building one from distinct placeholder tensors both ways and comparing the objects
    (type, items in order, every attribute, identity of each child); any difference keeps the
    constructor."""
    if spec.is_leaf():
        return operator.itemgetter(0)
    getters: list[Callable[[Sequence[Any]], Any]] = []
    start = 0
    kids = spec.children() if hasattr(spec, "children") else spec.children_specs  # torch 2.13 renamed it
    for child in kids:
        end = start + child.num_leaves
        if child.is_leaf():
            getters.append(operator.itemgetter(start))
        else:
            getters.append(_part(start, end, _builder(child)))
        start = end
    flat = all(c.is_leaf() for c in kids)  # every child a leaf: the outputs themselves, in order
    children: Callable[[Sequence[Any]], list[Any]] = list
    if not flat:
        children = lambda out: [g(out) for g in getters]  # noqa: E731
    kind, context = spec.type, spec.context
    if kind is tuple:
        return tuple if flat else lambda out: tuple(children(out))
    if kind is list:
        return children
    if kind is dict:
        return lambda out: dict(zip(context, children(out)))
    unflatten = pytree.SUPPORTED_NODES[kind].unflatten_fn
    fast = _items_and_attributes(kind, context, spec.num_leaves, children, unflatten)
    if fast is not None:
        return fast if flat else lambda out: fast(children(out))
    return lambda out: unflatten(children(out), context)


def _part(start: int, end: int, build: Callable[[Sequence[Any]], Any]) -> Callable[[Sequence[Any]], Any]:
    return lambda out: build(out[start:end])


def _items_and_attributes(
    kind: type, context: Any, leaves: int, children: Callable[..., list[Any]], unflatten: Any
) -> Callable[[Sequence[Any]], Any] | None:
    """For :func:`_builder`: a constructor-free builder of ``kind`` if it builds the same object, else None.
    The constructor may set other attributes only to None (a dataclass's absent fields), the same for
    two sets of placeholders (zeros, ones): an attribute computed from the children keeps it."""
    if not (isinstance(kind, type) and issubclass(kind, dict)) or not isinstance(context, (list, tuple)):
        return None
    if not all(type(k) is str for k in context):
        return None
    setitem = next(c.__setitem__ for c in kind.__mro__ if c in (collections.OrderedDict, dict))
    keys = list(context)
    values = children([torch.zeros(1) for _ in range(leaves)])
    try:
        slow = unflatten(list(values), context)
        other = unflatten(list(children([torch.ones(1) for _ in range(leaves)])), context)
        # what the constructor sets beside the children (a dataclass's other fields): None, set as it did
        extra = [(k, v) for k, v in vars(slow).items() if k not in keys]
        if any(v is not None or vars(other).get(k, 0) is not None for k, v in extra):
            return None
    except Exception:  # noqa: BLE001 -- no instance dict to read back: its constructor stays
        return None

    new, absent = kind.__new__, dict(extra)

    def build(values: Sequence[Any]) -> Any:
        # few calls: after a run that walked the weights each one is a cache miss (~1 us here)
        obj = new(kind)
        attributes = obj.__dict__
        attributes.update(absent)
        for k, v in zip(keys, values):
            setitem(obj, k, v)
        attributes.update(zip(keys, values))
        return obj

    try:
        quick = build(list(values))
        same = (
            type(slow) is type(quick)
            and list(slow.keys()) == list(quick.keys()) == keys
            and all(slow[k] is quick[k] is v for k, v in zip(keys, values))
            and sorted(vars(slow)) == sorted(vars(quick))
            and all(vars(slow)[k] is vars(quick)[k] for k in vars(slow))
        )
    except Exception:  # noqa: BLE001 -- a type the shortcut cannot build: its constructor stays
        return None
    return build if same else None


class _Call:
    """The per-call path of a package, shared by :class:`ExportedModel` and :class:`LoadedModel`: check
    each input against the plan, run the flat inputs, rebuild the output's structure."""

    _fn: Callable[..., Sequence[torch.Tensor]]

    def _setup_call(self, plan: Mapping[str, Any]) -> None:
        self.plan = plan
        self._in_spec, self._out_spec = _spec(plan["in_spec"]), _spec(plan["out_spec"])
        self._n = len(plan["inputs"])
        # the user's fixed Python values among the flat inputs (an int the program was specialized to):
        # checked, then left out; the IR and every backend take the tensors alone
        self._constants = [(int(i), v) for i, v in plan.get("constants") or ()]
        self._fixed = {i for i, _ in self._constants}
        # every input positional, each a tensor: the call's args are the flat inputs themselves
        self._positional = self._in_spec == pytree.tree_structure(((0,) * self._n, {}))
        self._build = _builder(self._out_spec)
        self._symbols = {k: (v[0], v[1]) for k, v in plan["symbols"].items()}
        self._names = dict(plan.get("names") or {})  # the user's Dim names (packages before them: none)
        self._checks = [
            (i, _dtype(s["dtype"]), s["device"], len(s["shape"]), tuple(s["shape"]))
            for i, s in enumerate(plan["inputs"])
        ]
        # the per-call test, as few tensor reads as the checks allow (each is a cache miss after a run
        # that walked the model's weights): the dtype, whether it is on the device, its size (equal to
        # the static one, or each symbolic dimension within its range) and, under grad mode,
        # requires_grad; an input that fails it goes to _explain, which names what is wrong
        on = {"cpu": "is_cpu", "cuda": "is_cuda"}
        # an input of static shape on the CPU or a GPU: one test; the rest dimension by dimension
        self._static: list[tuple[int, torch.dtype, str, torch.Size]] = []
        self._fast: list[tuple[int, torch.dtype, str | None, int, list[Any], list[Any]]] = []
        for i, dtype, device, rank, shape in self._checks:
            if device in on and all(type(d) is int for d in shape):
                self._static.append((i, dtype, on[device], torch.Size(shape)))
                continue
            fixed = [(d, w) for d, w in enumerate(shape) if type(w) is int]
            ranges = [(d, *self._symbols.get(str(w), (0, None))) for d, w in enumerate(shape) if type(w) is not int]
            self._fast.append((i, dtype, on.get(device), rank, fixed, ranges))
        where: dict[str, list[tuple[int, int]]] = {}
        for i, _, _, _, shape in self._checks:
            for d, w in enumerate(shape):
                if type(w) is not int:
                    where.setdefault(str(w), []).append((i, d))
        self._same = [places for places in where.values() if len(places) > 1]  # a symbol that recurs

    def _flat(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sequence[Any]:
        if self._positional and not kwargs:
            if len(args) != self._n:
                raise PackageInputError(
                    f"this package takes {self._n} input{'s' if self._n != 1 else ''} ({self._describe()}), got {len(args)}"
                )
            return args
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != self._in_spec:
            raise PackageInputError(
                f"the call's arguments are structured as {spec}, the package was exported for {self._in_spec}; "
                f"pass {self._describe()}"
            )
        if not self._constants:
            return leaves
        for i, value in self._constants:
            got = leaves[i]
            if type(got) is not type(value) or got != value:
                raise PackageInputError(
                    f"argument {i} must be {value!r}: the program was exported with that value and specialized "
                    f"to it, got {got!r}; export again with the value you pass (or pass it as a tensor)"
                )
        return [a for i, a in enumerate(leaves) if i not in self._fixed]

    def _describe(self) -> str:
        return ", ".join(f"{s['dtype']}{s['shape']} on {s['device']}" for s in self.plan["inputs"])

    def _check(self, flat: Sequence[Any]) -> None:
        grad = torch.is_grad_enabled()
        for i, dtype, is_on, static in self._static:
            a = flat[i]
            if (
                type(a) is not torch.Tensor
                or a.dtype is not dtype
                or not getattr(a, is_on)
                or a.shape != static
                or (grad and a.requires_grad)
            ):
                return self._explain(flat)
        for i, dtype, on, rank, fixed, ranges in self._fast:
            a = flat[i]
            if type(a) is not torch.Tensor or a.dtype is not dtype or on is None or not getattr(a, on):
                return self._explain(flat)
            size = a.shape
            if (
                len(size) != rank
                or any(size[d] != w for d, w in fixed)
                or any(not lo <= size[d] <= (hi or size[d]) for d, lo, hi in ranges)
            ):
                return self._explain(flat)
            if grad and a.requires_grad:
                return self._explain(flat)
        for places in self._same:
            if len({flat[i].shape[d] for i, d in places}) > 1:
                return self._explain(flat)
        return None

    def _explain(self, flat: Sequence[Any]) -> None:
        """The full check, input by input, raising :class:`PackageInputError` with what is wrong."""
        seen: dict[str, int] = {}
        grad = torch.is_grad_enabled()
        for i, dtype, device, rank, shape in self._checks:
            a = flat[i]
            if type(a) is not torch.Tensor and not isinstance(a, torch.Tensor):
                raise PackageInputError(f"input {i} must be a tensor ({dtype}), got {type(a).__name__}")
            if a.dtype != dtype or a.device.type != device or a.dim() != rank:
                raise PackageInputError(
                    f"input {i} must be {str(dtype).removeprefix('torch.')} with {rank} dimensions on {device} "
                    f"(shape {list(shape)}), got {str(a.dtype).removeprefix('torch.')}{list(a.shape)} on {a.device.type}"
                )
            if grad and a.requires_grad:
                raise PackageInputError(
                    f"input {i} requires grad: a package runs inference only; call it under torch.no_grad(), "
                    "or train with torchmux.compile"
                )
            for d, want in enumerate(shape):
                got = a.shape[d]
                if type(want) is int:
                    if got != want:
                        raise PackageInputError(
                            f"input {i} dimension {d} must be {want} (it was exported static), got {got}; "
                            "declare it in dynamic_shapes to vary it"
                        )
                    continue
                if want in self._symbols:
                    lo, hi = self._symbols[want]
                    if got < lo or (hi is not None and got > hi):
                        raise PackageInputError(
                            f"input {i} dimension {d} ({self._names.get(want, want)}) must be in "
                            f"[{lo}, {'inf' if hi is None else hi}] "
                            f"as declared in dynamic_shapes, got {got}"
                        )
                    if seen.setdefault(want, got) != got:
                        raise PackageInputError(
                            f"input {i} dimension {d} is {self._names.get(want, want)}, which another input has as "
                            f"{seen[want]}; got {got}"
                        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat = args if self._positional and not kwargs and len(args) == self._n else self._flat(args, kwargs)
        self._check(flat)
        return self._build(self._fn(*flat))

    def run_flat(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """The flat inputs in, the flat outputs out (checked the same way): no output structure is rebuilt
        (what a server that wants tensors calls; the structure costs ~2 us, see :func:`_builder`)."""
        self._check(inputs)
        return list(self._fn(*inputs))


SPLIT = "split("  # a split placement's name: split(onnxruntime,inductor), its artifact folder artifacts/split/
GRAPHED = "+cudagraphs"  # inductor+cudagraphs: inductor's artifact, its loaded call replayed as one CUDA graph


def base_of(name: str) -> str:
    """The backend a candidate's name runs: ``inductor`` for ``inductor+cudagraphs``."""
    return name.removesuffix(GRAPHED)


class Pieces:
    """A split package's call (``options={"split": N}``): each piece's artifact, in order, on the values
    its ``wiring`` names: ``[0, k]`` the program's flat input k, ``[i + 1, k]`` output k of piece i;
    ``outputs`` names the program's flat outputs the same way."""

    def __init__(
        self,
        fns: Sequence[Callable[..., Sequence[Any]]],
        wiring: Sequence[Sequence[Sequence[int]]],
        outputs: Sequence[Sequence[int]],
    ) -> None:
        self.fns = list(fns)
        self._steps = [(fn, [(int(s), int(k)) for s, k in refs]) for fn, refs in zip(fns, wiring)]
        self._outputs = [(int(s), int(k)) for s, k in outputs]

    def __call__(self, *inputs: Any) -> list[Any]:
        values: list[Sequence[Any]] = [inputs]
        for fn, refs in self._steps:
            values.append(fn(*[values[s][k] for s, k in refs]))
        return [values[s][k] for s, k in self._outputs]


def load(path: str | Path, *, backend: str | None = None, options: Mapping[str, Any] | None = None) -> LoadedModel:
    """Open a package written by ``torchmux.export(...).save(path)`` and return a callable
    :class:`LoadedModel`. ``backend`` names a candidate to run instead of the stored choice (it is
    rebuilt from the program when the package holds no artifact of it)."""
    reader = pkg.PackageReader(path)
    return LoadedModel(reader, backend=backend, options=dict(options or {}))


class LoadedModel(_Call):
    """A loaded package: call it as the exported model; ``.backend`` says what runs, ``.notes`` why."""

    def __init__(self, reader: pkg.PackageReader, *, backend: str | None, options: dict[str, Any]) -> None:
        self.reader = reader
        self.manifest = reader.manifest
        plan = reader.json(pkg.PLAN)
        self._setup_call(plan)
        self._options = options
        self._program: torch.export.ExportedProgram | None = None
        self._arrays: Mapping[str, Any] | None = None
        self.notes: list[str] = []
        order = [c["backend"] for c in plan["candidates"] if c["ok"]]
        if backend is not None:
            order = [backend] + [b for b in order if b != backend]
        if "eager" not in order:
            order.append("eager")
        self._order = order
        self.backend, self._fn = self._open(order)
        theirs, ours = self.manifest.get("machine") or {}, pkg.machine_kind(self.plan["device"])
        moved = [k for k in ("processor", "device_name") if theirs.get(k) != ours.get(k)]
        if moved and not self.notes:
            self.notes.append(
                "it was tuned on another machine ("
                + ", ".join(f"{theirs.get(k)} there, {ours.get(k)} here" for k in moved)
                + "): the stored choice may not be the fastest here; export it again on this machine to measure"
            )
        if self.notes:
            runs = f"runs {self.backend!r}" + ("" if self.backend == order[0] else f", not {order[0]!r}")
            warnings.warn(
                f"torchmux.load({reader.path}) {runs}: " + "; ".join(self.notes),
                TorchmuxFallbackWarning,
                stacklevel=3,
            )

    # the stored program, read once when something needs it (eager, a rebuild, a weight swap)
    def program(self) -> torch.export.ExportedProgram:
        if self._program is None:
            self._program = torch.export.load(io.BytesIO(self.reader.read(pkg.PROGRAM)))
        return self._program

    def weights(self) -> Mapping[str, Any]:
        """The program's weights and constant tensors by name as NumPy arrays (``LoadRequest.weights``):
        read from the package's bytes where ``pkg.program_weights`` can, else from the program (once:
        a split's pieces share them)."""
        if self._arrays is None:
            found = pkg.program_weights(self.reader.view(pkg.PROGRAM)) if self._program is None else None
            self._arrays = found if found is not None else pkg.numpy_weights(self.program())
        return self._arrays

    def _candidate(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.plan["candidates"] if c["backend"] == name), None)

    def _open(self, order: Sequence[str]) -> tuple[str, Callable[..., Any]]:
        for name in order:
            entry = self._candidate(name) or {}
            if name.startswith(SPLIT):
                if not entry.get("artifact"):
                    continue
                try:
                    return name, self._open_split(entry)
                except Exception as e:
                    self.notes.append(f"{name} failed to load: {type(e).__name__}: {str(e)[:200]}")
                    continue
            base = base_of(name)
            b = find_backend(base, entry.get("plugin"), entry.get("package"))  # that plugin, not every one
            if b is None:
                self.notes.append(f"{base} is not installed here")
                continue
            avail = b.availability()
            if not avail.ok or not b.supports_device(self.plan["device"]):
                self.notes.append(f"{base} cannot run here ({avail.reason or 'not on ' + self.plan['device']})")
                continue
            folder = entry.get("artifact")
            try:
                if folder:
                    why = self._untrusted(folder, entry)
                    if why is None:
                        return self._graphed(name, b.load(self._request(b, folder, recorded=name != base)))
                    self.notes.append(f"{base}'s stored artifact not used ({why}): rebuilt from the program")
                elif name != "eager" and name == self.plan["chosen"]:
                    why = entry.get("unsaved") or "its backend saves no compiled form"
                    self.notes.append(f"{base} has no compiled form in the package ({why}): rebuilt from the program")
                elif name != "eager":
                    continue  # a candidate with nothing stored: the next stored one, then eager, comes first
                if name == "eager":
                    return name, pkg.program_runner(self.program())
                return self._graphed(name, self._rebuild(b, recorded=name != base))
            except Exception as e:
                self.notes.append(f"{base} failed to load: {type(e).__name__}: {str(e)[:200]}")
        raise TorchmuxError(f"no backend can run the package {self.reader.path}: " + "; ".join(self.notes))

    def _graphed(self, name: str, fn: Callable[..., Any]) -> tuple[str, Callable[..., Any]]:
        """``fn`` (``name``'s backend loaded) as ``name`` runs it: for ``<backend>+cudagraphs``, recorded as one
        CUDA graph on inputs made from the plan's specs, its replay checked against the call it recorded on
        other inputs (work the recording missed would replay the recorded outputs). Raises where it cannot
        be recorded here: the package takes its next candidate, with a note."""
        if name == base_of(name):
            return name, fn
        from ..core.compare import mismatch
        from ..core.cudagraph import record

        args = self.example_inputs(seed=1)
        with torch.no_grad():  # inference, as at export
            graphed = record(fn, self.example_inputs())
            wrong = mismatch(list(graphed(*args)), list(fn(*[a.clone() for a in args])))
        if wrong:
            raise RuntimeError(f"its call replayed as a CUDA graph answers unlike the call: {wrong}")
        return name, graphed

    def _open_split(self, entry: Mapping[str, Any]) -> Pieces:
        """A split placement: each piece's artifact opened by its backend, with the piece's own program
        (``piece<i>/program.pt2``: its weights, its eager form, what it is rebuilt from). A piece whose
        backend saved nothing, or whose native code is not trusted here, is rebuilt from that program
        (one note says so); a piece whose backend is missing fails the split: the next candidate runs."""
        folder = entry["artifact"]
        meta = self.reader.json(folder + "meta.json")
        fns = []
        for i, p in enumerate(meta["pieces"]):
            b = find_backend(p["backend"], p.get("plugin"), p.get("package"))
            if b is None or not b.availability().ok:
                raise RuntimeError(f"piece {i}'s backend {p['backend']} cannot run here")
            base = f"{folder}piece{i}/"
            why = self._untrusted(base, p, [base + f for f in p["files"]])
            data = self.reader.read(base + "program.pt2")
            shared = dict(p.get("weights") or {})  # its weights that are the whole program's (stored there)
            program = functools.cache(partial(self._piece_program, data, shared))  # only if something needs it
            if p["backend"] == "eager":
                fns.append(pkg.program_runner(program()))
            elif p.get("saved") and why is None:
                files = {f: self.reader.read(base + f) for f in p["files"]}
                weights = partial(self._piece_weights, data, program, shared)
                opts = {**(p.get("options") or {}), **self._options.get(b.name, {})}
                saved = SavedGraph(files, p.get("meta") or {}, native=bool(p["native"]))
                fns.append(
                    b.load(LoadRequest(saved, self.plan["device"], torch.get_num_threads(), opts, program, weights))
                )
            else:
                self.notes.append(
                    f"piece {i} on {b.name} rebuilt from its program ({why or 'its backend saves no compiled form'})"
                )
                fns.append(self._rebuild(b, program(), _program_inputs(program())))
        return Pieces(fns, [p["inputs"] for p in meta["pieces"]], meta["outputs"])

    def _piece_program(self, data: bytes, shared: Mapping[str, str]) -> torch.export.ExportedProgram:
        """A split piece's stored program with the weights it shares with the whole program put back
        (``api/export._saved_without`` saved them empty)."""
        program = _load_program(data)
        whole = self.weights() if shared else {}
        for name, theirs in shared.items():
            table = program.state_dict if name in program.state_dict else program.constants
            t = torch.from_numpy(whole[theirs])
            table[name] = (
                torch.nn.Parameter(t, requires_grad=False) if isinstance(table[name], torch.nn.Parameter) else t
            )
        return program

    def _piece_weights(self, data: bytes, program: Callable[[], Any], shared: Mapping[str, str]) -> Mapping[str, Any]:
        """A split piece's weights as NumPy arrays (``LoadRequest.weights``): its own from its program's
        bytes, the ones it shares from the whole program's."""
        own = _program_arrays(data, program)
        whole = self.weights() if shared else {}
        return {**own, **{name: whole[theirs] for name, theirs in shared.items()}}

    def _untrusted(self, folder: str, entry: Mapping[str, Any], members: Sequence[str] | None = None) -> str | None:
        """Why a stored artifact (or these ``members`` of it) must not be loaded here (None: it may)."""
        if not entry.get("native"):
            return None
        for member in members if members is not None else self.reader.names(folder):
            if member.endswith("meta.json"):
                continue
            ok, why = self.reader.trusted(member)
            if not ok:
                return why
        built, here = self.manifest.get("torch"), torch.__version__
        if built != here:
            return f"native code built for torch {built}, this is {here}"
        return pkg.foreign_native_code(self.manifest.get("machine", {}), pkg.machine_kind(self.plan["device"]))

    def _request(self, b: Backend, folder: str, recorded: bool = False) -> LoadRequest:
        files = {m[len(folder) :]: self.reader.read(m) for m in self.reader.names(folder) if m != folder + "meta.json"}
        meta = self.reader.json(folder + "meta.json") if folder + "meta.json" in self.reader.names(folder) else {}
        entry = self._candidate(b.name) or {}
        saved = SavedGraph(files, meta, native=bool(entry.get("native")))
        opts = {**(entry.get("options") or {}), **self._options.get(b.name, {})}
        return LoadRequest(
            saved, self.plan["device"], torch.get_num_threads(), opts, self.program, self.weights, recorded
        )

    def _rebuild(
        self,
        b: Backend,
        program: torch.export.ExportedProgram | None = None,
        args: list[torch.Tensor] | None = None,
        recorded: bool = False,
    ) -> Callable[..., Any]:
        """Compile ``b`` again from the stored program (normalized and frozen as at export) and placed as
        at export (``build_placement``: the ops ``b`` does not claim stay on eager between its regions),
        checked against the reference interpreter on inputs made from the plan's specs. ``recorded``: to be
        replayed as a CUDA graph, so a whole placement whose backend saves is saved and loaded back as
        ``LoadRequest.recorded`` asks (AOTInductor single-threaded), as ``torchmux.export`` does."""
        from ..autotune.freeze import freeze
        from ..autotune.placement import build_placement
        from ..autotune.verify import compare
        from ..frontends.export import normalize

        program = program if program is not None else self.program()
        ir, weights = normalize(program)
        it = iter(weights)
        frozen = freeze(ir, [next(it) if k != "input" else None for k in ir.input_kinds])
        args = args if args is not None else self.example_inputs()
        entry = self._candidate(b.name) or {}
        options = dict(entry.get("options") or {})
        placement = build_placement(frozen, b, args, mode=None, options=options, program=program)
        fn = placement.fn
        if recorded:
            request = CompileRequest(frozen, args, None, options, program=program)
            _, fn = pkg.saved_and_loaded(b, placement, request, self.plan["device"], recorded=True)
        # as the tuner judges it: a graph that draws random numbers by shapes, dtypes and finiteness
        wrong = compare(frozen, list(fn(*[a.clone() for a in args])), frozen.run_reference(*[a.clone() for a in args]))
        if wrong:
            raise RuntimeError(f"rebuilt {b.name} answers wrong: {wrong}")
        return fn

    def example_inputs(self, seed: int = 0) -> list[torch.Tensor]:
        """Inputs of the plan's specs (each symbol at its smallest size above 1 in range): random floats,
        integers in [0, 2)."""
        g = torch.Generator().manual_seed(seed)
        sizes = {s: max(lo, min(2, hi if hi is not None else 2)) for s, (lo, hi) in self._symbols.items()}
        out = []
        for s in self.plan["inputs"]:
            shape = [d if isinstance(d, int) else sizes.get(d, 2) for d in s["shape"]]
            dtype = _dtype(s["dtype"])
            t = (
                torch.randn(shape, generator=g, dtype=dtype)
                if dtype.is_floating_point
                else torch.randint(0, 2, shape, generator=g).to(dtype)
            )
            out.append(t.to(s["device"]))
        return out

    # ------------------------------------------------------------------------------ weights
    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.program().state_dict)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Serve new weights without exporting again: the keys, shapes and dtypes must be the program's
        (an error names the first that is not, and the old weights keep serving); the backend that
        runs is rebuilt with them and checked against eager on the new weights, else eager runs them."""
        program = self.program()
        current = program.state_dict
        # buffers a branch tests, fixed at export (frontends/export.py _export_fixed): not the program's
        # state, but the model's state dict has them; they may only come back with the same values
        fixed = self.plan["capture"].get("fixed") or {}
        for k in sorted(set(fixed) & set(state_dict)):
            v = state_dict[k]
            if not isinstance(v, torch.Tensor) or pkg.tensor_digest(v) != fixed[k]:
                raise BadArgumentError(
                    f"load_state_dict: {k} is a buffer the program branches on, fixed at export; these weights "
                    "give it another value: export again with them (the package keeps serving its current weights)"
                )
        state_dict = {k: v for k, v in state_dict.items() if k not in fixed}
        missing = sorted(set(current) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(current))
        if unexpected or (strict and missing):
            raise BadArgumentError(
                f"load_state_dict: keys do not match the exported program (missing: {missing[:5] or 'none'}, "
                f"unexpected: {unexpected[:5] or 'none'}); the package keeps serving its current weights"
            )
        for k, v in state_dict.items():
            old = current[k]
            if not isinstance(v, torch.Tensor) or v.shape != old.shape or v.dtype != old.dtype:
                got = f"{v.dtype}{list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
                raise BadArgumentError(
                    f"load_state_dict: {k} must be {old.dtype}{list(old.shape)}, got {got}; the package keeps "
                    "serving its current weights"
                )
        fresh = torch.export.load(io.BytesIO(self.reader.read(pkg.PROGRAM)))
        for k, v in state_dict.items():
            target = fresh.state_dict[k]
            fresh.state_dict[k] = (
                torch.nn.Parameter(v.detach().clone(), requires_grad=False)
                if isinstance(target, torch.nn.Parameter)
                else v.detach().clone()
            )
        registry = get_registry()
        if self.backend == "eager":
            fn: Callable[..., Any] = pkg.program_runner(fresh)
        elif self.backend.startswith(SPLIT):
            warnings.warn(
                f"torchmux: a split placement ({self.backend}) is not rebuilt with new weights (each piece holds "
                "its own); eager runs them. Export again with the new weights to place them",
                TorchmuxFallbackWarning,
                stacklevel=2,
            )
            self.backend, fn = "eager", pkg.program_runner(fresh)
        else:
            try:
                base = base_of(self.backend)
                fn = self._rebuild(registry.get(base), fresh, recorded=self.backend != base)
                self.backend, fn = self._graphed(self.backend, fn)
            except Exception as e:
                warnings.warn(
                    f"torchmux: {self.backend} could not be rebuilt with the new weights ({type(e).__name__}: "
                    f"{str(e)[:200]}); eager runs them",
                    TorchmuxFallbackWarning,
                    stacklevel=2,
                )
                self.backend, fn = "eager", pkg.program_runner(fresh)
        self._program, self._fn, self._arrays = fresh, fn, None


def _load_program(data: bytes) -> torch.export.ExportedProgram:
    return torch.export.load(io.BytesIO(data))


def _program_arrays(data: bytes, program: Callable[[], Any]) -> Mapping[str, Any]:
    """A stored program's weights as NumPy arrays: from its archive's bytes where they can be, else from it."""
    found = pkg.program_weights(data)
    return found if found is not None else pkg.numpy_weights(program())


def _program_inputs(program: torch.export.ExportedProgram) -> list[torch.Tensor]:
    """Inputs of a (static) program's user input specs, to check a rebuild on: random floats, zeros
    for integers (valid indices wherever they go)."""
    user = set(program.graph_signature.user_inputs)
    out = []
    for node in program.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and node.name in user and isinstance(val, torch.Tensor):
            shape = [int(d) for d in val.shape]
            make = torch.randn if val.dtype.is_floating_point else torch.zeros
            out.append(make(shape, dtype=val.dtype, device=val.device))
    return out


def _machine_code_needs(machine: Mapping[str, Any]) -> str:
    """The part of the machine record native code depends on (``pkg.foreign_native_code``), for inspect."""
    isa = machine.get("isa") or []
    wide = [e for e in isa if e.startswith(("avx512", "amx", "sve"))]
    cpu = f"; CPU extensions {len(isa)}" + (
        f" ({', '.join(wide[:4])}{', ...' if len(wide) > 4 else ''})" if wide else ""
    )
    gpu = f"; {machine['device_name']}, compute capability {machine['capability']}" if machine.get("capability") else ""
    return (cpu if isa else "") + gpu


def inspect_package(path: str | Path) -> str:
    """What ``torchmux package inspect`` prints: members and sizes, the plan, versions, the machine."""
    reader = pkg.PackageReader(path)
    m, plan = reader.manifest, reader.json(pkg.PLAN)
    lines = [
        f"{reader.path}: torchmux package (format {m['format_version']}), {reader.path.stat().st_size / 1e6:.2f} MB",
        f"  built with torchmux {m.get('torchmux')} (this is {__version__}), torch {m.get('torch')}, "
        f"python {m.get('python')}, {m.get('created', '')}",
        f"  tuned on: {m.get('machine', {}).get('processor', '?')} ({m.get('machine', {}).get('arch', '?')}, "
        f"{m.get('machine', {}).get('os', '?')}), device {plan['device']}, {plan['threads']} thread(s)"
        + _machine_code_needs(m.get("machine", {})),
        f"  graph: {plan['graph']['name']}, {plan['graph']['ops']} ops, fingerprint {plan['graph']['fingerprint'][:16]}; "
        f"capture: {'strict' if plan['capture']['strict'] else 'non-strict'} torch.export"
        + (", after the mend pass" if plan["capture"]["mended"] else ""),
    ]
    for name, d in (plan["capture"].get("fixed") or {}).items():
        lines.append(f"  fixed buffer (a branch tests it): {name} {d['dtype']}{d['shape']}, sha256 {d['sha256'][:16]}")
    lines.append("  inputs:")
    for i, s in enumerate(plan["inputs"]):
        lines.append(f"    {i}: {s['dtype']}{s['shape']} on {s['device']}")
    names = plan.get("names") or {}
    for sym, (lo, hi) in plan["symbols"].items():
        named = f" ({names[sym]})" if sym in names else ""
        lines.append(f"    {sym}{named} in [{lo}, {'inf' if hi is None else hi}]")
    lines.append(f"  chosen: {plan['chosen']}")
    lines.append("  candidates (best first):")
    for c in plan["candidates"]:
        what = f"{c['ms']:.3f} ms" if c["ms"] is not None else ("correct, not timed" if c["ok"] else "failed")
        art = f", artifact {c['artifact']}" if c["artifact"] else ""
        reason = f" ({c['reason']})" if c["reason"] else ""
        lines.append(
            f"    {c['backend']} {c['version']}: {what}, compiled in {c['compile_s']:.1f} s{art}"
            + (" [native, signed]" if c["native"] else "")
            + reason
        )
        if c["backend"].startswith(SPLIT) and c["artifact"]:
            split = reader.json(c["artifact"] + "meta.json")
            for i, p in enumerate(split["pieces"]):
                how = "its native form" if p.get("saved") else "rebuilt at load from its program"
                lines.append(f"      piece {i}: {p['ops']} ops on {p['backend']} {p['version']}, {how}")
    lines.append("  members:")
    for name, entry in sorted(m["members"].items()):
        signed = " signed (" + m.get("key", "?") + " key)" if name in (m.get("signatures") or {}) else ""
        lines.append(f"    {name}: {entry['size'] / 1e6:.2f} MB, sha256 {entry['sha256'][:16]}{signed}")
    return "\n".join(lines)
