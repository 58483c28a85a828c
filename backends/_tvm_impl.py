"""The TVM backend's work: one normalized graph in, one Relax VM function out.

:func:`compile_graph` runs these steps, in order:

1. *Key.* ``ir.fingerprint()`` + the TVM target (JSON form) + TVM's version + the tuning options name
   one artifact under ``TORCHMUX_CACHE_DIR/tvm/lib``. A hit loads the ``.so`` and skips steps 2-4.
2. *Import.* The ATen graph is wrapped in an ``nn.Module``, ``torch.export``-ed with every placeholder
   (weights included) as a user input, and read by ``tvm.relax.frontend.torch.from_exported_program``.
   (``from_fx`` does not know ATen overloads such as ``aten.mm.default``; the export route does.)
   ``FuseTransposeMatmul`` then makes ``x @ w.T`` (every ``nn.Linear``) one kernel that reads ``w`` as
   it is, instead of a transpose copy and a matmul that walks it across rows (5x faster untuned).
3. *Build.* ``tvm.compile`` with TVM's default pipeline: LLVM on the CPU (no BLAS: matmuls stay
   unscheduled loops), dlight GPU schedules for CUDA. In ``mode="max-autotune"`` MetaSchedule first
   tunes the graph's fused kernels (:mod:`tuning below <compile_graph>`), then the graph is built with
   the best schedules found.
4. *Store.* ``export_library`` writes the ``.so``; a JSON file beside it holds the metadata. Both are
   written to temporary names and renamed, so a reader never sees half an artifact.
5. *Run.* The Relax VM's ``main`` is called with the inputs as TVM tensors made by DLPack (no copy,
   no NumPy), and its outputs become torch tensors by DLPack again.

Weights are arguments, not constants: the artifact depends only on the graph's structure and specs
(what the fingerprint covers), so one cached library serves every set of weights.

Tuning records live in ``TORCHMUX_CACHE_DIR/tvm/tuning/<target>/records.json``: per kernel (keyed by
the SHA-256 of its TensorIR), how many trials it had and the best schedules' traces. They are read into
a MetaSchedule ``MemoryDatabase`` before tuning and written back after, so a kernel tuned once (by any
graph, any process) is not tuned again. TVM's own JSON database is not used: with apache-tvm 0.27.0 and
apache-tvm-ffi 0.1.15, serializing a TensorIR module (``tvm.ir.save_json``) crashes the process.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import json
import linecache
import logging
import os
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import tvm
from tvm import relax

import torchmux
from torchmux.core import settings
from torchmux.core.backend import module_present

FORMAT = 2  # bump when the artifact layout or the import route changes: old artifacts are then ignored

DEFAULTS: dict[str, Any] = {
    "tune_seconds": 120.0,
    "tune_trials": 512,
    "tune_trials_per_task": 64,
    "trials_per_round": 16,
    "target": None,
    "cache": True,
}
TUNING_OPTIONS = ("tune_seconds", "tune_trials", "tune_trials_per_task", "trials_per_round")
_log = logging.getLogger("torchmux.tvm")


@dataclass
class BuildInfo:
    """What happened when a graph was compiled; the compiled callable carries it as ``.tvm_info``."""

    key: str
    target: str
    cache: str  # "hit", "miss" (built and stored), "off" or "unwritable"
    tuned: bool = False
    tasks: int = 0  # kernels MetaSchedule saw
    tasks_tuned: int = 0  # kernels tuned in this call
    tasks_reused: int = 0  # kernels whose records were already in the database
    trials: int = 0  # trials measured in this call
    tune_seconds: float = 0.0
    build_seconds: float = 0.0
    library: str = ""


# ------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------


def compile_graph(request: torchmux.CompileRequest) -> torchmux.CompiledGraph:
    ir, opts = request.ir, _options(request.options)
    if not ir.is_static:
        raise ValueError(f"{ir.name}: tvm builds graphs with static shapes only; compile with dynamic=False")
    device = _device_of(request.example_inputs)
    target = target_for(device, opts["target"])
    tuned = request.mode in ("max-autotune", "max-autotune-no-cudagraphs")
    key = artifact_key(ir.fingerprint(), target, {k: opts[k] for k in TUNING_OPTIONS} if tuned else None)
    info = BuildInfo(key=key, target=str(target), cache="off", tuned=tuned)
    lib_dir = cache_root() / "lib"

    executable = _load(lib_dir, key) if opts["cache"] else None
    if executable is not None:
        info.cache = "hit"
        info.library = str(lib_dir / f"{key}.so")
    else:
        t0 = time.perf_counter()
        mod = relax.transform.FuseTransposeMatmul()(to_relax(ir, request.example_inputs))
        if tuned:
            executable = build_tuned(mod, target, device, opts, info)
        else:
            executable = tvm.compile(mod, target=target)
        info.build_seconds = time.perf_counter() - t0
        if opts["cache"]:
            info.cache = _store(lib_dir, key, executable, ir, info)
    return _runner(executable, device, info, len(ir.outputs))


def _options(given: Any) -> dict[str, Any]:
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown tvm option(s) {unknown}; the tvm backend accepts "
            + ", ".join(f"{k} (default {v!r})" for k, v in DEFAULTS.items())
        )
    return {**DEFAULTS, **given}


def _device_of(inputs: Sequence[Any]) -> torch.device:
    devices = {t.device for t in inputs if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"tvm runs a graph on one device; its inputs are on {sorted(map(str, devices))}")
    bad = [type(t).__name__ for t in inputs if not isinstance(t, torch.Tensor)]
    if bad:
        raise ValueError(f"tvm takes tensor inputs only; this graph also takes {bad} (symbolic shapes are not supported)")
    return devices.pop() if devices else torch.device("cpu")


# ------------------------------------------------------------------------------------------------
# targets and keys
# ------------------------------------------------------------------------------------------------


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def target_for(device: torch.device, override: Any = None) -> tvm.target.Target:
    """The host CPU (its LLVM cpu name and core count), or the GPU's CUDA arch with the CPU as host."""
    if override:
        return tvm.target.Target(override)
    cpu: dict[str, Any] = {"kind": "llvm", "num-cores": host_cores()}
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    if mcpu and mcpu != "generic":
        cpu["mcpu"] = mcpu
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}"}, host=cpu)
    return tvm.target.Target(cpu)


def artifact_key(fingerprint: str, target: tvm.target.Target, tuning: dict[str, Any] | None) -> str:
    parts = [f"format={FORMAT}", fingerprint, str(target), f"tvm={tvm.__version__}", f"tuning={json.dumps(tuning, sort_keys=True)}"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def cache_root() -> Path:
    return Path(settings.CACHE_DIR.get()) / "tvm"


# ------------------------------------------------------------------------------------------------
# import: ATen graph -> Relax
# ------------------------------------------------------------------------------------------------


class _AtenProgram(torch.nn.Module):
    """The normalized graph as a module whose every input (weights too) is a user input."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__()
        self.gm = gm

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.gm(*args))


def to_relax(ir: torchmux.GraphIR, example_inputs: Sequence[torch.Tensor]) -> tvm.IRModule:
    from tvm.relax.frontend.torch import from_exported_program

    args = tuple(t.detach().contiguous() for t in example_inputs)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's and TVM's deprecation notices
        program = torch.export.export(_AtenProgram(_without_empty_cat_inputs(ir.gm)), args, strict=False)
        return from_exported_program(program, custom_convert_map=_EXTRA_CONVERTERS)


def _without_empty_cat_inputs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``aten.cat`` skips 1-D empty tensors whatever the other inputs' rank (a legacy rule that an empty
    KV cache relies on, in GPT-2); TVM's concat refuses mixed ranks. A copy of ``gm`` without them."""

    def legacy_empty(a: Any) -> bool:
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        return isinstance(val, torch.Tensor) and val.dim() == 1 and val.numel() == 0

    cats = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.cat.default
            and any(legacy_empty(a) for a in n.args[0]) and not all(legacy_empty(a) for a in n.args[0])]
    if not cats:
        return gm
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.cat.default:
            kept = [a for a in node.args[0] if not legacy_empty(a)]
            if kept and len(kept) < len(node.args[0]):
                node.args = (kept, *node.args[1:])
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _reduction(op_name: str) -> Any:
    """A converter for a Core ATen reduction TVM's frontend lacks: ``op(x, dims=[], keepdim=False)``."""

    def convert(node: torch.fx.Node, importer: Any) -> relax.Var:
        args = importer.retrieve_args(node)
        x = args[0]
        dims = args[1] if len(args) > 1 else node.kwargs.get("dim", None)
        if isinstance(dims, int):
            dims = [dims]
        if isinstance(dims, (list, tuple)) and len(dims) == 0:
            dims = None  # an empty list means every dimension
        keepdim = bool(args[2] if len(args) > 2 else node.kwargs.get("keepdim", False))
        return importer.block_builder.emit(getattr(relax.op, op_name)(x, dims, keepdim))

    return convert


# ATen reductions missing from TVM 0.27's PyTorch frontend (prod only without a dtype argument)
_EXTRA_CONVERTERS = {"amax.default": _reduction("max"), "amin.default": _reduction("min"), "prod.dim_int": _reduction("prod")}


# ------------------------------------------------------------------------------------------------
# the on-disk cache of built libraries
# ------------------------------------------------------------------------------------------------


def _load(lib_dir: Path, key: str) -> Any | None:
    so, meta = lib_dir / f"{key}.so", lib_dir / f"{key}.json"
    if not (so.exists() and meta.exists()):
        return None
    try:
        if json.loads(meta.read_text()).get("format") != FORMAT:
            return None
        return tvm.runtime.load_module(str(so))
    except Exception as e:  # a damaged artifact is rebuilt, never trusted
        _log.warning("tvm: ignoring cached library %s (%s); rebuilding", so, e)
        return None


def _store(lib_dir: Path, key: str, executable: Any, ir: torchmux.GraphIR, info: BuildInfo) -> str:
    try:
        lib_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib_dir)
        os.close(fd)
        executable.export_library(tmp)
        os.replace(tmp, lib_dir / f"{key}.so")
        info.library = str(lib_dir / f"{key}.so")
        meta = {
            "format": FORMAT,
            "graph": ir.name,
            "fingerprint": ir.fingerprint(),
            "tvm": tvm.__version__,
            "inputs": [s.short() if s else "?" for s in ir.input_specs],
            "outputs": [s.short() if s else "?" for s in ir.output_specs],
            "created": time.time(),
            **{k: v for k, v in asdict(info).items() if k not in ("cache", "library")},
        }
        _atomic_write(lib_dir / f"{key}.json", json.dumps(meta, indent=1))
        return "miss"
    except Exception as e:  # no C compiler, read-only disk...: run from memory, say why once
        with contextlib.suppress(Exception):
            os.unlink(tmp)  # type: ignore[possibly-undefined]
        _log.warning("tvm: could not cache the library for %s under %s (%s: %s); it works from memory",
                     ir.name, lib_dir, type(e).__name__, e)
        return "unwritable"


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# the hot path: Relax VM, tensors through DLPack
# ------------------------------------------------------------------------------------------------


def _runner(executable: Any, device: torch.device, info: BuildInfo, n_outputs: int) -> torchmux.CompiledGraph:
    dev = tvm.cuda(device.index or 0) if device.type == "cuda" else tvm.cpu(0)
    main = relax.VirtualMachine(executable, dev)["main"]
    to_tvm, to_torch = tvm.runtime.from_dlpack, torch.from_dlpack
    lock = threading.Lock()  # one VM, one call at a time

    def run(*args: torch.Tensor) -> list[torch.Tensor]:
        # TVM takes compact tensors only; contiguous() is free for the usual (already compact) input
        tvm_args = [to_tvm(a if a.is_contiguous() else a.contiguous()) for a in args]
        with lock:
            outs = main(*tvm_args)
        if len(outs) != n_outputs:
            raise RuntimeError(f"tvm returned {len(outs)} outputs, the graph has {n_outputs}")
        return [to_torch(o) for o in outs]

    run.tvm_info = info  # type: ignore[attr-defined]
    return run


# ------------------------------------------------------------------------------------------------
# MetaSchedule tuning (mode="max-autotune")
# ------------------------------------------------------------------------------------------------


def build_tuned(mod: tvm.IRModule, target: tvm.target.Target, device: torch.device, opts: dict[str, Any], info: BuildInfo) -> Any:
    """Tune the graph's kernels within the budget, then build it with the best schedules known."""
    from tvm.s_tir import meta_schedule as ms

    with _fast_frame_introspection():  # MetaSchedule's schedule rules need TVM's tensor intrinsics
        import tvm.s_tir.tensor_intrin  # noqa: F401

    t0 = time.perf_counter()
    deadline = time.monotonic() + float(opts["tune_seconds"])
    store = RecordStore(cache_root() / "tuning" / hashlib.sha256(str(target).encode()).hexdigest()[:16])
    database = ms.database.MemoryDatabase()
    tasks = ms.relax_integration.extract_tasks(_fused(mod, target), target)
    info.tasks = len(tasks)

    pending = []
    for task in tasks:
        workload = task.dispatched[0]
        wkey = store.key(workload)
        store.load_into(database, wkey, workload, target)
        if store.trials(wkey) >= int(opts["tune_trials_per_task"]):
            info.tasks_reused += 1
            continue
        flops = _flops(workload) * float(task.weight)
        pending.append((flops, task, wkey))
    pending.sort(key=lambda p: -p[0])  # the budget goes to the heaviest kernels first

    if pending:
        tuner = _Tuner(target, device, database)
        trials_left = int(opts["tune_trials"])
        for _, task, wkey in pending:
            tuned_here = 0
            while store.trials(wkey) < int(opts["tune_trials_per_task"]) and trials_left > 0 and time.monotonic() < deadline:
                n = min(int(opts["trials_per_round"]), int(opts["tune_trials_per_task"]) - store.trials(wkey), trials_left)
                exhausted = tuner.tune(task, n)
                store.add(wkey, task, n if not exhausted else int(opts["tune_trials_per_task"]), database, target)
                trials_left -= n
                info.trials += n
                tuned_here += n
                if exhausted:  # the search space has no more candidates: the task is done
                    break
            info.tasks_tuned += tuned_here > 0
        store.save()
    info.tune_seconds = time.perf_counter() - t0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ms.relax_integration.compile_relax(database, mod, target, params=None)


def _fused(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """The graph after legalization and fusion: its TensorIR functions are the tuning tasks. The same
    passes as ``compile_relax`` runs before it applies the database, so the kernels match."""
    from tvm.relax import pipeline

    passes = pipeline.library_dispatch_passes(target) + [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    with target:
        return tvm.transform.Sequential(passes)(mod)


def _flops(workload: tvm.IRModule) -> float:
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(workload))
    except Exception:  # opaque kernels: tune them last
        return 0.0


class _Tuner:
    """Runs MetaSchedule on one task at a time, building and timing candidates in this process.

    TVM's LocalBuilder/LocalRunner start worker processes (and need cloudpickle); on a small CPU the
    process start-up costs more than the trials. Candidates here are built with ``tvm.build`` and timed
    with ``time_evaluator`` in-process.
    """

    def __init__(self, target: tvm.target.Target, device: torch.device, database: Any) -> None:
        from tvm.s_tir import meta_schedule as ms

        self.ms, self.target, self.database = ms, target, database
        self.builder = _in_process_builder()
        self.runner = _in_process_runner(self.builder, "cuda" if device.type == "cuda" else "cpu")
        cost = "xgb" if module_present("xgboost") else "random"
        self.cost_model = ms.cost_model.CostModel.create(cost, num_tuning_cores=host_cores()) if cost == "xgb" else ms.cost_model.CostModel.create(cost)
        self.logger = logging.getLogger("torchmux.tvm.tuning")

    def tune(self, task: Any, trials: int) -> bool:
        """Measure up to ``trials`` candidates for ``task``; True if the search ran out of candidates."""
        ms = self.ms
        before = len(self.database)
        ctx = ms.TuneContext(
            mod=task.dispatched[0],
            target=task.target,
            space_generator=_space(task.target),
            # random sampling of the design space: EvolutionarySearch and ReplayTrace copy the kernel
            # through JSON, which crashes with apache-tvm-ffi 0.1.15 (and without xgboost the
            # evolution's cost model would be random anyway)
            search_strategy="replay-func",
            task_name=task.task_name,
            num_threads=host_cores(),
            logger=self.logger,
        )
        ms.tune_tasks(
            tasks=[ctx], task_weights=[1.0], work_dir=tempfile.gettempdir(),
            max_trials_global=trials, max_trials_per_task=trials, num_trials_per_iter=trials,
            builder=self.builder, runner=self.runner, database=self.database, cost_model=self.cost_model,
            measure_callbacks=[ms.measure_callback.AddToDatabase(), ms.measure_callback.UpdateCostModel()],
            task_scheduler="round-robin",
        )
        return len(self.database) - before == 0


def _space(target: tvm.target.Target) -> Any:
    """TVM's default design space for the target, without the two mutators whose set-up serializes the
    kernel to JSON (MutateComputeLocation, MutateParallel): that crashes with apache-tvm-ffi 0.1.15."""
    from tvm.s_tir import meta_schedule as ms

    kind = "cuda" if target.kind.name == "cuda" else "llvm"
    mutators = {m: p for m, p in ms.Mutator.create(kind).items()
                if type(m).__name__ not in ("MutateComputeLocation", "MutateParallel")}
    return ms.space_generator.PostOrderApply(sch_rules=kind, postprocs=kind, mutator_probs=mutators)


def _in_process_builder() -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    @derived_object
    class InProcessBuilder(PyBuilder):
        def __init__(self) -> None:
            super().__init__()
            self.built: dict[str, Any] = {}
            self.count = 0

        def build(self, build_inputs: list) -> list:
            results = []
            for b in build_inputs:
                try:
                    self.count += 1
                    name = f"torchmux-in-memory-{self.count}"
                    self.built[name] = default_build(b.mod, b.target, None)
                    results.append(BuilderResult(name, None))
                except Exception as e:  # a candidate that does not build is a failed trial
                    results.append(BuilderResult(None, f"{type(e).__name__}: {e}"))
            return results

    return InProcessBuilder()


def _in_process_runner(builder: Any, device_type: str) -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner, PyRunnerFuture, RunnerResult
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common, run_evaluator_common

    @derived_object
    class Done(PyRunnerFuture):
        def __init__(self, result: Any) -> None:
            super().__init__()
            self.res = result

        def done(self) -> bool:
            return True

        def result(self) -> Any:
            return self.res

    fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")
    config = EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False)

    @derived_object
    class InProcessRunner(PyRunner):
        def run(self, runner_inputs: list) -> list:
            futures = []
            for r in runner_inputs:
                module = builder.built.pop(str(r.artifact_path), None)
                try:
                    dev = tvm.runtime.device(device_type, 0)
                    args = alloc_argument_common(fill, dev, [a.as_json() for a in r.args_info], 1)
                    futures.append(Done(RunnerResult(run_evaluator_common(module, dev, config, args), None)))
                except Exception as e:  # a candidate that crashes is a failed trial
                    futures.append(Done(RunnerResult(None, f"{type(e).__name__}: {e}")))
            return futures

    return InProcessRunner()


class RecordStore:
    """Tuning records on disk, one JSON file per target: per kernel, the trials it had and the traces of
    its best schedules. Keys are the SHA-256 of the kernel's TensorIR text (stable across processes)."""

    KEEP = 4  # best records kept per kernel

    def __init__(self, directory: Path) -> None:
        self.path = directory / "records.json"
        self.data: dict[str, Any] = {"format": FORMAT, "tvm": tvm.__version__, "workloads": {}}
        with contextlib.suppress(FileNotFoundError, ValueError):
            loaded = json.loads(self.path.read_text())
            if loaded.get("format") == FORMAT and loaded.get("tvm") == tvm.__version__:
                self.data = loaded

    @staticmethod
    def key(workload: tvm.IRModule) -> str:
        return hashlib.sha256(workload.script().encode()).hexdigest()[:24]

    def trials(self, wkey: str) -> int:
        return int(self.data["workloads"].get(wkey, {}).get("trials", 0))

    def load_into(self, database: Any, wkey: str, workload: tvm.IRModule, target: tvm.target.Target) -> int:
        """Commit this kernel's stored records to ``database``; returns how many applied."""
        from tvm import s_tir
        from tvm.s_tir import meta_schedule as ms

        entry = self.data["workloads"].get(wkey)
        if not entry or not entry.get("records"):
            return 0
        wl = database.commit_workload(workload)
        args_info = ms.arg_info.ArgInfo.from_prim_func(workload["main"])
        n = 0
        for rec in entry["records"]:
            try:
                sch = s_tir.Schedule(workload)
                s_tir.Trace.apply_json_to_schedule(rec["trace"], sch)
                database.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, rec["run_secs"], target, args_info))
                n += 1
            except Exception as e:  # a record that no longer applies (TVM changed) is dropped
                _log.info("tvm: dropping a tuning record of %s: %s", wkey, e)
        return n

    def add(self, wkey: str, task: Any, trials: int, database: Any, target: tvm.target.Target) -> None:
        workload = task.dispatched[0]
        entry = self.data["workloads"].setdefault(wkey, {"task": task.task_name, "trials": 0, "records": []})
        entry["trials"] += trials
        if database.has_workload(workload):
            best = database.get_top_k(database.commit_workload(workload), self.KEEP)
            entry["records"] = [
                {"trace": _plain(r.trace.as_json(remove_postproc=False)), "run_secs": [float(s) for s in r.run_secs]}
                for r in best
            ]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path, json.dumps(self.data))


def _plain(obj: Any) -> Any:
    """A trace's JSON form with TVM's boxed values (IntImm, FloatImm, String, Array, Map) as Python's."""
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or hasattr(obj, "__len__") and not hasattr(obj, "value"):
        return [_plain(v) for v in obj]
    if hasattr(obj, "value"):  # IntImm, FloatImm
        return obj.value
    return str(obj)


@contextlib.contextmanager
def _fast_frame_introspection() -> Iterator[None]:
    """Make ``inspect.stack``/``getouterframes`` cheap while TVM parses TVMScript.

    TVMScript's ``@T.prim_func`` calls ``inspect.stack()``, which looks up the module of every frame by
    scanning ``sys.modules``; with torch imported (thousands of modules) importing TVM's tensor
    intrinsics took minutes. Here source lines come from ``linecache`` directly.
    """
    orig_stack, orig_outer = inspect.stack, inspect.getouterframes

    def outer(frame: Any, context: int = 1) -> list:
        frames = []
        while frame is not None:
            code, lineno = frame.f_code, frame.f_lineno
            line = linecache.getline(code.co_filename, lineno, frame.f_globals) if context > 0 else ""
            frames.append(inspect.FrameInfo(frame, code.co_filename, lineno, code.co_name,
                                            [line] if line else None, 0 if line else None))
            frame = frame.f_back
        return frames

    def stack(context: int = 1) -> list:
        return outer(sys._getframe(1), context)

    inspect.stack, inspect.getouterframes = stack, outer  # type: ignore[assignment]
    try:
        yield
    finally:
        inspect.stack, inspect.getouterframes = orig_stack, orig_outer  # type: ignore[assignment]
