"""The measuring side of ``torchmux bench``: what one child process does with one model.

The parent (cli.py) never compiles anything itself; it starts child processes and reads what they
write, so a backend that crashes or hangs costs one child, never the benchmark. Three kinds of child:

- **compile** (one system): build the model, compile it, call it once (that first call is the
  compile time, as torch.compile compiles lazily), call it twice more, report the process's peak
  memory. Run twice per system with the same cache folders: first empty (cold), then hot (warm).
- **latency** (all systems of one model, in one process, so that they share the machine's noise):
  compile each system, check its output against eager's, then time them in interleaved rounds,
  in a new (seeded random) order every round. Progress is written as JSON lines as it happens, so when the
  process dies the parent knows which system was running.
- **served** (``--latency-processes per-system``: one system, one process): the latency child's work
  for its one system, then one sample each time the parent asks, so that the parent interleaves
  the processes of all systems in the same rounds.

Latency is per call, wall clock, CUDA synchronized. One sample is ``n`` back-to-back calls divided
by ``n``, where ``n`` makes a sample last about :data:`SAMPLE_SECONDS` (short calls are noise otherwise),
after untimed calls that last at least ``autotune.tuner.SWITCH_SECONDS``: a model in use runs in a loop, and the
first calls after another system ran pay for that switch (caches holding the other's weights, its
threads or torch's still spinning), which the interleaving exists to spread fairly, not to time. That cost differs by system: at 2 threads
ONNX Runtime's first call after Inductor's is the slowest, and 2-3-call samples without the untimed call
ranked Inductor first on the zoo's attention block (7.29 ms against 7.93 for ONNX Runtime used
directly), where a loop of calls ranks ONNX Runtime first (6.64 against 6.81). The autotuner times
its bursts with the same function (``autotune/tuner.py`` ``sample_seconds``), so the bench and auto's
choice measure one thing.

Latency is the steady state of a model in a loop: before the rounds, every system runs
:data:`WARM_CALLS` calls (or :data:`WARM_SECONDS`, whichever comes first). A torchmux system re-checks
its answers on calls 1, 2, 4, ..., 8192 (the default verify policy, ``autotune/verify.py``): each check
runs the graph's ATen code once more. Over the first 8192 calls that is 14 checks, under 0.2% of the
calls, but the few dozen calls of the rounds would otherwise hold four or five of them (ResNet at batch
8: the median of torchmux's ONNX Runtime 2.21 ms with the checks in the rounds, its quartiles
2.09-3.04, where ONNX Runtime used directly took 1.84). After the warm-up the next check falls at call
512, past the rounds.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..autotune.tuner import SAMPLE_SECONDS, sample_seconds
from ..core.hookspecs import hookimpl

#: calls every system makes before its timed rounds (the steady state: see above), at most WARM_SECONDS
WARM_CALLS, WARM_SECONDS = 300, 3.0
#: output tolerance against eager: compare.mismatch's float tolerances times this (whole models
#: accumulate more rounding than the single ops the conformance suite checks)
MATCH_SCALE = 5.0
EAGER, INDUCTOR, AUTO = "eager", "inductor", "torchmux:auto"
#: torchmux auto that also tries each graph cut into pieces, each on its own fastest backend (split.py)
AUTO_SPLIT = "torchmux:auto-split"
AUTOS = (AUTO, AUTO_SPLIT, "torchmux-export:auto")
#: what a user would pick instead of torchmux: torch.compile with Inductor's freezing (its CPU inference
#: setting), and ONNX Runtime used directly (torch.onnx.export + InferenceSession, outside torchmux)
INDUCTOR_FREEZING, ONNX_EXPORT = "inductor-freezing", "onnxruntime-export"
#: torch.compile's setting for small calls on a GPU (``mode="reduce-overhead"``: Inductor's code replayed
#: as CUDA graphs), what its user picks where launches dominate; CUDA only (on a CPU it is ``inductor``)
INDUCTOR_CUDAGRAPHS = "inductor-reduce-overhead"
#: AOTInductor used as its docs say (``aoti_compile_and_package`` of ``torch.export.export``, then
#: ``aoti_load_package`` and a call of the loaded model); torchmux's package (``torchmux.export`` with a
#: backend or auto, saved and loaded again: what a deployment runs, no Dynamo in the call)
AOTI, EXPORT = "aoti", "torchmux-export:"
#: Apache TVM as its users run it: torch.export, TVM's PyTorch frontend, ``tvm.compile``, a Relax VM
TVM_EXPORT = "tvm-export"
EXPORT_AUTO = EXPORT + "auto"
# every system that is not a torchmux auto (AUTOS) is what auto must beat: bench/results.py auto_vs_best


#: backends whose thread pools are their own (not torch's OpenMP), and the option that sizes them;
#: ``--threads`` sets it so that every system computes with the same number of threads
THREAD_OPTIONS = {"onnxruntime": "intra_op_num_threads"}
#: environment variables that size the other thread pools (OpenMP, MKL, TVM's runtime)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS")


def make_compiled(system: str, model: torch.nn.Module, threads: int | None = None) -> Callable[..., Any]:
    """The callable a system makes of ``model``: eager is the model, ``inductor`` is torch.compile's
    default, ``inductor-freezing`` the same with ``freezing=True``, ``inductor-reduce-overhead`` with
    ``mode="reduce-overhead"`` (CUDA graphs), ``onnxruntime-export``, ``aoti`` and ``tvm-export`` ONNX
    Runtime, AOTInductor and TVM used directly, ``torchmux:<name>`` is torchmux.compile with that backend
    (``auto`` included), ``torchmux-export:<name>`` its package saved and loaded back.
    Every system compiles lazily, at its first call, as torch.compile does."""
    if system == EAGER:
        return model
    if system == INDUCTOR:
        return torch.compile(model, backend="inductor")
    if system == INDUCTOR_FREEZING:
        return torch.compile(model, backend="inductor", options={"freezing": True})
    if system == INDUCTOR_CUDAGRAPHS:
        return _ReduceOverhead(torch.compile(model, backend="inductor", mode="reduce-overhead"))
    if system == ONNX_EXPORT:
        return _OnnxExport(model, threads)
    if system == AOTI:
        return _Aoti(model)
    if system == TVM_EXPORT:
        return _TvmExport(model, threads)
    if system.startswith(EXPORT):
        return _TorchmuxExport(model, system.removeprefix(EXPORT), threads)
    if system.startswith("torchmux:"):
        import torchmux
        from torchmux.core.registry import get_registry

        names = get_registry().names
        options: dict[str, Any] = {f"{b}.{opt}": threads for b, opt in THREAD_OPTIONS.items() if threads and b in names}
        if system == AUTO_SPLIT:
            return torchmux.compile(model, backend="auto", options={**options, "split": 4})
        return torchmux.compile(model, backend=system.split(":", 1)[1], options=options)
    raise ValueError(f"unknown system {system!r}")


class _ReduceOverhead:
    """``torch.compile(model, mode="reduce-overhead")`` called as its docs say for an inference loop: each
    call begins a new step (``torch.compiler.cudagraph_mark_step_begin``), so the CUDA graph's output
    buffers of the last call may be reused by this one."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(*args)


class _OnnxExport:
    """``torch.onnx.export(model, args, dynamo=True, optimize=True)`` and an ``InferenceSession`` at the
    first call, as a user of ONNX Runtime would write it: weights become initializers, ONNX Runtime's
    full graph optimizations run. Two settings differ from the defaults, for a fair comparison in one
    process: the session gets ``--threads`` intra-op threads (as every system does), and its threads
    do not spin after a run (spinning threads take the cores of whatever system runs next)."""

    def __init__(self, model: torch.nn.Module, threads: int | None) -> None:
        self.model, self.threads = model, threads
        self.session: Any = None

    def _build(self, args: tuple[Any, ...]) -> None:
        import tempfile

        import onnxruntime as ort

        program = torch.onnx.export(self.model, args, dynamo=True, optimize=True, verbose=False)
        assert program is not None  # dynamo=True returns the ONNXProgram
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = self.threads or torch.get_num_threads()
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.onnx")
            program.save(path)
            self.session = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def __call__(self, *args: Any) -> Any:
        if self.session is None:
            self._build(args)
        feeds = {
            n: a.detach().cpu().numpy() for n, a in zip(self.inputs, [a for a in args if isinstance(a, torch.Tensor)])
        }
        outs = [torch.from_numpy(o) for o in self.session.run(None, feeds)]
        return outs[0] if len(outs) == 1 else tuple(outs)


class _Aoti:
    """``aoti_compile_and_package(torch.export.export(model, args))`` and ``aoti_load_package`` at the first
    call, called as AOTInductor's docs show (``loaded(*args)``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.loaded: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.loaded is None:
            import tempfile

            from torch._inductor import aoti_compile_and_package, aoti_load_package

            with torch.no_grad():
                program = torch.export.export(self.model, args)
                path = os.path.join(tempfile.mkdtemp(prefix="torchmux-bench-aoti-"), "model.pt2")
                aoti_compile_and_package(program, package_path=path)
            self.loaded = aoti_load_package(path)
        return self.loaded(*args)


class _TvmExport:
    """TVM used directly, as its guide to importing a PyTorch model writes it: ``torch.export.export``,
    ``from_exported_program(..., keep_params_as_input=True)``, ``relax.frontend.detach_params``,
    ``tvm.compile`` for the host CPU (LLVM, its ``-mcpu`` and the bench's thread count as ``num-cores``),
    and a Relax VM called with the inputs and the detached weights; tensors in and out by DLPack. Untuned:
    the guide's MetaSchedule step (``static_shape_tuning``) crashes with this machine's tvm-ffi, and
    TVM's runtime threads come from ``TVM_NUM_THREADS``, which ``--threads`` sets."""

    def __init__(self, model: torch.nn.Module, threads: int | None) -> None:
        self.model, self.threads = model, threads
        self.main: Any = None
        self.params: list[Any] = []  # the weights, detached from the module as TVM arrays
        self.to_tvm: Any = None  # tvm.runtime.from_dlpack, looked up once, not in each timed call

    def _build(self, args: tuple[Any, ...]) -> None:
        import tvm
        from tvm import relax
        from tvm.relax.frontend.torch import from_exported_program

        with torch.no_grad():
            program = torch.export.export(self.model, args)
        mod, params = relax.frontend.detach_params(from_exported_program(program, keep_params_as_input=True))
        target: dict[str, Any] = {"kind": "llvm", "num-cores": self.threads or torch.get_num_threads()}
        mcpu = tvm.target.codegen.llvm_get_system_cpu()
        if mcpu and mcpu != "generic":
            target["mcpu"] = mcpu
        executable = tvm.compile(mod, target=tvm.target.Target(target))
        self.main = relax.VirtualMachine(executable, tvm.cpu(0))["main"]
        self.params = list(params["main"])
        self.to_tvm = tvm.runtime.from_dlpack

    def __call__(self, *args: Any) -> Any:
        if self.main is None:
            self._build(args)
        out = self.main(*[self.to_tvm(a.contiguous()) for a in args], *self.params)
        outs = [torch.from_dlpack(o) for o in out]  # the frontend's main returns a tuple, one output included
        return outs[0] if len(outs) == 1 else tuple(outs)


class _TorchmuxExport:
    """``torchmux.export(model, args, backend=...)`` at the first call, saved to a file and loaded back with
    ``torchmux.load``: the bench times the package as a deployment runs it."""

    def __init__(self, model: torch.nn.Module, backend: str, threads: int | None) -> None:
        self.model, self.backend, self.threads = model, backend, threads
        self.loaded: Any = None
        self.auto_choices: dict[str, str] | None = None

    def __call__(self, *args: Any) -> Any:
        if self.loaded is None:
            import tempfile

            import torchmux
            from torchmux.core.registry import get_registry

            names = get_registry().names
            options = {f"{b}.{o}": self.threads for b, o in THREAD_OPTIONS.items() if self.threads and b in names}
            exported = torchmux.export(self.model, args, backend=self.backend, options=options)
            path = exported.save(os.path.join(tempfile.mkdtemp(prefix="torchmux-bench-export-"), "model.tmux"))
            self.loaded = torchmux.load(path)
            self.auto_choices = {"program": self.loaded.backend}
            measured = (
                f"{c['backend']} {c['ms']} ms" if c["ok"] else f"{c['backend']} failed ({c['reason']})"
                for c in exported.plan["candidates"]
            )
            print(f"torchmux-export:{self.backend} candidates: " + "; ".join(measured), file=sys.stderr, flush=True)
        return self.loaded(*args)


def cache_env(root: Path) -> dict[str, str]:
    """The environment that puts every on-disk compile cache of one system under ``root``."""
    return {
        "TORCHMUX_CACHE_DIR": str(root / "torchmux"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TRITON_CACHE_DIR": str(root / "triton"),
    }


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def short_error(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    loc = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}{loc}"


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _setup(device: str, threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda, but torch sees no CUDA GPU")
    # every system compiles the same forward(); Dynamo keeps one cache entry per backend on its code
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))


def _load(model: str, batch: int, device: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    from .zoo import build

    m, args = build(model, batch)
    return m.to(device), tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def first_call(
    system: str, model: torch.nn.Module, args: tuple[Any, ...], device: str, threads: int | None
) -> tuple[Callable[..., Any], Any, float, list[str]]:
    """Compile and call once: (callable, output, seconds, torchmux fallback warnings)."""
    from ..core.errors import TorchmuxFallbackWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TorchmuxFallbackWarning)
        _sync(device)
        t0 = time.perf_counter()
        fn = make_compiled(system, model, threads)
        out = fn(*args)
        _sync(device)
        seconds = time.perf_counter() - t0
    notes = [str(w.message).splitlines()[0][:400] for w in caught if issubclass(w.category, TorchmuxFallbackWarning)]
    return fn, out, seconds, notes


# ---------------------------------------------------------------------------------------- compile child
def compile_child(model: str, system: str, batch: int, device: str, threads: int | None) -> dict[str, Any]:
    """Compile ``model`` with ``system`` in this fresh process: first-call seconds and peak memory."""
    _setup(device, threads)
    m, args = _load(model, batch, device)
    recorder = _AutoChoices.install() if system in AUTOS else None
    before = peak_rss_mb()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        gpu_before = torch.cuda.memory_allocated()
    with torch.no_grad():
        fn, _, seconds, notes = first_call(system, m, args, device, threads)
        for _ in range(2):
            fn(*args)
        _sync(device)
    result: dict[str, Any] = {
        "ok": True,
        "first_call_s": seconds,
        "notes": notes,
        "rss_before_mb": before,
        "peak_rss_mb": peak_rss_mb(),
    }
    if recorder is not None:
        result["auto_choices"] = recorder.chosen()
    if device == "cuda":
        result["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        result["gpu_before_mb"] = gpu_before / 2**20
    return result


# ---------------------------------------------------------------------------------------- latency child
class _AutoChoices:
    """A plugin that records what torchmux auto measured per graph, to report which backend won.
    (A decision auto remembers from an earlier process is not measured again, so not seen here: the
    cold process, whose caches are empty, is where the choices are recorded.)"""

    def __init__(self) -> None:
        self.active = True
        self.graphs: dict[str, str] = {}  # graph -> the candidate the tuner chose (not always the fastest)
        self.eager: dict[str, str] = {}  # graph -> the chosen candidate's ops left to eager

    @classmethod
    def install(cls) -> _AutoChoices:
        import torchmux

        recorder = cls()
        torchmux.register_plugin(recorder, name="torchmux-bench-recorder")
        return recorder

    @hookimpl
    def torchmux_candidate_measured(self, ir: Any, backend: str, chosen: bool, eager_ops: str) -> None:
        if self.active and (chosen or ir.name not in self.graphs):
            self.graphs[ir.name] = backend if chosen else "eager"  # eager: nothing ran it right
        if self.active and chosen and eager_ops:
            self.eager[ir.name] = f"{backend}: {eager_ops}"

    def chosen(self) -> dict[str, str]:
        return dict(self.graphs)

    def eager_notes(self) -> list[str]:
        """One line per graph whose chosen backend left some of its ops to eager (a bench footnote)."""
        return [f"graph {g}: {what} (ran on eager between the backend's regions)" for g, what in self.eager.items()]


def _compare(out: Any, ref: list[torch.Tensor]) -> tuple[bool, float, str | None]:
    from ..core.compare import mismatch
    from .zoo import tensors_of

    got = [t.detach() for t in tensors_of(out)]
    wrong = mismatch(got, ref, scale=MATCH_SCALE)
    diffs = [
        float((g.double() - r.double()).abs().max())
        for g, r in zip(got, ref)
        if g.shape == r.shape and r.dtype.is_floating_point and r.numel()
    ]
    return wrong is None, max(diffs, default=0.0), wrong


def _events(path: Path) -> Callable[..., None]:
    """A function that appends one JSON line to ``path`` per call (flushed: a parent reads it live)."""
    log = path.open("a")

    def emit(**kw: Any) -> None:
        log.write(json.dumps(kw) + "\n")
        log.flush()

    return emit


def _prepared(
    system: str,
    m: torch.nn.Module,
    args: tuple[Any, ...],
    ref: list[torch.Tensor],
    device: str,
    threads: int | None,
    recorder: _AutoChoices,
    emit: Callable[..., None],
) -> tuple[Callable[..., Any], int] | None:
    """Compile ``system``, check its output against eager's ``ref``, size its samples; emits ``compile``
    then ``compiled`` or ``failed``. (callable, calls per sample), or None when it failed."""
    emit(event="compile", system=system)
    recorder.active, recorder.graphs, recorder.eager = system.startswith("torchmux:"), {}, {}
    try:
        fn, out, seconds, notes = first_call(system, m, args, device, threads)
        notes = notes + recorder.eager_notes()
        ok, diff, wrong = _compare(out, ref)
        fn(*args)  # warm-up
        once = math.inf
        for _ in range(3):  # the best of three sizes the samples: one slow call made 1-call
            _sync(device)  # samples, each paying the switch from the system timed before
            t0 = time.perf_counter()
            fn(*args)
            _sync(device)
            once = min(once, time.perf_counter() - t0)
    except Exception as e:
        emit(event="failed", system=system, error=short_error(e))
        return None
    finally:
        recorder.active = False
    calls = max(1, min(1000, math.ceil(SAMPLE_SECONDS / max(once, 1e-7))))
    emit(
        event="compiled",
        system=system,
        compile_s=seconds,
        matches=ok,
        max_abs_diff=diff,
        mismatch=wrong,
        notes=notes,
        calls_per_sample=calls,
        auto_choices=(getattr(fn, "auto_choices", None) or recorder.chosen()) if system in AUTOS else None,
    )
    return fn, calls


def _warmed(system: str, fn: Callable[..., Any], args: tuple[Any, ...], emit: Callable[..., None]) -> bool:
    """The untimed warm-up calls (see above); emits ``warmed``, or ``failed`` (then False)."""
    emit(event="timing", system=system, round=-1)
    warm_until = time.perf_counter() + WARM_SECONDS
    made = 0
    try:
        while made < WARM_CALLS and (made == 0 or time.perf_counter() < warm_until):
            fn(*args)
            made += 1
    except Exception as e:
        emit(event="failed", system=system, error=f"failed while warming up: {short_error(e)}")
        return False
    emit(event="warmed", system=system, calls=made)
    return True


def _reference(m: torch.nn.Module, args: tuple[Any, ...]) -> list[torch.Tensor]:
    from .zoo import tensors_of

    return [t.detach().clone() for t in tensors_of(m(*args))]


def latency_child(
    model: str,
    systems: list[str],
    batch: int,
    device: str,
    threads: int | None,
    rounds: int,
    caches: dict[str, dict[str, str]],
    events: Path,
) -> None:
    """Compile every system on one model in this process, then time them in interleaved rounds.

    Writes JSON lines to ``events``: ``compile`` (about to compile), ``compiled`` (with compile
    seconds and the output check) or ``failed``, ``timing`` (about to time a sample), ``samples``.
    """
    emit = _events(events)
    _setup(device, threads)
    m, args = _load(model, batch, device)
    recorder = _AutoChoices.install() if any(s.startswith("torchmux:") for s in systems) else _AutoChoices()
    live: list[tuple[str, Callable[..., Any], int]] = []
    with torch.no_grad():
        ref = _reference(m, args)
        for system in systems:
            os.environ.update(caches.get(system, {}))  # this system's cache folders (read at compile time)
            ready = _prepared(system, m, args, ref, device, threads, recorder, emit)
            if ready is not None:
                live.append((system, *ready))
        live = [(system, fn, calls) for system, fn, calls in live if _warmed(system, fn, args, emit)]
        samples: dict[str, list[float]] = {s: [] for s, _, _ in live}
        shuffle = random.Random(0)
        for r in range(rounds):
            # a new order every round: no system always runs first, or always right after the same
            # other one (whose idle threads or evicted caches it would otherwise inherit)
            for system, fn, calls in shuffle.sample(live, len(live)):
                if system not in samples:
                    continue
                emit(event="timing", system=system, round=r)
                try:
                    samples[system].append(sample_seconds(fn, args, calls))
                except Exception as e:  # a system that fails only sometimes is not timed further
                    emit(event="failed", system=system, error=f"failed while timed: {short_error(e)}")
                    del samples[system]
        for system, values in samples.items():
            emit(event="samples", system=system, samples=values)
    emit(event="done")


def served_child(
    model: str, system: str, batch: int, device: str, threads: int | None, events: Path, replies: int
) -> None:
    """``--latency-processes per-system``: one system in this process, timed when the parent says.

    Compiles, checks and warms ``system`` as :func:`latency_child` does (the same events), writes
    ``ready`` (or ``failed``) to the file descriptor ``replies``, then reads standard input: each line
    ``sample R`` times one sample for round R and answers with its seconds per call; anything else, or
    the end of input, ends the process."""
    emit = _events(events)
    answer = os.fdopen(replies, "w", buffering=1)
    _setup(device, threads)
    m, args = _load(model, batch, device)
    recorder = _AutoChoices.install() if system.startswith("torchmux:") else _AutoChoices()
    with torch.no_grad():
        ready = _prepared(system, m, args, _reference(m, args), device, threads, recorder, emit)
        if ready is None or not _warmed(system, ready[0], args, emit):
            answer.write("failed\n")
            return
        fn, calls = ready
        answer.write("ready\n")
        for line in sys.stdin:
            word, *rest = line.split()
            if word != "sample":
                break
            emit(event="timing", system=system, round=int(rest[0]))
            try:
                seconds = sample_seconds(fn, args, calls)
            except Exception as e:
                emit(event="failed", system=system, error=f"failed while timed: {short_error(e)}")
                answer.write("failed\n")
                break
            answer.write(f"{seconds!r}\n")
    emit(event="done")
