"""The package format: one file that holds an exported program, each backend's artifact and the plan.

A package (``torchmux.export(...).save("model.tmux")``) is a zip archive, in the spirit of torch's PT2
archive, with no pickle anywhere:

- ``manifest.json``: ``format`` (:data:`FORMAT`), ``format_version``, the versions of torch, torchmux
  and Python, the machine it was tuned on (``machine``: OS, processor, device name), and ``members``:
  for every other member its size and SHA-256. ``signatures`` holds, for each member that is native
  code, an HMAC-SHA256 of its name and digest under the signing key (:func:`signing_key`), and ``key``
  says which key that was (``"fleet"`` or ``"user"``).
- ``program.pt2``: the ``ExportedProgram`` as ``torch.export.save`` writes it (``torch.export.load``
  reads it back: eager always works, and every backend can be rebuilt from it).
- ``plan.json``: what the API layer decided (``api/export.py`` documents its fields).
- ``artifacts/<backend>/...``: each saved backend artifact's files, as its ``Backend.save`` returned them.
- ``artifacts/split/``, a split placement's: ``meta.json`` (the pieces in order: backend, its plugin and
  version, the values each reads, its artifact's files and meta; the program's outputs) and per piece
  ``piece<i>/program.pt2`` (the piece's own ``ExportedProgram``, each weight it shares with
  ``program.pt2`` saved empty: the piece's ``weights`` in ``meta.json`` maps its names to the program's,
  so the package holds each weight once) beside its artifact's files.

**Reading is checking.** :class:`PackageReader` opens a file only if it is a zip with a manifest of
this format, and checks every member's size and SHA-256 against the manifest before anything is read
from it: a flipped byte or a truncated file is a :class:`PackageError` that names the member, never a
wrong answer. Native code is one step stricter: :meth:`PackageReader.trusted` is true only when the
member's signature verifies under the key this user trusts (the fleet key where
``TORCHMUX_FLEET_KEY_FILE`` names one, the user's own key otherwise, ``core/artifacts.py``); the API
layer rebuilds an untrusted library from the program instead of loading it, with a warning. The
manifest itself is not signed: changing it can only make a member fail its digest or its signature.

**Weights in place.** Every member's data starts at a multiple of :data:`ALIGN` (64) bytes in the file
(the local header's extra field pads it, as Android's ``zipalign`` does, ID ``0xD935``), and
``torch.export.save`` aligns its own records to 64 bytes inside ``program.pt2``. The reader reads the
file once into a buffer that is itself 64-byte aligned, hashes the members there, and
:func:`program_weights` hands out the weights as writable NumPy views of that buffer: no second copy of
a model's weights between the file and the backend (on tiny BERT that copy and its fresh pages were a
tenth of a package's start-up). The views are of memory the reader owns, checked once, never of a
mapping of the file, which another process could change after the check. A package written before the
padding loads as well (its unaligned weights are copied).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import math
import os
import platform
import struct
import sys
import zipfile
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import IO, Any, cast

import torch

from . import settings
from .backend import Backend, CompileRequest, LoadRequest, SavedGraph
from .errors import TorchmuxError
from .machine import cpu_model, isa_extensions

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "PackageError",
    "PackageReader",
    "machine_kind",
    "foreign_native_code",
    "constant_inputs",
    "program_runner",
    "writes_in_place",
    "numpy_weights",
    "loaded_back",
    "saved_and_loaded",
    "program_weights",
    "signing_key",
    "write_package",
]

FORMAT = "torchmux-package"
#: 1: manifest.json, program.pt2, plan.json, artifacts/<backend>/...
FORMAT_VERSION = 1
MANIFEST, PROGRAM, PLAN = "manifest.json", "program.pt2", "plan.json"
#: where each member's data starts in the file: a multiple of this (the weights inside are aligned for SIMD loads)
ALIGN = 64
_ALIGN_EXTRA = 0xD935  # the extra field's ID that pads a member's header (zipalign's)


class PackageError(TorchmuxError, ValueError):
    """A file that is not a torchmux package, or one that was damaged or altered; the message says which."""


def program_runner(program: Any) -> Any:
    """An ``ExportedProgram`` as a package runs it eagerly: called with the program's flat tensor inputs
    (with its fixed Python values, :func:`constant_inputs`, put back between them and unflattened by its
    input spec), returning the flat outputs (eager's artifact, and every fallback). Where the program
    writes one of its inputs in place (:func:`writes_in_place`: ``x /= norm``, which torch.export's graph
    keeps), the inputs are copied first: a package never writes the caller's tensors, on any backend
    (``frontends/export.py``)."""
    import torch.utils._pytree as pytree

    module = program.module()
    in_spec = program.call_spec.in_spec
    fixed = constant_inputs(program)
    writes = writes_in_place(program)

    def run(*args: torch.Tensor) -> list[torch.Tensor]:
        leaves = [a.clone() for a in args] if writes else list(args)
        for i, value in fixed:
            leaves.insert(i, value)
        a, kw = pytree.tree_unflatten(leaves, in_spec)
        return pytree.tree_leaves(module(*a, **kw))

    return run


def writes_in_place(program: Any) -> bool:
    """Whether ``program`` (an ``ExportedProgram`` as ``torch.export.export`` gives it, in-place ops kept)
    writes one of the user's inputs in place (``x /= norm``, or through a view of ``x``), so that running
    it as it is writes the caller's tensor: a runner of it copies its inputs first (:func:`program_runner`,
    AOTInductor's package). An in-place op on a value the program made (``nn.ReLU(inplace=True)`` after a
    convolution) writes nothing of the caller's."""
    from torch.export.graph_signature import InputKind

    from .ir import viewed

    user = {s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    for n in program.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None or not schema.is_mutable:
            continue
        values = list(n.args) + [n.kwargs.get(a.name) for a in schema.arguments[len(n.args) :]]
        for arg, value in zip(schema.arguments, values):
            written = arg.alias_info is not None and arg.alias_info.is_write
            root = viewed(value) if written else None
            if isinstance(root, torch.fx.Node) and root.op == "placeholder" and root.name in user:
                return True
    return False


def constant_inputs(program: Any) -> list[tuple[int, Any]]:
    """Each of the program's flat user inputs that is a fixed Python value (an int, a float, a string),
    not a tensor: its position among them and the value ``torch.export`` specialized the program to. The
    IR and every backend take the tensors alone; a package's call checks the values (``api/load.py``)."""
    from torch.export.graph_signature import ConstantArgument, InputKind

    user = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return [(i, s.arg.value) for i, s in enumerate(user) if isinstance(s.arg, ConstantArgument)]


#: torch.export's serialized dtype numbers (``torch._export.serde.schema.ScalarType``) -> NumPy dtype
#: names, for the dtypes NumPy holds; a test checks them against torch's own table
PT2_DTYPES = {
    1: "uint8",
    2: "int8",
    3: "int16",
    4: "int32",
    5: "int64",
    6: "float16",
    7: "float32",
    8: "float64",
    12: "bool",
}


def stored_members(z: zipfile.ZipFile, data: bytes | memoryview) -> dict[str, memoryview] | None:
    """Each member of the archive ``z`` opened on ``data`` as a view of ``data`` itself (no copy, and no
    CRC-32 pass: what reads them checks a SHA-256 over them, or is covered by one), when every member is
    stored uncompressed (as :func:`write_package` and ``torch.export.save`` write them); else None.
    Reading a 2.4 MB package's members through ``ZipFile.read`` (a CRC pass and a copy each, ~50 us of
    Python per member) took about as long as hashing them."""
    view = memoryview(data)
    out = {}
    for info in z.infolist():
        start = info.header_offset
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1 or start + 30 > len(view):
            return None
        if bytes(view[start : start + 4]) != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"member {info.filename}: no local header where the directory says")
        name_len, extra_len = struct.unpack_from("<HH", view, start + 26)
        begin = start + 30 + name_len + extra_len
        if begin + info.file_size > len(view):
            raise zipfile.BadZipFile(f"member {info.filename} runs past the end of the archive")
        out[info.filename] = view[begin : begin + info.file_size]
    return out


def open_archive(data: bytes | bytearray | memoryview) -> zipfile.ZipFile:
    """A zip archive read from ``data`` in place (:class:`ViewFile`). Names in torchmux's and torch's
    archives are ASCII, written without zip's UTF-8 flag: read as UTF-8, not with zip's default cp437
    (whose codec is one more module to import at load)."""
    file = cast(IO[bytes], ViewFile(data))
    if sys.version_info >= (3, 11):
        return zipfile.ZipFile(file, metadata_encoding="utf-8")
    return zipfile.ZipFile(file)


class ViewFile(io.RawIOBase):
    """A read-only, seekable file over a buffer, without a copy (``io.BytesIO`` copies anything but a
    ``bytes``): what ``zipfile`` reads an archive's directory through."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        super().__init__()
        self._view, self._pos = memoryview(data).cast("B"), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = (0, self._pos, len(self._view))[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), len(self._view) - self._pos))
        buffer[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n


def program_weights(data: bytes | memoryview) -> dict[str, Any] | None:
    """The weights and constant tensors of a ``torch.export.save`` archive (``program.pt2``) by name, as
    NumPy arrays (CPU), without deserializing the program (milliseconds, where ``torch.export.load`` takes
    a tenth of a second and more): what a backend that stored its weights by reference gets at load
    (``LoadRequest.weights``). Each array is a view of ``data`` where ``data`` is writable and the tensor
    aligned in it (a reader's buffer: module docstring), else its own copy; writable either way.
    None when the archive holds a tensor this reader does not take apart (pickled, strided, a dtype NumPy
    lacks): the caller reads the program then."""
    import numpy as np

    out: dict[str, Any] = {}
    with open_archive(data) as z:
        names = z.namelist()
        views = stored_members(z, data)
        read = z.read if views is None else views.__getitem__
        for kind in ("weights", "constants"):
            config_name = next((n for n in names if n.endswith(f"/data/{kind}/model_{kind}_config.json")), None)
            if config_name is None:
                continue
            folder = config_name.rsplit("/", 1)[0] + "/"
            for fqn, entry in json.loads(bytes(read(config_name)))["config"].items():
                meta = entry.get("tensor_meta")
                if entry.get("use_pickle") or not isinstance(meta, dict):
                    return None
                dtype = PT2_DTYPES.get(int(meta.get("dtype", -1)))
                sizes = [d.get("as_int") for d in meta.get("sizes", [])]
                strides = [d.get("as_int") for d in meta.get("strides", [])]
                if dtype is None or None in sizes or (meta.get("storage_offset") or {}).get("as_int") != 0:
                    return None
                contiguous = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
                if any(n > 1 and s != c for n, s, c in zip(sizes, strides, contiguous)):
                    return None
                array = np.frombuffer(read(folder + entry["path_name"]), dtype=dtype, count=math.prod(sizes))
                if not (array.flags.writeable and array.flags.aligned):
                    array = array.copy()  # writable and aligned: torch.from_numpy and every backend take it as is
                out[fqn] = array.reshape(sizes)
    return out


def numpy_weights(program: Any) -> dict[str, Any]:
    """An ``ExportedProgram``'s weights and constant tensors by name as NumPy arrays on the CPU (views where
    they are on the CPU already), those NumPy can hold (not bfloat16): :func:`program_weights` for a
    program in memory."""
    tensors = {**program.state_dict, **program.constants}
    return {
        k: v.detach().cpu().numpy()
        for k, v in tensors.items()
        if isinstance(v, torch.Tensor) and str(v.dtype).removeprefix("torch.") in PT2_DTYPES.values()
    }


def saved_and_loaded(
    b: Backend, placement: Any, request: CompileRequest, device: str, recorded: bool = False
) -> tuple[SavedGraph | None, Callable[..., Any]]:
    """A compiled placement as a package ships it: saved by its backend and loaded back as ``torchmux.load``
    will (:func:`loaded_back`); ``(None, the compiled callable)`` where the backend saves nothing, or the
    placement is not the backend's compiled graph itself (several regions, or ops left to eager beside its
    one region). ``torchmux.export`` ships candidates so, and a rebuild at load to be recorded as a CUDA
    graph loads so (``recorded``)."""
    whole = placement.regions == 1 and not placement.ops_eager
    artifact = b.save(placement.fn, request) if whole else None
    if artifact is None:
        return None, placement.fn
    return artifact, loaded_back(b, artifact, request.program, device, request.options, recorded)


def loaded_back(
    b: Backend, artifact: SavedGraph, program: Any, device: str, options: Mapping[str, Any], recorded: bool = False
) -> Callable[..., Any]:
    """``artifact`` loaded by ``b`` in the process that holds its ``program`` (the program's weights as
    NumPy arrays, read when the backend asks)."""
    weights = partial(numpy_weights, program)
    request = LoadRequest(artifact, device, torch.get_num_threads(), options, lambda: program, weights, recorded)
    return b.load(request)


def signing_key() -> tuple[str, bytes]:
    """The key native members are signed and checked with: ``("fleet", key)`` where
    ``TORCHMUX_FLEET_KEY_FILE`` names the fleet's shared secret (a package built on one machine of the
    fleet loads its libraries on another), else ``("user", key)``, this user's own (``TORCHMUX_KEY_FILE``)."""
    fleet = settings.FLEET_KEY_FILE.get()
    if fleet is not None:
        try:
            return "fleet", Path(fleet).read_bytes()
        except OSError as e:
            raise PackageError(f"cannot read the fleet key TORCHMUX_FLEET_KEY_FILE={fleet}: {e}") from e
    from .artifacts import _key

    return "user", _key()


def tensor_digest(t: torch.Tensor) -> dict[str, Any]:
    """A tensor's dtype, shape and the SHA-256 of its values: what a package records of a value it holds
    fixed, to tell whether another tensor is the same value without storing it twice."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else flat.to(torch.uint8)
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "sha256": hashlib.sha256(raw.numpy().tobytes()).hexdigest(),
    }


def _signature(key: bytes, name: str, digest: str) -> str:
    return hmac.new(key, f"{name}\0{digest}".encode(), hashlib.sha256).hexdigest()


def machine_kind(device: str) -> dict[str, Any]:
    """What a package records of the machine it was tuned on (and what a loader compares): the OS, the
    architecture, the CPU model and its instruction-set extensions (native code may use each), and on
    CUDA the GPU and its compute capability (the architecture its kernels were built for)."""
    kind: dict[str, Any] = {"os": platform.system(), "arch": platform.machine(), "processor": cpu_model()}
    kind["device"] = device
    isa = isa_extensions()
    if isa is not None:
        kind["isa"] = sorted(isa)
    if device == "cuda" and torch.cuda.is_available():
        kind["device_name"] = torch.cuda.get_device_name()
        kind["capability"] = "{}.{}".format(*torch.cuda.get_device_capability())
    return kind


def foreign_native_code(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> str | None:
    """Why native code built on the machine ``theirs`` (a package's :func:`machine_kind`) must not run on
    ``ours``, or None: another OS or architecture, a CPU extension it may use that this CPU lacks (SIGILL
    at the first call), kernels for another GPU architecture. A package written before a field was
    recorded is judged on the fields it has."""
    if theirs.get("arch") != ours["arch"] or theirs.get("os") != ours["os"]:
        return f"native code built for {theirs.get('os')}/{theirs.get('arch')}, this is {ours['os']}/{ours['arch']}"
    lacking = sorted(set(theirs.get("isa") or ()) - set(ours["isa"])) if "isa" in ours else []
    if lacking:
        return (
            f"native code built on a CPU with {', '.join(lacking)} ({theirs.get('processor')}), "
            f"which this CPU ({ours.get('processor')}) lacks"
        )
    if theirs.get("capability") and ours.get("capability") and theirs["capability"] != ours["capability"]:
        return (
            f"native code built for CUDA compute capability {theirs['capability']} ({theirs.get('device_name')}), "
            f"this GPU ({ours.get('device_name')}) is {ours['capability']}"
        )
    return None


def write_package(path: str | Path, members: Mapping[str, bytes], *, native: set[str], info: Mapping[str, Any]) -> Path:
    """Write ``members`` (name -> bytes) and a manifest holding ``info`` to ``path``, atomically.

    ``native``: the members that are machine code, signed with :func:`signing_key`."""
    from .artifacts import atomic_write
    from .version import __version__

    key_name, key = signing_key() if native else ("", b"")
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in members.items()}
    table = {name: {"size": len(data), "sha256": digests[name]} for name, data in members.items()}
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "torchmux": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        **info,
        "members": table,
        "signatures": {n: _signature(key, n, digests[n]) for n in sorted(native)},
        "key": key_name,
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(_aligned(MANIFEST, buf.tell()), json.dumps(manifest, indent=1, sort_keys=True))
        for name, data in members.items():
            z.writestr(_aligned(name, buf.tell()), data)
    out = Path(path)
    atomic_write(out, buf.getvalue())
    umask = os.umask(0)  # a package is a file to ship: the mode a plain open() would give, not mkstemp's 0600
    os.umask(umask)
    os.chmod(out, 0o666 & ~umask)
    return out


def _aligned(name: str, offset: int) -> zipfile.ZipInfo:
    """A stored member whose local header, written at ``offset``, ends (and its data starts) at a
    multiple of :data:`ALIGN`: the header's extra field is zipalign's, padded to fit."""
    import time

    info = zipfile.ZipInfo(name, date_time=time.localtime(time.time())[:6])
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o600 << 16  # as ZipFile.writestr gives a member named by a string
    header = 30 + len(name.encode()) + 6  # the local header, the name, the extra field's ID, size and alignment
    pad = -(offset + header) % ALIGN
    info.extra = struct.pack("<HHH", _ALIGN_EXTRA, 2 + pad, ALIGN) + bytes(pad)
    return info


def _read_aligned(path: Path) -> memoryview:
    """The file's bytes in a writable buffer of this process's that starts at a multiple of :data:`ALIGN`:
    anonymous pages (page-aligned), mapped in one call where the system can (``MAP_POPULATE``: a fault per
    page took as long again as the read on a 2.7 MB package), else a bytearray placed on the boundary."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            import mmap

            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
            view = memoryview(mmap.mmap(-1, max(size, 1), flags=flags))[:size]
        except (AttributeError, TypeError, OSError, ValueError):  # no anonymous POSIX mapping here (Windows)
            import ctypes

            block = bytearray(size + ALIGN)
            start = -ctypes.addressof(ctypes.c_char.from_buffer(block)) % ALIGN
            view = memoryview(block)[start : start + size]
        got = f.readinto(view)
    return view[:got]


class PackageReader:
    """A package opened for reading; every member checked against the manifest (module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            raw = _read_aligned(self.path)
        except OSError as e:
            raise PackageError(f"cannot read the package {self.path}: {e}") from e
        try:
            self._zip = open_archive(raw)
            names = set(self._zip.namelist())
        except (zipfile.BadZipFile, ValueError, EOFError) as e:
            raise PackageError(
                f"{self.path} is not a torchmux package (not a readable zip archive: {e}); a truncated copy "
                "or another kind of file. Export it again with torchmux.export(...).save(path)"
            ) from e
        if MANIFEST not in names:
            raise PackageError(
                f"{self.path} is a zip archive but not a torchmux package (no {MANIFEST}); "
                "torchmux.load reads what torchmux.export(...).save() writes"
            )
        try:
            self.manifest: dict[str, Any] = json.loads(self._zip.read(MANIFEST).decode())
        except (ValueError, UnicodeDecodeError, zipfile.BadZipFile) as e:
            raise PackageError(f"{self.path}: its {MANIFEST} is damaged ({type(e).__name__}: {e})") from e
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            raise PackageError(f"{self.path} is not a torchmux package (its manifest names no format {FORMAT!r})")
        version = self.manifest.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise PackageError(
                f"{self.path} is a package of format version {version!r}, newer than this torchmux reads "
                f"({FORMAT_VERSION}); upgrade torchmux (pip install -U torchmux) or export it again with this one"
            )
        members = self.manifest.get("members")
        if not isinstance(members, dict) or set(members) != names - {MANIFEST}:
            extra = sorted(names - {MANIFEST} - set(members or {}))
            missing = sorted(set(members or {}) - names)
            raise PackageError(
                f"{self.path}: its members do not match its manifest (unlisted: {extra or 'none'}, "
                f"missing: {missing or 'none'}); the file was altered. Export it again"
            )
        self._data: dict[str, bytes | memoryview] = {}
        try:
            views = stored_members(self._zip, raw)
        except zipfile.BadZipFile as e:
            raise PackageError(f"{self.path}: {e}: the file was altered or truncated. Export it again") from e
        for name, entry in members.items():
            try:
                # the SHA-256 below checks every byte; zip's own CRC-32 where a member is compressed
                data = self._zip.read(name) if views is None else views[name]
                why = (
                    ""
                    if len(data) == entry.get("size")
                    else f"{len(data)} bytes, the manifest says {entry.get('size')}"
                )
                why = why or ("" if hashlib.sha256(data).hexdigest() == entry.get("sha256") else "its SHA-256 differs")
            except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
                why = str(e)
            if why:
                raise PackageError(
                    f"{self.path}: member {name} is damaged or altered ({why}): it is not what was saved. "
                    "Export it again (or copy it again)"
                )
            self._data[name] = data

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self._data if n.startswith(prefix))

    def read(self, name: str) -> bytes:
        return bytes(self.view(name))

    def view(self, name: str) -> memoryview:
        """Member ``name`` without a copy (checked, as every member is)."""
        try:
            return memoryview(self._data[name])
        except KeyError:
            raise PackageError(f"{self.path} has no member {name}") from None

    def json(self, name: str) -> Any:
        try:
            return json.loads(self.read(name).decode())
        except (ValueError, UnicodeDecodeError) as e:
            raise PackageError(f"{self.path}: member {name} is not valid JSON ({e})") from e

    def trusted(self, name: str) -> tuple[bool, str]:
        """Whether native member ``name`` is signed by the key this user trusts; if not, why."""
        expected = (self.manifest.get("signatures") or {}).get(name)
        if not expected:
            return False, f"{name} carries no signature"
        try:
            key_name, key = signing_key()
        except Exception as e:
            return False, f"no key to check {name}'s signature with ({e})"
        digest = self.manifest["members"][name]["sha256"]
        if hmac.compare_digest(str(expected), _signature(key, name, digest)):
            return True, ""
        signed_with = self.manifest.get("key") or "?"
        return False, (
            f"{name} is signed with a key this user does not trust (signed with the {signed_with} key, checked "
            f"with the {key_name} key: set TORCHMUX_FLEET_KEY_FILE to the fleet key the package was built with)"
        )
