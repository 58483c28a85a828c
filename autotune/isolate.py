"""Isolated trials: a candidate never run on this machine for this graph is first tried in a child process.

A segfault, ``abort()`` or hang in a backend's compile or first calls then kills or stalls only the
child. Every candidate is screened this way before the parent builds it (auto's candidates and a
backend named with ``backend=`` alike; eager, the reference, never is), and only those that will be
built: a decision already on disk runs without trials.

**One child per process** (:class:`TrialChild`). ``compile()`` starts it (:func:`prestart`), so its
start -- importing torch and Inductor, seconds -- overlaps Dynamo's capture in the parent (not when the
same model was compiled here before: a warm start needs no trial); it then
answers trial after trial, and only a trial that kills it costs a new start. Protocol, a line each
way: the parent ``torch.save``-s a request (the graph, input kinds, copies of the inputs, backend
name and plugin module, options, the cache settings of the moment) and writes its path; the child
answers ``ready`` once it has rebuilt the graph (the deadline starts there) and then one JSON
verdict. ``ok``, ``crashed with signal N``, ``exited with status N`` or ``timed out after S s`` is
remembered under ``$TORCHMUX_CACHE_DIR/trials/`` keyed like decisions (graph fingerprint, signature,
backend name and version, mode, torch's and torchmux's versions): the cost is paid once per graph
and backend on a machine.

**What the child built reaches the parent through the backends' own disk caches**, not a second
build: the child rebuilds the parent's graph node for node (the pickled code re-read with frozen
weights kept as ``get_attr``, each value's spec restored by fake propagation; where re-reading the code
folds an op without inputs into a constant, as a backward graph's ``aten.scalar_tensor``, the child's
graph is the same program under another key: its verdict stands, and the parent builds its own) and takes the parent's fingerprint, so ONNX
Runtime's models, TVM's libraries and Inductor's FX graph cache entries are found under the same
keys (frozen Inductor graphs too: their oneDNN-packed weights are keyed by spec and folded again in
the parent, ``backends/inductor.py``). ``python -m torchmux.bench.scripts.isolation_cold_start`` measures the cost against
``torch.compile``'s first call.

**``torchmux.export``'s trials** (``program=``): the request also carries the ``ExportedProgram`` (as
``torch.export.save`` writes it); the child builds from it as the export will, checks two calls, then
saves what it built and loads it back (``core/package.py`` ``saved_and_loaded``, as the package ships
it) and checks the loaded form: a native library that kills its process as it loads stays in the child.
A backend that builds from the program alone (``exports_programs``) works under the parent's key even
where the child's graph is the parent's dynamic one specialized to the example's sizes. These verdicts
are kept under keys of their own (a ``compile()`` trial builds something else), never by structure.

Which candidates are isolated (``options={"isolate": ...}`` or ``TORCHMUX_ISOLATE``): ``"all"``
(default), ``"third-party"`` (backends whose plugin is not torchmux itself), or ``"off"``. A backend
the child cannot find (an object passed as ``backend=`` rather than registered from a module) or a
graph that does not pickle is run in-process, unisolated. A symbolic-shape graph does not pickle into
a child (its symbols do not survive): its trial runs on the graph specialized to the call's sizes, a
static graph of the same structure (shapes.py), unless a verdict on that structure exists already.

The deadline (``options={"trial_deadline": S}`` or ``TORCHMUX_TRIAL_DEADLINE``; default 30 s,
``settings.TRIAL_DEADLINE_SECONDS``, 300 s under ``mode="max-autotune"``) runs from the moment the child,
up, has the request: loading it, the compile and the two calls. A child not up yet is first waited for
:data:`STARTUP_SECONDS` (60). A child past either is killed. So a backend that hangs costs a first call
at most the child's start (usually overlapped by Dynamo's capture) plus one deadline, and once per graph
structure, not once per graph: the verdict is carried to the same graph at other sizes, a recompile, a
symbolic recapture (verdicts.py). A candidate that is *not* isolated gets the same deadline in-process
(:func:`torchmux.autotune.tuner.within_deadline`): its compile and two checked calls run in a daemon
thread, and past the deadline the candidate fails as "timed out after S s" and that thread is
abandoned -- Python cannot kill a thread, so it stays blocked, holding what it holds, until the process
exits. Neither covers a hang in a later call (timing, or a user's call through the Guard): that call
is the user's own.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import functools
import hashlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..core import settings
from ..core.artifacts import atomic_write
from ..core.backend import prepare_in_background
from ..core.errors import TorchmuxFallbackWarning
from ..core.ir import GraphIR
from ..core.registry import get_registry
from ..core.userframe import warn_at
from . import verdicts

_FORWARDED = ("TORCHMUX_", "TORCHINDUCTOR_", "TRITON_", "TVM_", "ORT_", "OMP_", "CUDA_VISIBLE_DEVICES")
#: a cold child's start: importing torch and Inductor (7 s measured on this 2-core VM under load; compile()
#: starts it while Dynamo captures). Only a child that is not up yet is waited for this long
STARTUP_SECONDS = 60.0


def wanted(backend: Any, mode: str) -> bool:
    """Whether ``backend`` is tried in a child first under isolation ``mode``."""
    if mode == "off" or backend.name == "eager":
        return False
    if mode == "all":
        return True
    return get_registry().package_of(backend.name) not in ("torchmux", None)


def _key(ir: GraphIR, signature: tuple, backend: Any, mode: str | None, program: bool = False) -> str:
    from ..core.version import __version__

    try:
        version = str(backend.version)
    except Exception:  # noqa: BLE001 -- a backend's fault of any kind is a measurement, never the user's crash
        version = "?"
    parts = [
        ir.fingerprint(),
        repr(signature),
        backend.name,
        version,
        mode or "default",
        torch.__version__,
        __version__,
    ] + (["program"] if program else [])  # torchmux.export's trial: the whole program built, saved, loaded back
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _verdict_path(key: str) -> Path:
    return settings.CACHE_DIR.get() / "trials" / f"{key}.json"


def remembered(key: str) -> dict[str, Any] | None:
    """The verdict a previous trial left for ``key``, if the record is well formed."""
    try:
        record = json.loads(_verdict_path(key).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(record, dict) and isinstance(record.get("ok"), bool) and isinstance(record.get("reason"), str):
        return record
    return None


def trial(
    ir: GraphIR,
    signature: tuple,
    backend: Any,
    args: Sequence[Any],
    *,
    mode: str | None,
    options: dict[str, Any],
    deadline: float,
    program: Callable[[], bytes | None] | None = None,
) -> tuple[bool, str] | None:
    """(ok, reason) for ``backend`` on this graph, from the disk or from the trial child; None: cannot isolate it.
    ``program``: for a ``torchmux.export``, the bytes of its ``ExportedProgram`` when called (None: it does
    not save); its trial also saves and loads back what it built."""
    key = _key(ir, signature, backend, mode, program is not None)
    if (old := remembered(key)) is not None:
        return old["ok"], old["reason"]
    registry = get_registry()
    plugin = registry.plugin_of(backend.name)
    if plugin is None or (
        registry.package_of(backend.name) == "(registered at run time)" and plugin not in sys.modules
    ):
        return None  # an object registered at run time: a child could not rebuild it, so starting one is wasted
    verdict = _ask_child(ir, backend.name, plugin, args, mode, options, deadline, program)
    if verdict is None:
        return None
    if verdicts.slow_not_stuck(backend, verdict[1]):
        return verdict  # torchmux's own code was slow, not stuck: the next process tries it again
    try:
        atomic_write(_verdict_path(key), json.dumps({"ok": verdict[0], "reason": verdict[1], "backend": backend.name}))
    except OSError:
        pass
    return verdict


def _ask_child(
    ir: GraphIR,
    name: str,
    plugin: str,
    args: Sequence[Any],
    mode: str | None,
    options: dict[str, Any],
    deadline: float,
    program: Callable[[], bytes | None] | None = None,
) -> tuple[bool, str] | None:
    fd, path = tempfile.mkstemp(prefix="torchmux-trial-", suffix=".pt")
    os.close(fd)
    try:
        payload = {
            "program": program() if program is not None else None,
            "gm": ir.gm,
            "kinds": ir.input_kinds,
            "name": ir.name,
            "backend": name,
            "plugin": plugin,
            "args": [a.detach().cpu().clone() if isinstance(a, torch.Tensor) else a for a in args],
            "device": [a.device.type if isinstance(a, torch.Tensor) else None for a in args],
            "mode": mode,
            "options": options,
            "fingerprint": ir.fingerprint(),
            "phase": ir.phase,
            "grad": torch.is_grad_enabled(),  # as the parent builds (the runner decides under no_grad)
            "threads": torch.get_num_threads(),
            "structure": GraphIR(ir.gm, ir.input_kinds, name=ir.name, phase=ir.phase).fingerprint(),
            # the child was started earlier: it takes the cache folders and settings as they are now
            "env": {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED)},
        }
        tracer, ir.gm._tracer_cls = ir.gm._tracer_cls, _ExactTracer  # how the child re-reads the code
        try:
            if program is not None and payload["program"] is None:
                raise ValueError("the exported program does not save")
            torch.save(payload, path)
        except Exception:  # noqa: BLE001 -- a backend's fault of any kind is a measurement, never the user's crash
            return None  # a graph that does not pickle is tried in-process
        finally:
            ir.gm._tracer_cls = tracer
        return _SERVER.ask(path, deadline)
    finally:
        os.unlink(path)


def _program_bytes(program: Any) -> bytes | None:
    """An ``ExportedProgram`` as ``torch.export.save`` writes it (None: none given, or it does not save)."""
    if program is None:
        return None
    buf = io.BytesIO()
    try:
        torch.export.save(program, buf)
    except Exception:  # noqa: BLE001 -- a program that does not save is tried in-process, as a graph that does not pickle
        return None
    return buf.getvalue()


class TrialChild:
    """The child process that runs trials, one at a time, while the parent needs it.

    Started at most once per parent (and again only after a trial killed it, or after it left idle),
    so importing torch in a child is paid once, not per trial; :func:`prestart` starts it early, while
    Dynamo captures. The protocol, one line each way: the child says ``up`` once imported; the parent
    writes the path of a ``torch.save``'d request; the child answers ``ready`` once the request is
    loaded (the trial's deadline starts there) and then one JSON verdict. The child's fd 1 carries
    only this protocol: a backend's own prints go to its stderr, a temporary file emptied before each
    trial; where the child dies of a signal, the stacks ``faulthandler`` wrote there name the place
    (:func:`crash_site`), and the verdict says it. After ``TORCHMUX_TRIAL_CHILD_IDLE``
    seconds (300) without a request it exits, giving its memory back. A child that a process forked from the parent would
    share is not used: a new one starts. A child that cannot even start (a Python that cannot import
    torchmux) makes isolation unavailable in this process, with one warning: torchmux's own backends
    are then tried in-process under the trial deadline, and plugins' backends are not used (their
    crash would be the program's).
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._log: Any = None  # the child's stderr (a temporary file): where a crash is, read from its tail
        self._pid = 0
        self._up = False  # the current child said "up"
        self._lock = threading.Lock()
        self.unavailable = ""  # why no child can run here (set once, then every trial is in-process)
        self.warned = False
        self.trials = 0  # requests answered or not, in this process (the tests count them)
        self.starts = 0  # children started in this process

    def start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None or self._pid != os.getpid():
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            if self._log is not None:
                self._log.close()
            self._log = None if os.environ.get("TORCHMUX_DEBUG_TRIALS") else tempfile.TemporaryFile()
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "torchmux.autotune.isolate"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,  # None (debugging): the parent's
                text=True,
            )
            self._pid, self._up = os.getpid(), False
            self.starts += 1
        return self._proc

    def stop(self) -> None:
        with self._lock:
            if self._proc is not None and self._pid == os.getpid():
                _kill(self._proc)
            self._proc = None
            if self._log is not None:
                self._log.close()
                self._log = None

    def ask(self, path: str, deadline: float) -> tuple[bool, str] | None:
        with self._lock:
            if self.unavailable:
                return None
            self.trials += 1
            for _ in range(2):  # a second time only if the child left (idle) as the request went out
                child = self.start()
                if self._log is not None:  # only this trial's output: the child's writes share this offset
                    self._log.seek(0)
                    self._log.truncate()
                assert child.stdin is not None
                try:
                    child.stdin.write(path + "\n")
                    child.stdin.flush()
                except OSError:  # it exited since the poll in start()
                    _kill(child)
                    self._proc = None
                    if not self._up:  # it never started (as _wait says): nothing here can run a trial
                        self.unavailable = f"the trial child exited with status {child.returncode} before it started"
                        return None
                    continue
                verdict, alive, retry = self._wait(child, deadline)
                if not alive:
                    _kill(child)
                    self._proc = None
                if not retry:
                    return verdict
            return None

    def _wait(self, child: subprocess.Popen, deadline: float) -> tuple[tuple[bool, str] | None, bool, bool]:
        """Read the child's lines until the verdict: ``(verdict or None, child still usable, ask again)``."""
        assert child.stdout is not None
        # the deadline runs from the moment an up child has the request: loading it, importing the plugin
        # and rebuilding the graph count (a plugin whose import hangs in the child is a hang like another)
        limit = time.monotonic() + (deadline if self._up else STARTUP_SECONDS)
        started = None
        for line in _lines(child.stdout.fileno(), lambda: limit - time.monotonic()):
            if line == b"up":
                self._up = True
                limit = time.monotonic() + deadline
            elif line == b"ready":
                started = time.monotonic()
            elif line.startswith(b"{"):
                verdict = json.loads(line)
                if verdict.get("unknown"):
                    return None, True, False
                return (bool(verdict["ok"]), str(verdict["reason"])), True, False
        if time.monotonic() >= limit:  # a child that never came up is no verdict: the start failed, not the backend
            return ((False, f"timed out after {deadline:g} s (isolated trial)") if self._up else None), False, False
        code = child.wait()  # the child is gone
        if not self._up:  # it never started: nothing here can run a trial (screen() warns once)
            self.unavailable = f"the trial child exited with status {code} before it started"
            return None, False, False
        if started is None and code == 0:
            return None, False, True  # it left idle as the request went out: ask a new one
        if code < 0:
            where = crash_site(self._read_log())
            return (
                (
                    False,
                    f"crashed with signal {-code} ({signal.Signals(-code).name}) in an isolated trial"
                    + (f", in {where}" if where else ""),
                ),
                False,
                False,
            )
        return (False, f"exited with status {code} in an isolated trial"), False, False

    def _read_log(self, size: int = 65536) -> str:
        """The end of what the child wrote to its stderr during this trial ("" when debugging: it went to ours)."""
        if self._log is None:
            return ""
        with contextlib.suppress(OSError):
            end = self._log.seek(0, os.SEEK_END)
            self._log.seek(max(0, end - size))
            return self._log.read().decode(errors="replace")
        return ""


def crash_site(log: str, frames: int = 3) -> str:
    """Where a child died, from the stacks ``faulthandler`` wrote as it did: the innermost ``frames`` Python
    frames of the thread that crashed (``folder/file.py:line function``, innermost first), or ""."""
    block = log.rsplit("Current thread ", 1)
    if len(block) < 2:
        return ""
    found = []
    for line in block[1].splitlines()[1:]:
        line = line.strip()
        if not line.startswith("File "):
            break
        try:
            path, rest = line[len('File "') :].split('", line ', 1)
            number, function = rest.split(" in ", 1)
        except ValueError:
            break
        found.append(f"{'/'.join(path.split(os.sep)[-2:])}:{number} {function}")
        if len(found) == frames:
            break
    return " <- ".join(found)


def _lines(fd: int, seconds_left: Callable[[], float]) -> Iterator[bytes]:
    """The lines written to ``fd`` (stripped), until end of file or until ``seconds_left()`` runs out
    with no line. Read with ``os.read``: a buffered reader could hold a line in its buffer while
    ``select`` waits on the descriptor. Both sides of the protocol read this way."""
    pending = b""
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line.strip()
        left = seconds_left()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        pending += chunk


def _kill(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
    child.wait()
    for stream in (child.stdin, child.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


_SERVER = TrialChild()
atexit.register(_SERVER.stop)


def prestart(backends: Sequence[Any], mode: str, model: Any = None) -> None:
    """Start the trial child now if ``mode`` isolates one of ``backends``, so that importing torch there
    overlaps the parent's capture instead of delaying the first trial (compile() calls this).

    Not on a warm start: where ``model`` (the same class and weight specs, or the same function) was
    compiled with these backends before, its graphs' verdicts are on disk and no trial is expected,
    so a child would only take CPU from the parent. A graph that does need one (a new shape, a new
    code path) starts the child then, as :func:`trial` asks."""
    if not any(wanted(b, mode) for b in backends) or _SERVER.unavailable:
        return
    seen = settings.CACHE_DIR.get() / "trials" / "models" / _model_key(model, backends, mode)
    if model is not None and seen.exists():
        return
    with _SERVER._lock:
        _SERVER.start()
    if model is not None:
        with contextlib.suppress(OSError):  # a read-only cache: every start prestarts, as before
            atomic_write(seen, "")


def _model_key(model: Any, backends: Sequence[Any], mode: str) -> str:
    """What :func:`prestart` remembers a compiled model by: its class and the names, shapes and dtypes of
    its weights (a function: its code's place), the candidates, the isolation mode and the versions."""
    from ..core.version import __version__

    if isinstance(model, torch.nn.Module):
        what = [f"{type(model).__module__}.{type(model).__qualname__}"] + [
            f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in (*model.named_parameters(), *model.named_buffers())
        ]
    else:
        code = getattr(model, "__code__", None)
        what = [getattr(model, "__module__", "?") or "?", getattr(model, "__qualname__", type(model).__qualname__)]
        what += [f"{code.co_filename}:{code.co_firstlineno}"] if code is not None else []
    what += sorted(b.name for b in backends) + [mode, torch.__version__, __version__]
    return hashlib.sha256("|".join(what).encode()).hexdigest()[:32]


def _serve() -> None:
    """The child's side: for each request path on stdin, rebuild the IR and the backend, compile, call
    twice, print the verdict. Its fd 1 is the protocol; everything else printed goes to stderr."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    faulthandler.enable()  # a fatal signal writes each thread's stack to stderr: the parent reads where it was
    # imported before the first request: the start-up is paid while the parent captures
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    from torch.fx.passes import fake_tensor_prop  # noqa: F401

    from . import placement, verify  # noqa: F401

    registry = get_registry()
    own = [b for b in map(registry.get, registry.names) if not wanted(b, "third-party")]
    for device in ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]:
        prepare_in_background(own, device)  # a plugin's prepare() could kill the child and be blamed on a trial
    idle = settings.TRIAL_CHILD_IDLE.get()
    print("up", file=proto, flush=True)
    # until the parent is gone, or idle: then exit and give the memory back (the parent starts a new child)
    for line in _lines(0, lambda: idle):
        print(json.dumps(_one(line.decode(), proto)), file=proto, flush=True)


def _rebuilt(gm: torch.fx.GraphModule, args: Sequence[Any], kinds: Any, name: str, phase: str) -> GraphIR:
    """The parent's graph as it was: the unpickled code is the same graph, but each value's spec
    (``meta["val"]``) does not survive pickling; propagating fake copies of the inputs restores it,
    so the fingerprint, and with it every backend's cache key, is the parent's."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*args)
    for node in gm.graph.nodes:
        if node.op == "output":
            node.meta.pop("val", None)  # as normalization leaves it
    return GraphIR(gm, kinds, name=name, phase=phase).lint()


class _ExactTracer(torch.fx.Tracer):
    """How the child re-reads the pickled graph's code: a buffer (a frozen weight) stays a ``get_attr``
    instead of being folded, with the ops on it, into new constants, so the child's graph is the
    parent's node for node."""

    proxy_buffer_attributes = True


def _one(path: str, proto: Any) -> dict[str, Any]:
    from ..core.backend import CompileRequest
    from ..core.package import saved_and_loaded
    from .placement import build_placement
    from .verify import check_call

    try:
        payload = torch.load(path, weights_only=False)
        for k in [k for k in os.environ if k.startswith(_FORWARDED)]:
            del os.environ[k]
        os.environ.update(payload["env"])
        args = [a.to(d) if isinstance(a, torch.Tensor) else a for a, d in zip(payload["args"], payload["device"])]
        ir = _rebuilt(payload["gm"], args, payload["kinds"], payload["name"], payload["phase"])
        program = torch.export.load(io.BytesIO(payload["program"])) if payload.get("program") else None
        registry = get_registry()
        if payload["backend"] not in registry.names:
            with contextlib.suppress(Exception):  # not importable: answered "unknown" below
                registry.register(__import__(payload["plugin"], fromlist=["_"]), payload["plugin"])
        backend = registry.get(payload["backend"]) if payload["backend"] in registry.names else None
        if ir.fingerprint() == payload["structure"] or (
            program is not None and getattr(backend, "exports_programs", False)
        ):
            # the parent's graph node for node, or a backend that builds from the program alone: its artifacts
            # are the parent's, under the parent's key (which may also name its frozen weights)
            ir._fingerprint = payload["fingerprint"]
        # else re-reading the code folded an op without inputs into a constant (a backward graph's
        # aten.scalar_tensor), or specialized a dynamic graph to the example's sizes: the same program under
        # its own key. The trial's verdict holds for the parent's graph; what it built stays under the
        # child's key, and the parent builds its own
    except Exception:  # noqa: BLE001 -- a request this child cannot rebuild: the parent runs the candidate unisolated
        if os.environ.get("TORCHMUX_DEBUG_TRIALS"):
            import traceback

            traceback.print_exc()
        backend = None
    if backend is None:
        return {"unknown": True}
    print("ready", file=proto, flush=True)
    torch.set_num_threads(payload["threads"])
    try:
        # the parent's grad mode (Inductor, for one, freezes only without grad): build what the parent will
        with torch.set_grad_enabled(payload["grad"]):
            built = build_placement(
                ir, backend, args, mode=payload["mode"], options=payload["options"], program=program
            )
            _, wrong = check_call(ir, built.fn, args, twice=True)
            if program is not None and wrong is None:  # torchmux.export ships what it built saved and loaded back
                request = CompileRequest(ir, args, payload["mode"], payload["options"], program=program)
                device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
                _, fn = saved_and_loaded(backend, built, request, device)
                if fn is not built.fn:
                    _, wrong = check_call(ir, fn, args, twice=True)
        return {"ok": True, "reason": ""} if wrong is None else {"ok": True, "reason": f"(ran; {wrong})"}
    except Exception as e:  # noqa: BLE001 -- an exception is no danger to the parent: it measures the candidate itself
        return {"ok": True, "reason": f"(raised {type(e).__name__})"}


def screen(
    ir: GraphIR,
    signature: tuple,
    candidates: Sequence[Any],
    args: Sequence[Any],
    *,
    mode: str | None,
    options: Callable[[str], dict[str, Any]],
    isolation: str,
    deadline: float,
    where: Any = None,
    structure: str = "",
    program: Any = None,
) -> tuple[list[Any], list[tuple[str, str]]]:
    """Split ``candidates`` into those safe to run in-process and (name, reason) for those that crashed or
    hung. ``where``: the user's line, for the one warning if no trial child can run here. ``structure``
    (verdicts.py): a trial on a graph of the same structure stands for this graph's, and this one's is
    kept for the next. ``program``: ``torchmux.export``'s ``ExportedProgram``; each trial then builds from
    it as the export will, and saves and loads back what it built, as a package ships it (the program is
    saved once for all the trials, and only if one runs)."""
    saved = functools.cache(functools.partial(_program_bytes, program)) if program is not None else None
    safe, failed = [], []
    for b in candidates:
        if not wanted(b, isolation):
            verdict = None
        elif (old := verdicts.recall(structure, b, mode)) is not None:
            verdict = (old.ok, old.reason)  # a failed verdict is the runner's to report (it skips the backend)
        else:
            verdict = trial(
                ir, signature, b, args, mode=mode, options=options(b.name), deadline=deadline, program=saved
            )
            if verdict is not None:
                verdicts.record(structure, b, mode, verdict[0], "" if verdict[0] else verdict[1])
        if verdict is not None and not verdict[0]:
            failed.append((b.name, verdict[1]))
        elif verdict is None and _SERVER.unavailable and wanted(b, "third-party"):
            # never run in this process untried: a plugin's crash would be the program's
            failed.append((b.name, f"not tried: isolated trials are unavailable here ({_SERVER.unavailable})"))
        else:
            safe.append(b)
    if _SERVER.unavailable and not _SERVER.warned:
        _SERVER.warned = True
        warn_at(
            f"torchmux: isolated trials are unavailable ({_SERVER.unavailable}; `{sys.executable} -m "
            "torchmux.autotune.isolate` shows why): torchmux's own backends are tried in this process, under the "
            "trial deadline; plugins' backends are not used",
            TorchmuxFallbackWarning,
            where,
        )
    return safe, failed


if __name__ == "__main__":
    _serve()
