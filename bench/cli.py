"""``torchmux bench``: the model zoo, every system side by side, on this machine.

Systems: ``eager`` (the model as written), ``inductor`` (``torch.compile``'s default), one
``torchmux:<backend>`` per torchmux backend that can run here (each alone), and ``torchmux:auto``
(every backend competing per graph). For each model of the zoo (bench/zoo.py) the bench runs:

1. per system, a **cold** child process with empty compile caches (TORCHMUX_CACHE_DIR,
   TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR in a folder of its own): compile time of a first use,
   and the process's peak memory;
2. per system, a **warm** child process on the same, now hot, caches: compile time of a later run;
3. one **latency** child process that compiles every system (warm), checks each output against
   eager's, and times all of them in interleaved rounds, in a new order every round, so that the
   machine's noise hits every system alike and the ratios hold. With ``--latency-processes
   per-system``, one latency process per system instead, all alive and driven through the same
   rounds (:func:`latency_run_per_system`): what a program that uses one system sees, with no other
   system's thread pools, memory arenas or compiled code in its process.

Children run one at a time: bench_run.py says what each measures, bench_results.py turns their
results into rows, bench_report.py into tables and a chart. A system that fails, answers wrong,
crashes its process or runs past ``--timeout`` is reported as such; the bench goes on. The results go
to the terminal, ``bench.json`` (rewritten after each model) and ``bench.png`` in ``--out``.

``--workload varying-shapes`` runs another workload instead: each model called with ``--calls`` sizes
drawn from ``--seed``, total time including every compile, against torch.compile on the same sequence
(bench/varying.py says what it measures).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .results import MEASURES, assemble, geomeans
from .run import (
    AOTI,
    AUTO,
    AUTO_SPLIT,
    EAGER,
    EXPORT,
    EXPORT_AUTO,
    INDUCTOR,
    INDUCTOR_CUDAGRAPHS,
    INDUCTOR_FREEZING,
    ONNX_EXPORT,
    THREAD_ENV,
    TVM_EXPORT,
    WARM_CALLS,
    WARM_SECONDS,
)
from .varying import MODELS as VARYING_MODELS
from .zoo import ZOO


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or comma-separated numbers (1,2), got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers of at least 1, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchmux bench",
        description="Benchmark the model zoo (random weights, no downloads) across eager, torch.compile "
        "(Inductor), each torchmux backend alone, and torchmux auto.",
    )
    p.add_argument(
        "--models",
        default=None,
        help=f"comma-separated zoo models, or 'all' (the zoo: {', '.join(ZOO)}); default: all, "
        f"and {','.join(VARYING_MODELS)} for --workload varying-shapes",
    )
    p.add_argument(
        "--workload",
        default="zoo",
        choices=["zoo", "varying-shapes"],
        help="zoo: compile, warm compile and latency at one batch size (default); varying-shapes: each "
        "model called with --calls sizes, total time including every compile, against torch.compile",
    )
    p.add_argument(
        "--calls", type=int, default=50, help="varying-shapes: how many calls (sizes) per model (default 50)"
    )
    p.add_argument(
        "--seed", type=int, default=13, help="varying-shapes: the seed the sizes are drawn from (default 13)"
    )
    p.add_argument(
        "--batch-size",
        type=_ints,
        default=[8],
        help="batch size of every model's inputs; a list (1,8) runs the bench once per size (default 8)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where models run (default cpu)")
    p.add_argument(
        "--threads",
        type=_ints,
        default=None,
        help="torch (and OpenMP, ONNX Runtime) threads per process; a list (1,2) runs the bench once per "
        "count, and once per batch size (default: torch's)",
    )
    p.add_argument(
        "--systems",
        default="default",
        help="comma-separated systems: eager, inductor (torch.compile), inductor-freezing, inductor-reduce-overhead (CUDA), "
        "onnxruntime-export, aoti, tvm-export (CPU: TVM used directly, untuned; not in the default set), auto (torchmux:auto), "
        "auto-split (auto that may also split a graph across backends, options split=4), "
        "torchmux:<backend> or a backend name; 'default' is every one that runs here. "
        "eager is always included: speedups are measured against it",
    )
    p.add_argument("--rounds", type=int, default=20, help="timing rounds, each times every system once (default 20)")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for bench.json, bench.png and logs")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one child process may run (default 900)")
    p.add_argument("--no-warm", action="store_true", help="skip the warm-compile processes (halves the compile work)")
    p.add_argument(
        "--latency-only",
        action="store_true",
        help="skip the cold and warm compile processes: latency, speedups and output checks only, "
        "one process per model (no memory figures; compile time only as measured in that process)",
    )
    p.add_argument(
        "--latency-processes",
        default="shared",
        choices=["shared", "per-system"],
        help="shared: every system of a model timed in one process (default); per-system: each in a process "
        "of its own, all alive, driven through the same interleaved rounds (what a program that uses "
        "one system sees: no other system's thread pools, arenas or compiled code beside it)",
    )
    p.add_argument(
        "--processes-per-system",
        type=int,
        default=1,
        metavar="K",
        help="with --latency-processes per-system: K processes for each system, each compiled on its own and "
        "all driven through the same rounds; a system's samples are pooled over its K processes (where a "
        "process lands in memory moves one library's latency by 5-15%% here: K=3 averages that out)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--from-json",
        type=Path,
        metavar="BENCH_JSON",
        help="run nothing: print the tables of an earlier bench.json and redraw its chart next to it",
    )
    # the child side (bench_run.py); not for users
    p.add_argument("--_child", choices=["compile", "latency", "served", "varying"], help=argparse.SUPPRESS)
    p.add_argument("--_replies", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--_caches", help=argparse.SUPPRESS)
    return p


class BenchArgumentError(ValueError):
    """A bad command-line value; the message says which and what is accepted."""


# ------------------------------------------------------------------------------------------ choosing
def parse_models(spec: str) -> list[str]:
    names = list(ZOO) if spec.strip() in ("", "all") else [m.strip() for m in spec.split(",") if m.strip()]
    unknown = [m for m in names if m not in ZOO]
    if unknown:
        raise BenchArgumentError(
            f"--models: {', '.join(repr(m) for m in unknown)} not in the zoo; choose from "
            + ", ".join(f"{k} ({v.description})" for k, v in ZOO.items())
            + ", or 'all'"
        )
    return list(dict.fromkeys(names))


def resolve_systems(spec: str, device: str) -> tuple[list[str], dict[str, str]]:
    """(systems to run, systems left out -> why). eager is always first; auto last."""
    from ..core.registry import get_registry

    registry = get_registry()
    runnable: dict[str, str] = {}  # torchmux backend -> "" or why it cannot run here
    by_default: set[str] = set()
    for name in registry.names:
        backend, avail = registry.get(name), registry.availability(name)
        if not avail.ok:
            runnable[name] = avail.reason
        elif not backend.supports_device(device):
            runnable[name] = f"does not run on {device} (runs on {', '.join(backend.devices)})"
        else:
            runnable[name] = ""
            # a backend auto would not pick here (an interpreter, such as triton without a GPU) is no speed contender
            if name != "eager" and getattr(backend, "auto", True):
                by_default.add(name)
    skipped: dict[str, str] = {}
    if spec.strip() in ("", "default", "all"):
        outside = [INDUCTOR_FREEZING] + ([ONNX_EXPORT] if device == "cpu" and runnable.get("onnxruntime") == "" else [])
        outside += [INDUCTOR_CUDAGRAPHS] if device == "cuda" else []
        outside.append(AOTI)
        own = [f"torchmux:{n}" for n in registry.names if n in by_default]
        wanted = [EAGER, INDUCTOR] + outside + own + [EXPORT_AUTO, AUTO]
        for n, why in runnable.items():
            if n != "eager" and n not in by_default:
                skipped[f"torchmux:{n}"] = (
                    why or "auto never picks it here (e.g. an interpreter); name it in --systems to run it"
                )
    else:
        wanted = []
        for item in (s.strip() for s in spec.split(",") if s.strip()):
            name = {"auto": AUTO, "auto-split": AUTO_SPLIT, "torch.compile": INDUCTOR}.get(item, item)
            if name == INDUCTOR_CUDAGRAPHS and device != "cuda":
                skipped[name] = f"CUDA graphs need --device cuda (on {device} it is {INDUCTOR})"
                continue
            if name == TVM_EXPORT and (device != "cpu" or runnable.get("tvm", "not installed")):
                skipped[name] = (
                    f"TVM used directly runs on the CPU here (not {device})"
                    if device != "cpu"
                    else f"TVM cannot run here: {runnable.get('tvm', 'not installed')}"
                )
                continue
            if name in (AUTO_SPLIT, INDUCTOR_FREEZING, INDUCTOR_CUDAGRAPHS, ONNX_EXPORT, AOTI, TVM_EXPORT):
                wanted.append(name)
                continue
            if name.startswith(EXPORT):  # torchmux-export:<backend> or torchmux-export:auto
                target = name.removeprefix(EXPORT)
                if target != "auto" and target not in runnable:
                    raise BenchArgumentError(
                        f"--systems: {item!r}: {target!r} is no backend; choose from auto, " + ", ".join(registry.names)
                    )
                if target != "auto" and runnable[target]:
                    skipped[name] = runnable[target]
                else:
                    wanted.append(name)
                continue
            if name not in (EAGER, INDUCTOR, AUTO) and not name.startswith("torchmux:"):
                name = f"torchmux:{name}"
            chosen = name.split(":", 1)[1] if name.startswith("torchmux:") else None
            if chosen is not None and chosen != "auto" and chosen not in runnable:
                raise BenchArgumentError(
                    f"--systems: {item!r} is not a system; choose from eager, inductor, {INDUCTOR_FREEZING}, {INDUCTOR_CUDAGRAPHS}, {ONNX_EXPORT}, {AOTI}, {TVM_EXPORT}, auto, "
                    + ", ".join(f"torchmux:{n}" for n in registry.names)
                    + " (or 'default')"
                )
            if chosen in runnable and runnable[chosen]:
                skipped[name] = runnable[chosen]
            else:
                wanted.append(name)
        wanted = [EAGER] + [s for s in wanted if s != EAGER]
    return list(dict.fromkeys(wanted)), skipped


# ------------------------------------------------------------------------------------------ children
def _child_command(
    kind: str, model: str, systems: list[str], args: argparse.Namespace, result: Path, caches: Path | None
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "torchmux.bench.cli",
        "--_child",
        kind,
        "--models",
        model,
        "--systems",
        ",".join(systems),
        "--batch-size",
        str(args.batch_size),
        "--device",
        args.device,
        "--rounds",
        str(args.rounds),
        "--_result",
        str(result),
    ]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if caches is not None:
        cmd += ["--_caches", str(caches)]
    return cmd


def _run(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> str | None:
    """Run a child to its end; None if it exited 0, else what went wrong (exit status, signal, timeout)."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: it and its compile workers
            proc.wait()
            if isinstance(e, KeyboardInterrupt):
                raise
            return f"timed out after {timeout:.0f} s (--timeout)"
    return _exit_reason(rc)


def _exit_reason(rc: int) -> str | None:
    if rc == 0:
        return None
    if rc < 0:
        return f"the process died of signal {signal.Signals(-rc).name}"
    return f"the process exited with status {rc}"


def _log_tail(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (errors or lines or ["(no output)"])[-1][:400]


def _env(args: argparse.Namespace, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, **extra)
    if args.threads:
        env.update({k: str(args.threads) for k in THREAD_ENV})
    return env


def compile_run(
    model: str, system: str, args: argparse.Namespace, cache: Path, work: Path, label: str
) -> dict[str, Any]:
    from .run import cache_env

    result = work / f"{model}.{system.replace(':', '-')}.{label}.json"
    log = args.out / "logs" / f"{model}.{system.replace(':', '-')}.{label}.log"
    t0 = time.perf_counter()
    why = _run(
        _child_command("compile", model, [system], args, result, None), _env(args, cache_env(cache)), log, args.timeout
    )
    if why is None and result.exists():
        return {**json.loads(result.read_text()), "process_s": time.perf_counter() - t0}
    if why is None:
        why = "the process wrote no result"
    return {"ok": False, "error": f"{why}: {_log_tail(log)}" if "timed out" not in why else why, "log": str(log)}


def latency_run(
    model: str, systems: list[str], args: argparse.Namespace, caches: dict[str, Path], work: Path
) -> dict[str, Any]:
    """The interleaved timing of ``systems`` on ``model``. A system whose failure kills the process is
    marked failed and the others are run again without it."""
    from .run import cache_env

    found: dict[str, dict[str, Any]] = {}
    remaining = list(systems)
    attempt = 0
    while remaining:
        attempt += 1
        events = work / f"{model}.latency.{attempt}.jsonl"
        cache_file = work / f"{model}.caches.json"
        cache_file.write_text(json.dumps({s: cache_env(caches[s]) for s in remaining if s in caches}))
        log = args.out / "logs" / f"{model}.latency.{attempt}.log"
        why = _run(
            _child_command("latency", model, remaining, args, events, cache_file),
            _env(args, {}),
            log,
            args.timeout * len(remaining),
        )
        lines = [json.loads(ln) for ln in events.read_text().splitlines()] if events.exists() else []
        for ev in lines:
            if ev["event"] in ("compiled", "failed"):
                found[ev["system"]] = dict(ev)
            elif ev["event"] == "warmed":
                found[ev["system"]]["warm_up_calls"] = ev["calls"]
            elif ev["event"] == "samples":
                found[ev["system"]]["samples"] = ev["samples"]
        if lines and lines[-1]["event"] == "done":
            break
        busy = [ev for ev in lines if ev["event"] in ("compile", "timing")]
        if not busy:  # died before any system ran: building the model failed
            return {"error": f"{why or 'no result'}: {_log_tail(log)}"}
        culprit, stage = busy[-1]["system"], "compiling" if busy[-1]["event"] == "compile" else "timing"
        found[culprit] = {
            "event": "failed",
            "error": f"{why or 'the process ended early'} while {stage} it: {_log_tail(log)}",
        }
        remaining = [s for s in remaining if s != culprit and found.get(s, {}).get("event") != "failed"]
    return {"systems": found}


class _Served:
    """One system's latency process in ``--latency-processes per-system`` (run.served_child): started,
    then told ``sample R`` on its standard input; it answers on a pipe of its own (its standard output
    and error go to its log, where a backend's prints cannot be taken for an answer)."""

    def __init__(
        self, model: str, system: str, args: argparse.Namespace, cache: Path | None, work: Path, replica: int = 0
    ) -> None:
        from .run import cache_env

        label = f"{model}.{system.replace(':', '-')}.latency" + (f".{replica + 1}" if replica else "")
        self.events, self.log = work / f"{label}.jsonl", args.out / "logs" / f"{label}.log"
        read, write = os.pipe()
        cmd = _child_command("served", model, [system], args, self.events, None) + ["--_replies", str(write)]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_env(args, cache_env(cache) if cache is not None else {}),
                start_new_session=True,
                pass_fds=(write,),
                text=True,
            )
        os.close(write)
        self._replies = os.fdopen(read, "r")

    def ask(self, line: str | None, timeout: float) -> str:
        """Send ``line`` (if any) and wait at most ``timeout`` s for the answer: ``ready``, ``failed``, a
        sample's seconds, or why there was none (``died: `` and the exit status, signal or timeout)."""
        try:
            if line is not None:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            ready, _, _ = select.select([self._replies], [], [], timeout)
            answer = self._replies.readline().strip() if ready else None
        except (BrokenPipeError, OSError):
            answer = ""
        if answer:
            return answer
        if answer is None:  # the caller stops it
            return f"died: timed out after {timeout:.0f} s (--timeout)"
        rc = self.proc.wait()
        return f"died: {_exit_reason(rc) or 'the process ended early'}"

    def found(self) -> dict[str, Any]:
        """What its events say: the ``compiled`` (or ``failed``) event, with ``warm_up_calls``."""
        row: dict[str, Any] = {}
        lines = [json.loads(ln) for ln in self.events.read_text().splitlines()] if self.events.exists() else []
        for ev in lines:
            if ev["event"] in ("compiled", "failed"):
                row = {**row, **ev}
            elif ev["event"] == "warmed":
                row["warm_up_calls"] = ev["calls"]
        return row

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # the end of its input: it exits
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its process group: it and its compile workers
                self.proc.wait()
        self._replies.close()


def latency_run_per_system(
    model: str, systems: list[str], args: argparse.Namespace, caches: dict[str, Path], work: Path
) -> dict[str, Any]:
    """The interleaved timing of ``systems`` on ``model``, each system in a process of its own (or
    ``--processes-per-system`` K of them).

    The processes start one after another (each compiles, checks and warms up before the next starts,
    so no compile competes with another), stay alive, and are then driven through the rounds: every
    round asks each one for one sample, in a new random order, one process at a time, the others
    waiting on their input. The machine's noise is shared as in the one-process run; thread pools,
    memory arenas and compiled code are not. A system's samples are pooled over its processes (each
    process's median is kept too, ``process_medians``; an auto system's choices are merged, ``a/b``
    where its processes chose differently). A process that dies or hangs costs its own samples only;
    a system fails when every one of its processes has."""
    found: dict[str, dict[str, Any]] = {}
    live: dict[tuple[str, int], _Served] = {}
    ready: dict[str, list[dict[str, Any]]] = {}  # each ready process's compiled event, per system
    per_process: dict[tuple[str, int], list[float]] = {}
    errors: dict[str, str] = {}
    replicas = args.processes_per_system
    try:
        for system in systems:
            for k in range(replicas):
                child = _Served(model, system, args, caches.get(system), work, k)
                answer = child.ask(None, args.timeout)
                row = child.found()
                if answer == "ready":
                    live[(system, k)] = child
                    per_process[(system, k)] = []
                    ready.setdefault(system, []).append(row)
                    continue
                child.stop()
                if row.get("event") != "failed":
                    stage = "compiling" if "event" not in row else "warming up"
                    row = {
                        "event": "failed",
                        "error": f"{answer.removeprefix('died: ')} while {stage} it: {_log_tail(child.log)}",
                    }
                errors[system] = row["error"]
        shuffle = random.Random(0)
        for r in range(args.rounds):
            for key in shuffle.sample(sorted(live), len(live)):
                answer = live[key].ask(f"sample {r}", args.timeout)
                try:
                    per_process[key].append(float(answer))
                    continue
                except ValueError:
                    pass
                child = live.pop(key)
                child.stop()
                per_process.pop(key)
                failed = child.found()
                errors[key[0]] = (
                    failed["error"]
                    if failed.get("event") == "failed"
                    else f"{answer.removeprefix('died: ')} while timing it: {_log_tail(child.log)}"
                )
    finally:
        for child in live.values():
            child.stop()
    for system in systems:
        mine = [samples for (s, _), samples in sorted(per_process.items()) if s == system and samples]
        if not mine:
            found[system] = {"event": "failed", "error": errors.get(system, "no process of it gave a sample")}
            continue
        found[system] = {**_joined(ready[system]), "samples": [x for samples in mine for x in samples]}
        if replicas > 1:
            found[system]["process_medians"] = [statistics.median(samples) for samples in mine]
    return {"systems": found}


def _joined(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's ``compiled`` events from its processes as one: the first process's, its answer checks
    joined (it matches eager only where every process's did) and auto's choices merged (``a/b`` for a
    graph its processes placed differently)."""
    row = dict(rows[0])
    checked = [r for r in rows if "matches" in r]
    if checked:
        row["matches"] = all(r["matches"] for r in checked)
        row["max_abs_diff"] = max(r.get("max_abs_diff") or 0.0 for r in checked)
        row["mismatch"] = next((r["mismatch"] for r in checked if r.get("mismatch")), None)
    choices = [r["auto_choices"] for r in rows if r.get("auto_choices")]
    if choices:
        graphs = {g for c in choices for g in c}
        row["auto_choices"] = {g: "/".join(sorted({c[g] for c in choices if g in c})) for g in graphs}
    return row


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import platform

    import torch

    from ..core.registry import list_backends

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else cpu,
        "cpu_count": os.cpu_count(),
        "threads": args.threads or torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "backends": {b.name: b.version for b in list_backends() if b.available},
    }


# ------------------------------------------------------------------------------------------ main
def _progress(total: int, disable: bool) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # the [bench] extra brings tqdm; without it, no bar
        disable = True
        tqdm = None
    if disable or tqdm is None:

        class _Quiet:
            def update(self, n: int = 1) -> None: ...
            def set_postfix_str(self, s: str) -> None: ...
            def close(self) -> None: ...

        return _Quiet()
    return tqdm(total=total, unit="step", desc="torchmux bench", dynamic_ncols=True)


def run_bench(
    args: argparse.Namespace,
    models: list[str],
    systems: list[str],
    skipped: dict[str, str],
    command: str = "torchmux bench",
) -> dict[str, Any]:
    """Run every model; bench.json is rewritten after each one, so an interrupted run keeps what it measured."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="torchmux-bench-"))
    cold_systems = [] if args.latency_only else systems
    warm_systems = [] if args.no_warm or args.latency_only else [s for s in systems if s != EAGER]
    bar = _progress(len(models) * (len(cold_systems) + len(warm_systems) + 1), args.no_progress)
    started = time.time()
    report: dict[str, Any] = {
        "command": command,
        "settings": {
            "models": models,
            "batch_size": args.batch_size,
            "rounds": args.rounds,
            "warm_up": {"calls": WARM_CALLS, "seconds_at_most": WARM_SECONDS},
            "systems": systems,
            "skipped_systems": skipped,
            "timeout_s": args.timeout,
            "cold": bool(cold_systems),
            "warm": bool(warm_systems),
            "threads": args.threads,
            "latency_processes": args.latency_processes,
            "processes_per_system": args.processes_per_system if args.latency_processes == "per-system" else 1,
        },
        "environment": environment(args),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "complete": False,
        "models": {},
        "measures": MEASURES,
    }
    results = report["models"]
    try:
        for model in models:
            caches = {s: work / "cache" / model / s.replace(":", "-") for s in systems}
            cold: dict[str, dict] = {}
            warm: dict[str, dict] = {}
            needs = ZOO[model].needs
            if needs and importlib.util.find_spec(needs) is None:
                missing = {"ok": False, "error": f"{model} needs {needs}, which is not installed (pip install {needs})"}
                results[model] = assemble(
                    model, systems, {s: missing for s in systems}, {}, {"systems": {}}, args.device
                )
                bar.update(len(cold_systems) + len(warm_systems) + 1)
                continue
            for s in cold_systems:
                bar.set_postfix_str(f"{model} · {s} · cold compile")
                cold[s] = compile_run(model, s, args, caches[s], work, "cold")
                bar.update()
                if s in warm_systems:
                    if cold[s].get("ok"):
                        bar.set_postfix_str(f"{model} · {s} · warm compile")
                        warm[s] = compile_run(model, s, args, caches[s], work, "warm")
                    bar.update()
            bar.set_postfix_str(f"{model} · latency rounds")
            runnable = [s for s in systems if cold[s].get("ok")] if cold_systems else systems
            timing = latency_run_per_system if args.latency_processes == "per-system" else latency_run
            latency = timing(model, runnable, args, caches, work) if runnable else {"systems": {}}
            bar.update()
            results[model] = assemble(model, systems, cold, warm, latency, args.device)
            report.update(wall_s=time.time() - started, geomean=geomeans(results, systems))
            (args.out / "bench.json").write_text(json.dumps(report, indent=1))
        report["complete"] = True
    except KeyboardInterrupt:
        print(f"\ntorchmux bench: interrupted; reporting the {len(results)} model(s) finished", file=sys.stderr)
    finally:
        bar.close()
        shutil.rmtree(work, ignore_errors=True)
    report.update(wall_s=time.time() - started, geomean=geomeans(results, systems))
    (args.out / "bench.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if args.models is None:
        args.models = ",".join(VARYING_MODELS) if args.workload == "varying-shapes" else "all"
    if args._child:
        args.batch_size, args.threads = args.batch_size[0], args.threads[0] if args.threads else None
        return _child_main(args)
    if args.from_json:
        from .report import format_report, write_chart

        try:
            report = json.loads(args.from_json.read_text())
            text = format_report(report)
            chart = write_chart(report, args.from_json.with_suffix(".png"))
        except OSError as e:
            print(f"torchmux bench: cannot read --from-json {args.from_json}: {e.strerror or e}", file=sys.stderr)
            return 2
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            print(
                f"torchmux bench: --from-json {args.from_json} is not a bench report written by `torchmux bench` "
                f"(bench.json): {type(e).__name__}: {e}",
                file=sys.stderr,
            )
            return 2
        print(text + (f"\n\nwrote {chart}" if chart else ""))
        return 0
    try:
        if args.rounds < 1:
            raise BenchArgumentError("--rounds must be at least 1")
        if args.calls < 1:
            raise BenchArgumentError("--calls must be at least 1")
        if args.processes_per_system < 1:
            raise BenchArgumentError("--processes-per-system must be at least 1")
        if args.processes_per_system > 1 and args.latency_processes != "per-system":
            raise BenchArgumentError(
                "--processes-per-system needs --latency-processes per-system (the shared process times every system)"
            )
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise BenchArgumentError("--device cuda, but torch sees no CUDA GPU; use --device cpu")
        models = parse_models(args.models)
        systems, skipped = resolve_systems(args.systems, args.device)
    except BenchArgumentError as e:
        print(f"torchmux bench: error: {e}", file=sys.stderr)
        return 2
    if args.workload == "varying-shapes":
        return _varying_main(args, models, systems, skipped)
    for s, why in skipped.items():
        print(f"torchmux bench: leaving out {s}: {why}", file=sys.stderr)
    import copy
    import shlex

    from .report import auto_table, format_report, write_chart

    combos = [(t, b) for t in (args.threads or [None]) for b in args.batch_size]
    reports = {}
    for threads, batch in combos:
        run_args = copy.copy(args)
        run_args.threads, run_args.batch_size = threads, batch
        if len(combos) > 1:
            run_args.out = args.out / f"threads{threads or 'default'}-batch{batch}"
        report = run_bench(run_args, models, systems, skipped, "torchmux bench " + shlex.join(argv))
        chart = write_chart(report, run_args.out / "bench.png")
        print(format_report(report))
        print(
            f"\nwrote {run_args.out / 'bench.json'}"
            + (f", {chart}" if chart else " (no chart: " + "install matplotlib)")
        )
        reports[f"{threads or 'default'} thread(s), batch {batch}"] = report
        if not report["complete"]:
            return 130
    if len(combos) > 1:
        print("\n" + "\n".join(auto_table(reports)))
    return 0


def _varying_main(args: argparse.Namespace, models: list[str], systems: list[str], skipped: dict[str, str]) -> int:
    from .varying import format_varying, run_varying, varying_systems

    systems, left = varying_systems(systems)
    for s, why in {**skipped, **left}.items():
        print(f"torchmux bench: leaving out {s}: {why}", file=sys.stderr)
    threads = args.threads[0] if args.threads else None
    if args.threads and len(args.threads) > 1:
        print(f"torchmux bench: varying-shapes runs at one thread count: {threads}", file=sys.stderr)
    args.threads = threads

    def run_child(cmd: list[str], env: dict[str, str], log: Path) -> str | None:
        why = _run(cmd, _env(args, env), log, args.timeout)
        return f"{why}: {_log_tail(log)}" if why is not None and "timed out" not in why else why

    report = run_varying(args, models, systems, run_child)
    print(format_varying(report))
    print(f"\nwrote {args.out / 'varying.json'}")
    return 0


def _child_main(args: argparse.Namespace) -> int:
    from . import run as bench_run

    if args._child == "varying":
        from .varying import child_main

        return child_main(args.models, args.systems, args.calls, args.seed, args.device, args.threads, args._result)

    if args._child == "compile":
        try:
            result = bench_run.compile_child(args.models, args.systems, args.batch_size, args.device, args.threads)
        except Exception as e:
            result = {"ok": False, "error": bench_run.short_error(e)}
            import traceback

            traceback.print_exc()
        args._result.write_text(json.dumps(result))
        return 0
    if args._child == "served":
        bench_run.served_child(
            args.models, args.systems, args.batch_size, args.device, args.threads, args._result, args._replies
        )
        return 0
    caches = json.loads(Path(args._caches).read_text()) if args._caches else {}
    bench_run.latency_child(
        args.models,
        args.systems.split(","),
        args.batch_size,
        args.device,
        args.threads,
        args.rounds,
        caches,
        args._result,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
