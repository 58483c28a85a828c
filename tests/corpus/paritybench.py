"""Capture coverage on real research code: ParityBench's modules, torchmux against Dynamo.

    python tests/corpus/paritybench.py DIR [--jobs 2] [--timeout 600] [-k NAME] [-v] [--json OUT]
    python tests/corpus/paritybench.py --report OUT [-v]     # the report of a saved run

``DIR`` holds ParityBench's generated files (``generated/test_<user>_<repo>.py`` in the repository
``jansel/pytorch-jit-paritybench``): each is one public repository's ``nn.Module`` classes, copied as
their authors wrote them, with a ``TESTCASES`` list that says how to build each module and what to
call it with. Nothing of them is in this repository: clone ParityBench and point ``DIR`` at its
``generated`` folder (or at any subset of its files).

Each file runs in a child process of its own (research code may hang or crash the interpreter; a
file that takes over ``--timeout`` seconds is counted as what it finished; a module that kills its
child, by a segfault or the kernel's out-of-memory killer, is counted as crashed and a new child goes
on with the next module). For each module the child builds it in eval mode under a fixed seed, runs
it eagerly twice, and then, like ``coverage.py``
does for the corpus, captures it with ``torch._dynamo.explain`` and with torchmux's explain machinery
(the mend pass on, its rewrites kept only where no worse than Dynamo's capture of the code as written:
``frontends/mend/verdict.py``; the capture time counts the second capture where the verdict takes one),
both on the eager backend, and compares each captured run with eager's (outputs,
printed text, exceptions; ``harness.py``); a capture that raises where eager ran counts as a wrong
answer with no graph. Modules that fail eagerly, whose two eager runs differ
(random draws outside the seed) or that return no tensor are left out, as ParityBench leaves them
out: what is left is the denominator. Imports the machine lacks (TensorFlow, torchtext, ...) are
served as ``MagicMock`` modules while a file loads, so the modules that do not use them still count.

A module is *full-graph* when it gives one graph, no break and no skipped frame; a module with no
tensor op to capture (``return x``) gives no graph and no break, and counts as full-graph for both
(the report says how many did). The report gives
the share of full-graph modules and of repositories whose every module is full-graph, for both, the
modules whose outputs differ from eager's, where torchmux has more breaks than Dynamo, capture time
against Dynamo's, and the break reasons left, most frequent first (``-v``: one line per module).
"""

from __future__ import annotations

import argparse
import collections
import copy
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))


# --- the child: one generated file -----------------------------------------------------------------


def _mock_missing_imports(source: str) -> None:
    """A ``MagicMock`` module in ``sys.modules`` for each top-level package the file imports that this
    machine lacks (TensorFlow, torchtext, ...), so the file loads and its other modules still count."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    # TensorBoard: torch.utils.tensorboard imports it and checks its version; only a log writer needs it
    if importlib.util.find_spec("tensorboard") is None:
        sys.modules.setdefault("torch.utils.tensorboard", _mock_module("torch.utils.tensorboard"))
    for name in sorted((names | {"tensorboardX"}) - {"_paritybench_helpers"}):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = _mock_module(name)

    class Submodules(importlib.abc.MetaPathFinder):  # ``from tensorflow.keras import x``: mocked too
        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
            top = fullname.split(".")[0]
            if isinstance(sys.modules.get(top), mock.MagicMock):
                return importlib.util.spec_from_loader(fullname, _MockLoader())
            return None

    sys.meta_path.insert(0, Submodules())


def _mock_module(name: str) -> Any:
    module = mock.MagicMock(name=name)
    module.__path__ = []
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    return module


class _MockLoader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> Any:
        return _mock_module(spec.name)

    def exec_module(self, module: Any) -> None:
        pass


def _helpers_module() -> types.ModuleType:
    """What ParityBench's generated files import from ``_paritybench_helpers`` (its interface, rewritten:
    a config object whose attributes are its keys, a stand-in layer, no-op test plumbing)."""
    import torch

    helpers = types.ModuleType("_paritybench_helpers")

    class _mock_config(dict):  # noqa: N801 (ParityBench's name)
        __getattr__ = dict.__getitem__

    def _mock_layer(in_features: Any = None, out_features: Any = None, *args: Any, **kwargs: Any) -> Any:
        if in_features and out_features:
            return torch.nn.Linear(in_features, out_features)
        return torch.nn.ReLU()

    helpers._mock_config = _mock_config  # type: ignore[attr-defined]
    helpers._mock_layer = _mock_layer  # type: ignore[attr-defined]
    helpers._fails_compile = lambda: lambda f: f  # type: ignore[attr-defined]
    helpers._paritybench_base = object  # type: ignore[attr-defined]
    helpers.patch_functional = lambda: None  # type: ignore[attr-defined]
    return helpers


def _load(path: str) -> types.ModuleType:
    name = os.path.splitext(os.path.basename(path))[0]
    sys.modules["_paritybench_helpers"] = _helpers_module()
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with open(path) as f:
        _mock_missing_imports(f.read())
    spec.loader.exec_module(module)
    return module


# not an Exception: a capture (or Dynamo inside it) must not take the limit's alarm for the program's own
class _Timeout(BaseException):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _cases(module: types.ModuleType) -> list[Any]:
    """The file's test cases as ``Program``s: its ``TESTCASES`` list, or, in files ParityBench generated
    before it had that list, the ``Test_*`` class's ``test_NNN`` methods (each builds a module and its
    arguments, and hands them to ``self._check``)."""
    if hasattr(module, "TESTCASES"):
        return [_case(module, i, case) for i, case in enumerate(module.TESTCASES)]
    tests = [v for k, v in vars(module).items() if k.startswith("Test_") and isinstance(v, type)]
    methods = [(cls, name) for cls in tests for name in sorted(vars(cls)) if name.startswith("test_")]
    return [_method_case(cls, name, i) for i, (cls, name) in enumerate(methods)]


def _method_case(cls: type, name: str, index: int) -> Any:
    import torch
    from programs import Program

    def build() -> tuple[Any, tuple[Any, ...]]:
        seen: dict[str, Any] = {}
        test = cls.__new__(cls)
        test._check = lambda model, args, kwargs: seen.update(model=model, args=args, kwargs=kwargs)  # type: ignore[attr-defined]
        torch.manual_seed(0)
        getattr(test, name)()
        model = _WithKeywords(seen["model"], seen["kwargs"]) if seen["kwargs"] else seen["model"]
        return model, tuple(seen["args"])

    model_name = name
    try:
        model_name = type(build()[0]).__name__
    except Exception:  # reported when the case runs
        pass
    return Program(f"{model_name}#{index}", "paritybench", "", build)


def _case(module: types.ModuleType, index: int, case: Any) -> Any:
    """A ``Program`` (the corpus's shape) for one test case: ``build`` makes the module afresh under a
    fixed seed, with keyword arguments bound by a wrapper Dynamo inlines."""
    import torch
    from programs import Program

    cls, init, forward = case[0], case[1], case[2]

    def build() -> tuple[Any, tuple[Any, ...]]:
        torch.manual_seed(0)
        init_args, init_kwargs = init()
        model = cls(*init_args, **init_kwargs)
        torch.manual_seed(1)
        args, kwargs = forward()
        if kwargs:
            model = _WithKeywords(model, kwargs)
        return model, tuple(args)

    return Program(f"{cls.__name__}#{index}", "paritybench", "", build)


def _with_keywords_class() -> type:
    import torch

    class WithKeywords(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module, kwargs: dict[str, Any]) -> None:
            super().__init__()
            self.inner, self.kwargs = inner, kwargs

        def forward(self, *args: Any) -> Any:
            return self.inner(*args, **self.kwargs)

    return WithKeywords


_WithKeywords: Any = None


def child(path: str, per_module_timeout: int, first: int = 0) -> None:
    """One JSON line per test case of the file at ``path``, from case ``first`` on; before each case a
    line ``# <index> <name>`` (what the parent names when the case kills this process)."""
    global _WithKeywords
    sys.path.insert(0, HERE)
    import torch
    from harness import capture_pair, run

    _WithKeywords = _with_keywords_class()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    repo = os.path.splitext(os.path.basename(path))[0].removeprefix("test_")
    try:
        module = _load(path)
        cases = _cases(module)
    except BaseException as e:  # the file itself does not load here (a dependency it cannot do without)
        print(json.dumps({"repo": repo, "module": "<file>", "status": "load-fails", "why": repr(e)[:200]}), flush=True)
        return
    signal.signal(signal.SIGALRM, _on_alarm)
    warm = _case(module, -1, (torch.nn.Linear, lambda: ([2, 2], {}), lambda: ([torch.ones(1, 2)], {})))
    run(warm, "dynamo"), run(warm, "torchmux"), capture_pair(warm)  # the first capture pays one-time imports
    for index, program in enumerate(cases):
        if index < first:
            continue
        print(f"# {index} {program.name}", flush=True)
        record: dict[str, Any] = {"repo": repo, "module": program.name}
        signal.alarm(per_module_timeout)
        try:
            record.update(_measure(program, per_module_timeout))
        except _Timeout:
            record.update(status="timeout")
        except BaseException as e:  # a failure of the measurement itself, reported as such
            record.update(status="harness-error", why=repr(e)[:300])
        finally:
            signal.alarm(0)
        print(json.dumps(record), flush=True)


def _measure(program: Any, limit: int = 0) -> dict[str, Any]:
    """One module: left out (and why), or both captures' counts, correctness and capture seconds. ``limit``:
    the seconds each capture may take (armed anew for each, so a slow module's earlier steps do not eat a
    later capture's time; twice that for a mode's run, which may capture twice); one that runs past it
    counts as a timeout, with no graph and no answer."""
    import torch
    from harness import capture_pair, observe, run, same

    try:
        model, args = program.build()
    except Exception as e:  # a module this machine cannot build (a mocked import, an API gone since)
        return {"status": "build-fails", "why": repr(e)[:200]}
    if isinstance(model, torch.nn.Module):
        model.eval()
    first = observe(model, copy.deepcopy(args))
    second = observe(model, copy.deepcopy(args))
    if first.error is not None:
        return {"status": "eager-fails", "why": f"{first.error[0]}: {first.error[1][:160]}"}
    if any(isinstance(x, mock.Mock) for x in _flat(first.output)):  # it ran a package this machine lacks
        return {"status": "build-fails", "why": "its output comes from a mocked (missing) package"}
    if same(first, second):
        return {"status": "nondeterministic"}
    if not any(isinstance(t, torch.Tensor) for t in _flat(first.output)):
        return {"status": "no-tensor-output"}
    record: dict[str, Any] = {"status": "ok"}
    for mode in ("dynamo", "torchmux"):
        if limit:  # a mode's run may capture twice: Dynamo's explain then its compile; the verdict's second capture
            signal.alarm(2 * limit)
        try:
            r = run(program, mode)
        except _Timeout:
            record[mode] = {
                "graphs": 0,
                "breaks": 0,
                "correct": False,
                "why": f"ran past {2 * limit} s",
                "timeout": True,
            }
            continue
        except Exception as e:  # the capture itself raised where eager ran: no graph, and a wrong answer
            record[mode] = {"graphs": 0, "breaks": 0, "correct": False, "why": f"raised {e!r}"[:200], "raised": True}
            continue
        record[mode] = {
            "graphs": r.graphs,
            "breaks": r.breaks,
            "correct": r.correct,
            "why": r.why[:200],
            "rewrites": list(r.rewrites),
        }
    try:  # mend + Dynamo against Dynamo alone, as coverage.py measures
        mux, dyn = capture_pair(program, (lambda: signal.alarm(limit)) if limit else (lambda: None))
    except _Timeout:  # a timed capture ran past the limit: its time is at least that (the report says so)
        mux = dyn = float(limit)
        record["timed_out"] = True
    record["torchmux"]["seconds"], record["dynamo"]["seconds"] = round(mux, 4), round(dyn, 4)
    if not _full(record["torchmux"]):
        if limit:
            signal.alarm(limit)
        try:
            record["reasons"] = _break_reasons(program)
        except _Timeout:
            record["reasons"] = [f"(its capture ran past {limit} s)"]
    return record


def _counts(result: dict[str, Any]) -> str:
    if result.get("raised"):
        return "RAISED"
    if result.get("timeout"):
        return "TIMEOUT"
    return f"{result['graphs']}g/{result['breaks']}b" + ("" if result["correct"] else " WRONG")


def _full(result: dict[str, Any]) -> bool:
    return result["graphs"] <= 1 and result["breaks"] == 0 and not result.get("raised") and not result.get("timeout")


def _break_reasons(program: Any) -> list[str]:
    """The first line of each break or not-captured reason torchmux's report gives, with its place."""
    from harness import run_model

    model, args = program.build()
    model.eval()
    _, rep, _, _ = run_model(model, copy.deepcopy(args), "torchmux")
    return [str(r)[:200] for r in list(rep.break_reasons) + list(rep.not_captured)]


def _flat(out: Any) -> list[Any]:
    if isinstance(out, dict):
        return [x for v in out.values() for x in _flat(v)]
    if isinstance(out, (tuple, list)):
        return [x for v in out for x in _flat(v)]
    return [out]


# --- the parent: every file, then the report -------------------------------------------------------


def _run_file(path: str, timeout: int, per_module_timeout: int) -> list[dict[str, Any]]:
    repo = os.path.splitext(os.path.basename(path))[0].removeprefix("test_")
    return run_file(os.path.abspath(__file__), path, repo, timeout, per_module_timeout)


def run_file(
    script: str, path: str, repo: str, timeout: int, per_module_timeout: int, extra: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The records ``script --child path [extra...]`` prints (this file's and ``export_coverage.py``'s
    children: a line ``# <index> <name>`` before each case, a JSON line after it). Where a case kills the
    child (a segfault, the out-of-memory killer), it is recorded as crashed and a new child starts at the
    next case (``--first``), within the file's ``timeout`` in all."""
    cmd = [sys.executable, script, "--child", path, "--module-timeout", str(per_module_timeout), *extra]
    records: list[dict[str, Any]] = []
    deadline, first = time.monotonic() + timeout, 0
    while True:
        err = ""
        try:
            left = max(1.0, deadline - time.monotonic())
            proc = subprocess.run([*cmd, "--first", str(first)], capture_output=True, text=True, timeout=left, cwd=HERE)
            out, tail, err = proc.stdout, ("" if proc.returncode == 0 else f"exit {proc.returncode}"), proc.stderr
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            tail = "file timeout"
        lines = out.splitlines()
        records += [json.loads(line) for line in lines if line.startswith("{")]
        if not tail:
            return records
        started = [line.split(" ", 2) for line in lines if line.startswith("# ")]
        done = {r["module"] for r in records}
        last = started[-1] if started and started[-1][2] not in done else None
        module = last[2] if last else "<rest of file>"
        records.append({"repo": repo, "module": module, "status": "crashed", "why": tail, "stderr": err[-300:]})
        if last is None or tail == "file timeout":  # died outside a case, or out of time: the rest is lost
            return records
        first = int(last[1]) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", help="a folder of ParityBench generated test_*.py files")
    parser.add_argument("--jobs", type=int, default=2, help="files measured at once (each in its own process)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds for one file")
    parser.add_argument("--module-timeout", type=int, default=120, help="seconds for each capture of one module")
    parser.add_argument("-k", default="", help="only files whose name contains this")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per module")
    parser.add_argument("--json", help="also write every module's record to this file (JSON lines)")
    parser.add_argument("--report", help="print the report of records a --json run wrote (JSON lines), measure nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        child(ns.child, ns.module_timeout, ns.first)
        return 0
    if ns.report:
        with open(ns.report) as f:
            saved = [json.loads(line) for line in f if line.strip()]
        report(saved, len({r["repo"] for r in saved}), ns.verbose)
        return 0
    if not ns.dir or not os.path.isdir(ns.dir):
        parser.error("give the folder of ParityBench's generated files (its 'generated' folder, or a copy of some)")
    files = sorted(
        os.path.join(ns.dir, f) for f in os.listdir(ns.dir) if f.startswith("test_") and f.endswith(".py") and ns.k in f
    )
    start = time.perf_counter()
    with ThreadPoolExecutor(max(1, ns.jobs)) as pool:
        records = [r for rs in pool.map(lambda p: _run_file(p, ns.timeout, ns.module_timeout), files) for r in rs]
    if ns.json:
        with open(ns.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    report(records, len(files), ns.verbose)
    print(f"({time.perf_counter() - start:.0f} s, {ns.jobs} jobs)")
    return 0


def report(records: list[dict[str, Any]], files: int, verbose: bool = False) -> None:
    ok = [r for r in records if r["status"] == "ok"]
    left_out = collections.Counter(r["status"] for r in records if r["status"] != "ok")
    print(f"ParityBench files: {files}; modules measured: {len(ok)}; left out: {dict(left_out) or 'none'}")
    if verbose:
        for r in records:
            if r["status"] != "ok":
                print(f"  {r['repo']:50} {r['module']:34} {r['status']} {r.get('why', '')[:100]}")
                continue
            d, m = (_counts(r[mode]) for mode in ("dynamo", "torchmux"))
            print(
                f"  {r['repo']:50} {r['module']:34} dynamo {d}  torchmux {m}  {'; '.join(r.get('reasons', []))[:160]}"
            )
    if not ok:
        return
    repos = sorted({r["repo"] for r in ok})
    print(f"{'':10}{'modules full-graph':>22}{'repos all full-graph':>24}{'wrong outputs':>16}{'capture (s)':>14}")
    empty = sum(r["dynamo"]["graphs"] == 0 and _full(r["dynamo"]) for r in ok)
    print(f"(no tensor op to capture, no break: {empty} modules, counted as full-graph for both)")
    for mode in ("dynamo", "torchmux"):
        full = [r for r in ok if _full(r[mode])]
        full_repos = [p for p in repos if all(r in full for r in ok if r["repo"] == p)]
        wrong = sum(not r[mode]["correct"] for r in ok)
        seconds = sum(r[mode]["seconds"] for r in ok)
        print(
            f"{mode:10}{f'{len(full)}/{len(ok)} {100 * len(full) / len(ok):.1f}%':>22}"
            f"{f'{len(full_repos)}/{len(repos)} {100 * len(full_repos) / len(repos):.1f}%':>24}{wrong:>16}{seconds:>14.1f}"
        )
    worse = [
        f"{r['repo']}/{r['module']}"
        for r in ok
        if r["torchmux"].get("raised")
        or (r["torchmux"].get("timeout") and not r["dynamo"].get("timeout"))
        or (r["torchmux"]["breaks"] > r["dynamo"]["breaks"] and not r["dynamo"].get("raised"))
    ]
    raised = {m: [f"{r['repo']}/{r['module']}" for r in ok if r[m].get("raised")] for m in ("dynamo", "torchmux")}
    print(
        f"captures that raised where eager ran: Dynamo {raised['dynamo'] or 'none'}; torchmux {raised['torchmux'] or 'none'}"
    )
    print(f"modules where torchmux has more breaks than Dynamo: {worse or 'none'}")
    wrong = [f"{r['repo']}/{r['module']}: {r['torchmux']['why'][:80]}" for r in ok if not r["torchmux"]["correct"]]
    print(f"modules where torchmux's output differs from eager's: {wrong or 'none'}")
    slow = sorted(
        ((r["torchmux"]["seconds"] / max(r["dynamo"]["seconds"], 1e-3), f"{r['repo']}/{r['module']}") for r in ok),
        reverse=True,
    )
    print("capture over 2x Dynamo's: " + (", ".join(f"{n} {x:.1f}x" for x, n in slow if x > 2) or "none"))
    timed_out = [f"{r['repo']}/{r['module']}" for r in ok if r.get("timed_out")]
    print(f"capture timings cut at the module limit (seconds counted as the limit, both): {timed_out or 'none'}")
    reasons = collections.Counter(
        reason.split(": ", 1)[-1].split("  [")[0][:90]
        for r in ok
        if not _full(r["torchmux"])
        for reason in r.get("reasons", []) or ["(no reason given)"]
    )
    print("what torchmux still breaks on (modules):")
    for reason, n in reasons.most_common(25):
        print(f"  {n:4}  {reason}")


if __name__ == "__main__":
    sys.exit(main())
