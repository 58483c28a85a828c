"""The TVM backend's tuning step (``mode="max-autotune"``): MetaSchedule over the graph's fused kernels.

Tuning records live in ``TORCHMUX_CACHE_DIR/tvm/tuning/<target>/records.json``: per kernel (keyed by
the SHA-256 of its TensorIR), how many trials it had and the best schedules' traces. They are read into
a MetaSchedule ``MemoryDatabase`` before tuning and written back after, so a kernel tuned once (by any
graph, any process) is not tuned again. TVM's own JSON database is not used: with apache-tvm 0.27.0 and
apache-tvm-ffi 0.1.15, serializing a TensorIR module (``tvm.ir.save_json``) crashes the process. The
evolutionary search crashes with that pair too, so trials are drawn by random sampling (``replay-func``).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import linecache
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import tvm
from tvm import relax

from torchmux.extend import atomic_write, fetch_artifact, module_present, publish_artifact

from .build import FORMAT, cache_root, host_cores

if TYPE_CHECKING:
    from .build import BuildInfo

_log = logging.getLogger("torchmux.tvm.tuning")


def build_tuned(
    mod: tvm.IRModule, target: tvm.target.Target, device: torch.device, opts: dict[str, Any], info: BuildInfo
) -> Any:
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
            while (
                store.trials(wkey) < int(opts["tune_trials_per_task"])
                and trials_left > 0
                and time.monotonic() < deadline
            ):
                n = min(
                    int(opts["trials_per_round"]), int(opts["tune_trials_per_task"]) - store.trials(wkey), trials_left
                )
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
        self.cost_model = (
            ms.cost_model.CostModel.create(cost, num_tuning_cores=host_cores())
            if cost == "xgb"
            else ms.cost_model.CostModel.create(cost)
        )
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
            tasks=[ctx],
            task_weights=[1.0],
            work_dir=tempfile.gettempdir(),
            max_trials_global=trials,
            max_trials_per_task=trials,
            num_trials_per_iter=trials,
            builder=self.builder,
            runner=self.runner,
            database=self.database,
            cost_model=self.cost_model,
            measure_callbacks=[ms.measure_callback.AddToDatabase(), ms.measure_callback.UpdateCostModel()],
            task_scheduler="round-robin",
        )
        return len(self.database) - before == 0


def _space(target: tvm.target.Target) -> Any:
    """TVM's default design space for the target, without the two mutators whose set-up serializes the
    kernel to JSON (MutateComputeLocation, MutateParallel): that crashes with apache-tvm-ffi 0.1.15."""
    from tvm.s_tir import meta_schedule as ms

    kind = "cuda" if target.kind.name == "cuda" else "llvm"
    mutators = {
        m: p
        for m, p in ms.Mutator.create(kind).items()
        if type(m).__name__ not in ("MutateComputeLocation", "MutateParallel")
    }
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
            fetch_artifact(self.path)  # the local records, else the fleet's
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
                database.commit_tuning_record(
                    ms.database.TuningRecord(sch.trace, wl, rec["run_secs"], target, args_info)
                )
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
        atomic_write(self.path, json.dumps(self.data))
        publish_artifact(self.path)


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
            frames.append(
                inspect.FrameInfo(
                    frame, code.co_filename, lineno, code.co_name, [line] if line else None, 0 if line else None
                )
            )
            frame = frame.f_back
        return frames

    def stack(context: int = 1) -> list:
        return outer(sys._getframe(1), context)

    inspect.stack, inspect.getouterframes = stack, outer
    try:
        yield
    finally:
        inspect.stack, inspect.getouterframes = orig_stack, orig_outer
