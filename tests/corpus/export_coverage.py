"""Export coverage on real research code: which ParityBench modules ``torch.export`` takes whole, and ``torchmux.export``.

    python tests/corpus/export_coverage.py DIR [--jobs 1] [--timeout 900] [--module-timeout 60] [-k NAME] [-v] [--json OUT]
        [--package onnxruntime,inductor,tvm]
    python tests/corpus/export_coverage.py --report OUT [-v]     # the report of a saved run
    python tests/corpus/export_coverage.py --corpus [-k CATEGORY] [-v]  # the repository's own corpus instead

``DIR`` holds ParityBench's generated files, as for ``paritybench.py`` (whose loading this reuses: one
child process per file, imports the machine lacks served as mocks, each module built in eval mode
under a fixed seed, run eagerly twice; modules that fail eagerly, differ between the two runs or
return no tensor are left out). A module *has something to capture* when its eager run dispatches
at least one ATen operator (``return x`` has nothing; it is counted apart). For each such module,
each step bounded by ``--module-timeout`` seconds:

- ``torch.export.export(model, args)`` non-strict (torch's default), then strict (TorchDynamo);
- ``torchmux.frontends.export.capture(model, args, mend=True)``: what ``torchmux.export`` captures
  (non-strict, strict where non-strict refuses, then the mend pass's rewrites and both again; the
  program normalized into torchmux's IR), and whether the captured program answers as eager does.

With ``--package onnxruntime,inductor,tvm``, each module torchmux's capture takes also goes the whole
way a deployment goes, once per backend named: ``torchmux.export(model, args, backend=B)`` -> ``save``
-> ``torchmux.load`` -> a call, compared with eager's answer on the same build of the model (what ran at
export and at load, the warnings, a graph that draws random numbers counted apart: its values are the
backend's own draws).

A step *takes* the module when it gives one ``ExportedProgram`` for the whole forward (export has no
partial result). Each refusal is put in a category by its message (:data:`CATEGORIES`); the report
gives the counts per category for what torchmux still cannot export, and ``-v`` one line per module.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import re
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = "corpus:"  # a child's path naming one category of the corpus instead of a generated file

#: (category, pattern on "ExceptionType: message"), first match wins; the report counts these
CATEGORIES: list[tuple[str, str]] = [
    ("timeout", r"^timeout"),
    ("writes state (buffer/input mutation in forward)", r"writes state|mutat"),
    (
        "a fake tensor left in the program (.data / Variable(x.data) / new().resize_ in the forward)",
        r"fake tensor in the exported program|is a fake tensor",
    ),
    (
        "data-dependent branch (if/while on a tensor value)",
        r"Could not guard on data-dependent|Data-dependent branching",
    ),
    (
        "data-dependent int (.item()/int()/tolist() used as a Python number)",
        r"specialized integer from data-dependent|data-dependent expression|u\d+",
    ),
    ("data-dependent output shape (nonzero, mask, unique)", r"dynamic output shape|DynamicOutputShape|nonzero"),
    ("torch.cond refused the rewritten branch", r"torch\.cond|cond_branch|\bcond\b"),
    ("legacy autograd / requires_grad / hooks", r"requires_grad|Variable|hook|grad_fn|backward"),
    ("non-tensor inputs or outputs export cannot flatten", r"pytree|not a valid|unsupported (input|output)|flatten"),
    (
        "Python Dynamo cannot trace (strict)",
        r"^Unsupported|Dynamo does not know|call_function|UserDefined|builtin|skipfiles|InternalTorchDynamoError",
    ),
    ("an operator without a fake/meta kernel", r"NotImplementedError|meta|fake|FakeTensor|no kernel"),
    ("numpy or a random generator in the forward", r"numpy|np\.|Generator"),
]


def category(error: str) -> str:
    for name, pattern in CATEGORIES:
        if re.search(pattern, error):
            return name
    return "other: " + error[:80]


# --- the child: one generated file -----------------------------------------------------------------


class _Timeout(BaseException):  # not an Exception: capture() must not take it for a refusal and go on
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _first_line(e: BaseException) -> str:
    text = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {text}"[:300]


def _bounded(seconds: int, fn: Any) -> dict[str, Any]:
    """``fn()`` under an alarm: {"ok": True, ...what fn returned} or {"ok": False, "why": ...}."""
    signal.alarm(seconds)
    start = time.perf_counter()
    try:
        out = fn()
        return {"ok": True, "s": round(time.perf_counter() - start, 2), **out}
    except _Timeout:
        return {"ok": False, "why": "timeout", "s": seconds}
    except Exception as e:  # the refusal is the measurement
        why = _first_line(e)
        if type(e).__name__ == "ExportRefused":  # the first line is "torch.export refused ...: <reason>"
            why = str(e).splitlines()[0].split("refused the program: ", 1)[-1][:300]
            again = [ln for ln in str(e).splitlines() if ln.startswith("after the mend pass")]
            return {"ok": False, "why": why, "mended_why": again[0][:300] if again else "", "s": 0}
        return {"ok": False, "why": why, "s": round(time.perf_counter() - start, 2)}
    finally:
        signal.alarm(0)


def _ops_dispatched(model: Any, args: tuple[Any, ...]) -> int:
    """How many ATen operators one eager call dispatches (0: nothing to capture, as ``return x``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            Count.n += 1
            return func(*args, **(kwargs or {}))

    args = copy.deepcopy(args)  # outside the mode: copying the inputs dispatches operators too
    with torch.no_grad(), Count():
        model(*args)
    return Count.n


def child(path: str, step_timeout: int, first: int = 0, packages: Sequence[str] = ()) -> None:
    """One JSON line per test case of the file at ``path`` from case ``first`` on, each after a line
    ``# <index> <name>`` (``paritybench.run_file`` reads both)."""
    sys.path.insert(0, HERE)
    import paritybench
    import torch
    from harness import observe, same

    from torchmux.frontends.export import capture

    paritybench._WithKeywords = paritybench._with_keywords_class()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    repo = os.path.splitext(os.path.basename(path))[0].removeprefix("test_")
    try:
        if path.startswith(CORPUS):  # the repository's own corpus (programs.py, research.py), by category
            from catalog import ALL

            cases = [p for p in ALL if p.category == path[len(CORPUS) :]]
            repo = path[len(CORPUS) :]
        else:
            module = paritybench._load(path)
            cases = paritybench._cases(module)
    except BaseException as e:  # the file itself does not load here
        print(json.dumps({"repo": repo, "module": "<file>", "status": "load-fails", "why": repr(e)[:200]}), flush=True)
        return
    signal.signal(signal.SIGALRM, _on_alarm)
    warm = torch.nn.Linear(2, 2).eval()  # the first export pays one-time imports
    torch.export.export(warm, (torch.ones(1, 2),))
    for index, program in enumerate(cases):
        if index < first:
            continue
        print(f"# {index} {program.name}", flush=True)
        record: dict[str, Any] = {"repo": repo, "module": program.name}
        signal.alarm(step_timeout)
        try:
            record.update(_eager(program, observe, same))
        except _Timeout:
            record.update(status="timeout", why="the eager runs took over the step time")
        except Exception as e:  # a failure of the measurement itself
            record.update(status="harness-error", why=repr(e)[:300])
        finally:
            signal.alarm(0)
        if record.get("status") == "ok":
            record.update(_exports(program, step_timeout, capture, observe, same))
            if record["ops"] and record["torchmux"]["ok"] and packages:
                record["packages"] = {b: _package(program, b, 10 * step_timeout, observe) for b in packages}
        print(json.dumps(record), flush=True)


def _build(program: Any) -> tuple[Any, tuple[Any, ...]]:
    model, args = program.build()
    if hasattr(model, "eval"):
        model.eval()
    return model, args


def _eager(program: Any, observe: Any, same: Any) -> dict[str, Any]:
    """Left out (and why), as ``paritybench.py`` leaves modules out, or ok with the ops one call dispatches."""
    import torch

    try:
        model, args = _build(program)
    except Exception as e:  # a module this machine cannot build
        return {"status": "build-fails", "why": repr(e)[:200]}
    first = observe(model, copy.deepcopy(args))
    second = observe(model, copy.deepcopy(args))
    if first.error is not None:
        return {"status": "eager-fails", "why": f"{first.error[0]}: {first.error[1][:160]}"}
    if any(isinstance(x, mock.Mock) for x in _flat(first.output)):
        return {"status": "build-fails", "why": "its output comes from a mocked (missing) package"}
    if same(first, second):
        return {"status": "nondeterministic"}
    if not any(isinstance(t, torch.Tensor) for t in _flat(first.output)):
        return {"status": "no-tensor-output"}
    if not isinstance(model, torch.nn.Module):
        return {"status": "not-a-module"}
    return {"status": "ok", "ops": _ops_dispatched(model, args)}


def _exports(program: Any, seconds: int, capture: Any, observe: Any, same: Any) -> dict[str, Any]:
    import torch

    def export(strict: bool) -> Any:
        def go() -> dict[str, Any]:
            from torch._subclasses.fake_tensor import is_fake

            model, args = _build(program)
            with torch.no_grad():
                exported = torch.export.export(model, args, strict=strict)
            # a program holding tracing's stand-in as a weight or constant gives no answer (strict export of
            # `self.weight.data` read in the forward, torch 2.13): a refusal, as torchmux counts it
            held = {**exported.state_dict, **exported.constants}
            fake = [n for n, v in held.items() if isinstance(v, torch.Tensor) and is_fake(v)]
            if fake:
                raise RuntimeError(f"the exported program's {fake[0]} is a fake tensor: it cannot run")
            return {}

        return go

    def torchmux() -> dict[str, Any]:
        model, args = _build(program)
        reference = observe(model, copy.deepcopy(args))
        captured = capture(model, args, mend=True)
        seen = observe(captured.program.module(), copy.deepcopy(args))
        differs = same(reference, seen)
        return {
            "strict": captured.strict,
            "mended": captured.mended,
            "fixed": sorted(captured.fixed),
            "correct": not differs,
            "differs": differs[:160],
        }

    return {
        "nonstrict": _bounded(seconds, export(False)),
        "strict": _bounded(seconds, export(True)),
        "torchmux": _bounded(seconds, torchmux),
    }


def _package(program: Any, backend: str, seconds: int, observe: Any) -> dict[str, Any]:
    """``torchmux.export(backend=...)`` -> save -> ``torchmux.load`` -> a call, against eager's answer on
    the same build (some models draw their initial weights from NumPy, which the seed does not fix)."""
    import tempfile

    import torch

    import torchmux
    from torchmux.autotune.verify import is_random
    from torchmux.bench.zoo import tensors_of
    from torchmux.core.compare import mismatch

    def go() -> dict[str, Any]:
        model, args = _build(program)
        reference = observe(model, copy.deepcopy(args))
        with warnings.catch_warnings(record=True) as caught, tempfile.TemporaryDirectory() as folder:
            warnings.simplefilter("always", torchmux.TorchmuxFallbackWarning)
            exported = torchmux.export(model, copy.deepcopy(args), backend=backend)
            loaded = torchmux.load(exported.save(os.path.join(folder, "model.tmux")))
            with torch.no_grad():
                seen = observe(lambda *a: loaded(*a), copy.deepcopy(args))
        notes = [str(w.message)[:200] for w in caught if issubclass(w.category, torchmux.TorchmuxFallbackWarning)]
        # a compiled backend's answer, judged as torchmux judges one (its tolerance, not a capture's)
        if reference.error is not None or seen.error is not None:
            differs = (
                "" if reference.error == seen.error else f"raised {seen.error} where eager raised {reference.error}"
            )
        else:
            differs = mismatch(tensors_of(seen.output), tensors_of(reference.output)) or ""
        return {
            "exported": exported.backend,
            "loaded": loaded.backend,
            "correct": not differs,
            "differs": differs[:160],
            "random": is_random(exported.captured.ir),
            "notes": notes,
        }

    return _bounded(seconds, go)


def _flat(out: Any) -> list[Any]:
    if isinstance(out, dict):
        return [x for v in out.values() for x in _flat(v)]
    if isinstance(out, (tuple, list)):
        return [x for v in out for x in _flat(v)]
    return [out]


# --- the parent: every file, then the report -------------------------------------------------------


def _run_file(path: str, timeout: int, step_timeout: int, packages: str = "") -> list[dict[str, Any]]:
    if HERE not in sys.path:  # called once per file, from pool threads
        sys.path.insert(0, HERE)
    import paritybench

    repo = os.path.splitext(os.path.basename(path))[0].removeprefix("test_").removeprefix(CORPUS)
    extra = ["--package", packages] if packages else []
    records = paritybench.run_file(os.path.abspath(__file__), path, repo, timeout, step_timeout, extra)
    print(f"[{time.strftime('%H:%M:%S')}] {repo}: {len(records)} records", file=sys.stderr, flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("dir", nargs="?", help="a folder of ParityBench generated test_*.py files")
    parser.add_argument("--jobs", type=int, default=1, help="files measured at once (each in its own process)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds for one file")
    parser.add_argument("--module-timeout", type=int, default=60, help="seconds for each step of one module")
    parser.add_argument("-k", default="", help="only files whose name contains this")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per module")
    parser.add_argument("--json", help="also write every module's record to this file (JSON lines)")
    parser.add_argument("--report", help="print the report of records a --json run wrote, measure nothing")
    parser.add_argument(
        "--corpus", action="store_true", help="measure the repository's own corpus (its nn.Module programs) instead"
    )
    parser.add_argument(
        "--package",
        default="",
        help="also export each module torchmux takes with these backends (comma-separated), save, load, call",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    packages = [b for b in ns.package.split(",") if b]
    if ns.child:
        child(ns.child, ns.module_timeout, ns.first, packages)
        return 0
    if ns.report:
        with open(ns.report) as f:
            saved = [json.loads(line) for line in f if line.strip()]
        report(saved, len({r["repo"] for r in saved}), ns.verbose)
        return 0
    if ns.corpus:
        sys.path.insert(0, HERE)
        from catalog import CATEGORIES

        files = [CORPUS + c for c in CATEGORIES if ns.k in c]
    elif not ns.dir or not os.path.isdir(ns.dir):
        parser.error("give the folder of ParityBench's generated files (its 'generated' folder, or a copy of some)")
    else:
        files = sorted(
            os.path.join(ns.dir, f)
            for f in os.listdir(ns.dir)
            if f.startswith("test_") and f.endswith(".py") and ns.k in f
        )
    start = time.perf_counter()
    with ThreadPoolExecutor(max(1, ns.jobs)) as pool:
        records = [
            r for rs in pool.map(lambda p: _run_file(p, ns.timeout, ns.module_timeout, ns.package), files) for r in rs
        ]
    if ns.json:
        with open(ns.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    report(records, len(files), ns.verbose)
    print(f"({time.perf_counter() - start:.0f} s, {ns.jobs} jobs)")
    return 0


def _same_outputs(step: dict[str, Any]) -> bool:
    """The captured program's outputs (and exception) are eager's; only printed text may differ."""
    return bool(step["correct"]) or step["differs"].startswith("text ")


def _how(took: dict[str, Any]) -> str:
    """How torchmux took a module: export's mode, after the mend pass, with buffers a branch tests fixed."""
    return (
        ("strict" if took["strict"] else "non-strict")
        + (", mended" if took["mended"] else "")
        + (", buffers fixed" if took.get("fixed") else "")
    )


def _mark(step: dict[str, Any]) -> str:
    return "yes" if step["ok"] else "no"


def report(records: list[dict[str, Any]], files: int, verbose: bool = False) -> None:
    ok = [r for r in records if r["status"] == "ok"]
    left_out = collections.Counter(r["status"] for r in records if r["status"] != "ok")
    empty = [r for r in ok if r["ops"] == 0]
    some = [r for r in ok if r["ops"] > 0]
    print(
        f"files (or corpus categories): {files}; modules that run here: {len(ok)}; left out: {dict(left_out) or 'none'}"
    )
    print(f"modules with no operator to capture (return x): {len(empty)}; with something to capture: {len(some)}")
    if verbose:
        for r in records:
            if r["status"] != "ok":
                print(f"  {r['repo'][:44]:44} {r['module'][:30]:30} {r['status']} {r.get('why', '')[:90]}")
                continue
            if r["ops"] == 0:
                continue
            how = ""
            if r["torchmux"]["ok"]:
                how = _how(r["torchmux"])
                how += "" if r["torchmux"]["correct"] else f" WRONG {r['torchmux']['differs'][:60]}"
            else:
                how = r["torchmux"]["why"][:110]
            print(
                f"  {r['repo'][:44]:44} {r['module'][:30]:30} non-strict {_mark(r['nonstrict']):3} "
                f"strict {_mark(r['strict']):3} torchmux {_mark(r['torchmux']):3} {how}"
            )
    if not some:
        return
    n = len(some)
    repos = sorted({r["repo"] for r in some})

    def line(name: str, takes: Any) -> None:
        took = [r for r in some if takes(r)]
        whole_repos = [p for p in repos if all(takes(r) for r in some if r["repo"] == p)]
        print(
            f"  {name:44}{f'{len(took)}/{n} ({100 * len(took) / n:.1f}%)':>18}{f'{len(whole_repos)}/{len(repos)}':>14}"
        )

    print(f"  {'':44}{'modules whole':>18}{'repos whole':>14}")
    line("torch.export non-strict", lambda r: r["nonstrict"]["ok"])
    line("torch.export strict", lambda r: r["strict"]["ok"])
    line("torch.export non-strict or strict", lambda r: r["nonstrict"]["ok"] or r["strict"]["ok"])
    line("torchmux capture (mend on)", lambda r: r["torchmux"]["ok"])
    line("  of which answered as eager", lambda r: r["torchmux"]["ok"] and r["torchmux"]["correct"])
    line("  of which gave eager's outputs", lambda r: r["torchmux"]["ok"] and _same_outputs(r["torchmux"]))
    lost = [
        f"{r['repo']}/{r['module']}"
        for r in some
        if (r["nonstrict"]["ok"] or r["strict"]["ok"]) and not r["torchmux"]["ok"]
    ]
    print(f"torch.export takes, torchmux does not: {lost or 'none'}")
    gained = [
        f"{r['repo']}/{r['module']}"
        for r in some
        if r["torchmux"]["ok"] and not (r["nonstrict"]["ok"] or r["strict"]["ok"])
    ]
    print(f"torchmux takes, torch.export does not (the mend pass, fixed buffers): {gained or 'none'}")
    via = collections.Counter(_how(r["torchmux"]) for r in some if r["torchmux"]["ok"])
    print(f"how torchmux took them: {dict(via)}")
    ran = [r for r in some if r["torchmux"]["ok"]]
    wrong = [
        f"{r['repo']}/{r['module']}: {r['torchmux']['differs'][:80]}" for r in ran if not _same_outputs(r["torchmux"])
    ]
    print(f"captured programs whose outputs differ from eager's: {wrong or 'none'}")
    quiet = [f"{r['repo']}/{r['module']}" for r in ran if _same_outputs(r["torchmux"]) and not r["torchmux"]["correct"]]
    print(
        "same outputs, but the prints/logs/warnings eager showed are not in the exported program (export runs "
        f"Python once, while tracing): {quiet or 'none'}"
    )
    for step in ("nonstrict", "strict", "torchmux"):
        failed = [r for r in some if not r[step]["ok"]]
        counts = collections.Counter(category(r[step]["why"]) for r in failed)
        print(f"why {step} refused ({len(failed)} modules):")
        for name, k in counts.most_common():
            print(f"  {k:4}  {name}")
    _report_packages([r for r in ran if r.get("packages")])


def _report_packages(records: list[dict[str, Any]]) -> None:
    """``--package``: per backend, what ran after export -> save -> load (for ``auto``: whether it was its
    choice), and whether it answered as eager."""
    if not records:
        return
    backends = sorted({b for r in records for b in r["packages"]})
    print(f"through a package (export -> save -> load -> call), {len(records)} modules:")
    print(
        f"  {'backend':14}{'ran on it':>11}{'fell back':>11}{'eager answer':>14}{'random':>8}{'wrong':>7}{'error':>7}"
    )
    for b in backends:
        runs = [r["packages"][b] for r in records if b in r["packages"]]
        done = [p for p in runs if p["ok"]]
        on = [p for p in done if p["loaded"] == _meant(b, p)]
        right = [p for p in done if p["correct"]]
        random = [p for p in done if not p["correct"] and p["random"]]
        wrong = [p for p in done if not p["correct"] and not p["random"]]
        print(
            f"  {b:14}{len(on):>11}{len(done) - len(on):>11}{len(right):>14}{len(random):>8}{len(wrong):>7}"
            f"{len(runs) - len(done):>7}"
        )
    for r in records:
        for b, p in sorted(r["packages"].items()):
            if not p["ok"]:
                print(f"  {b}: {r['repo']}/{r['module']}: error {p['why'][:160]}")
            elif not p["correct"]:
                kind = "random graph" if p["random"] else "WRONG"
                print(f"  {b}: {r['repo']}/{r['module']}: {kind}: {p['differs'][:100]}")
            elif p["loaded"] != _meant(b, p):
                print(f"  {b}: {r['repo']}/{r['module']}: ran {p['loaded']}: {(p['notes'] or [''])[0][:160]}")
    if "auto" in backends:
        chosen = collections.Counter(r["packages"]["auto"].get("exported") for r in records if "auto" in r["packages"])
        print(f"  auto chose: {dict(chosen.most_common())}")


def _meant(backend: str, p: dict[str, Any]) -> str:
    """What a package exported with ``backend`` should run after load: that backend, or auto's choice."""
    return str(p["exported"]) if backend == "auto" else backend


if __name__ == "__main__":
    sys.exit(main())
