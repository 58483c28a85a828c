"""``paritybench.py`` reads both layouts of ParityBench's generated files and counts what it measures.

The two files here are written for this test in ParityBench's layouts (its newer ``TESTCASES`` list,
and its older ``Test_*`` class whose methods hand a module to ``self._check``), with the header its
generator writes: sibling modules aliased to the file, imports of packages this machine lacks, the
helpers' config object. The runner measures each file in a child process, as it does real ones; a third
file's first module kills its process, as the kernel's out-of-memory killer does.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paritybench  # noqa: E402

HEADER = """\
import sys
_module = sys.modules[__name__]
del sys
models = _module
from _paritybench_helpers import _mock_config, patch_functional
from unittest.mock import mock_open, MagicMock
import abc, collections, math, torch, tensorflow, torchtext
import numpy as np
from torch import nn
patch_functional()
_global_config = args = cfg = _mock_config()
"""

NEW = HEADER + textwrap.dedent("""
    class Branchy(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc = nn.Linear(width, width)

        def forward(self, x):
            y = self.fc(x)
            if y.sum() > 0:
                y = y * 2
            else:
                y = y - 1
            return y.relu()


    class Scaled(nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale


    class NeedsTensorflow(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = tensorflow.keras.layers.Dense(4)

        def forward(self, x):
            return self.layer(x)


    TESTCASES = [
        (Branchy, lambda: ([], {'width': 4}), lambda: ([torch.rand([2, 4])], {}), False),
        (Scaled, lambda: ([], {}), lambda: ([torch.rand([3])], {'scale': 3.0}), True),
        (NeedsTensorflow, lambda: ([], {}), lambda: ([torch.rand([2, 4])], {}), False),
    ]
    """)

OLD = HEADER + textwrap.dedent("""
    class Plain(nn.Module):
        def __init__(self, in_planes, out_planes):
            super().__init__()
            self.conv = nn.Conv2d(in_planes, out_planes, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x))


    class Test_someone_somerepo(object):
        def test_000(self):
            self._check(Plain(*[], **{'in_planes': 4, 'out_planes': 4}), [torch.rand([1, 4, 8, 8])], {})
    """)


def test_both_layouts_are_measured_and_what_cannot_run_is_left_out(tmp_path, capsys) -> None:
    (tmp_path / "test_someone_newrepo.py").write_text(NEW)
    (tmp_path / "test_someone_somerepo.py").write_text(OLD)
    out = tmp_path / "records.jsonl"
    assert paritybench.main([str(tmp_path), "--jobs", "2", "--json", str(out)]) == 0
    records = {(r["repo"], r["module"]): r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {
        ("someone_newrepo", "Branchy#0"),
        ("someone_newrepo", "Scaled#1"),
        ("someone_newrepo", "NeedsTensorflow#2"),
        ("someone_somerepo", "Plain#0"),
    }
    # TensorFlow is not installed: the file still loads, and only the module that uses it is left out
    assert records["someone_newrepo", "NeedsTensorflow#2"]["status"] == "build-fails"
    branchy = records["someone_newrepo", "Branchy#0"]
    assert branchy["status"] == "ok"
    assert (branchy["dynamo"]["graphs"], branchy["dynamo"]["breaks"]) == (2, 1)  # the tensor if
    assert (branchy["torchmux"]["graphs"], branchy["torchmux"]["breaks"]) == (1, 0)  # mended
    for key in [("someone_newrepo", "Scaled#1"), ("someone_somerepo", "Plain#0")]:  # keyword args; old layout
        assert records[key]["status"] == "ok"
        assert all((records[key][m]["graphs"], records[key][m]["breaks"]) == (1, 0) for m in ("dynamo", "torchmux"))
    assert all(
        records[k][m]["correct"] for k in records if records[k]["status"] == "ok" for m in ("dynamo", "torchmux")
    )
    report = capsys.readouterr().out
    assert "modules measured: 3; left out: {'build-fails': 1}" in report
    assert "2/3 66.7%" in report and "3/3 100.0%" in report  # Dynamo, torchmux: modules in one graph
    assert "1/2 50.0%" in report and "2/2 100.0%" in report  # repositories with every module in one graph


KILLER = HEADER + textwrap.dedent("""
    import os, signal

    class Dies(nn.Module):
        def __init__(self):
            super().__init__()
            os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's out-of-memory killer does to a child


    class After(nn.Module):
        def forward(self, x):
            return x.relu() + 1


    TESTCASES = [
        (Dies, lambda: ([], {}), lambda: ([torch.rand([2])], {}), False),
        (After, lambda: ([], {}), lambda: ([torch.rand([2])], {}), True),
    ]
    """)


def test_a_module_that_kills_its_process_costs_only_that_module(tmp_path) -> None:
    (tmp_path / "test_someone_killer.py").write_text(KILLER)
    out = tmp_path / "records.jsonl"
    assert paritybench.main([str(tmp_path), "--jobs", "1", "--json", str(out)]) == 0
    records = {r["module"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"Dies#0", "After#1"}
    assert records["Dies#0"]["status"] == "crashed" and records["Dies#0"]["why"] == "exit -9"
    after = records["After#1"]  # measured by a new child that started at the next case
    assert after["status"] == "ok"
    assert all(
        (after[m]["graphs"], after[m]["breaks"], after[m]["correct"]) == (1, 0, True) for m in ("dynamo", "torchmux")
    )
    # export_coverage.py's children run the same way
    import export_coverage

    out = tmp_path / "exports.jsonl"
    assert export_coverage.main([str(tmp_path), "--json", str(out)]) == 0
    records = {r["module"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"Dies#0", "After#1"} and records["Dies#0"]["status"] == "crashed"
    after = records["After#1"]
    assert after["status"] == "ok", after
    assert after["nonstrict"]["ok"] and after["strict"]["ok"] and after["torchmux"]["ok"], after
    assert after["torchmux"]["correct"] is True, after


SLOW = HEADER + textwrap.dedent("""
    import time

    class SlowWhenCompiled(nn.Module):
        def forward(self, x):
            if torch.compiler.is_compiling():
                time.sleep(6)  # a graph break: every compiled call sleeps, the eager runs do not
            return x.relu()


    class After(nn.Module):
        def forward(self, x):
            return x.relu() + 1


    TESTCASES = [
        (SlowWhenCompiled, lambda: ([], {}), lambda: ([torch.rand([2])], {}), True),
        (After, lambda: ([], {}), lambda: ([torch.rand([2])], {}), True),
    ]
    """)


def test_a_capture_past_the_module_limit_is_a_timeout_not_an_answer(tmp_path, capsys) -> None:
    """The limit's alarm is never taken for the program's own exception (inside Dynamo or the captured
    run): a capture that runs past it is a timeout, with no graph and no full-graph credit, and the next
    module of the file is measured in full."""
    (tmp_path / "test_someone_slow.py").write_text(SLOW)
    out = tmp_path / "records.jsonl"
    assert paritybench.main([str(tmp_path), "--jobs", "1", "--module-timeout", "2", "--json", str(out)]) == 0
    records = {r["module"]: r for r in map(json.loads, out.read_text().splitlines())}
    slow = records["SlowWhenCompiled#0"]
    assert slow["status"] == "ok", slow
    assert all(slow[m].get("timeout") and not paritybench._full(slow[m]) for m in ("dynamo", "torchmux")), slow
    assert slow["timed_out"], slow
    after = records["After#1"]
    assert after["status"] == "ok" and after["torchmux"]["correct"] and not after.get("timed_out"), after
    assert "capture timings cut at the module limit (seconds counted as the limit, both): ['someone_slow/" in (
        capsys.readouterr().out
    )


def test_export_coverage_counts_a_program_holding_a_fake_tensor_as_refused(tmp_path) -> None:
    """Strict torch.export gives a program for ``self.weight.data`` read in the forward whose constant is
    a fake tensor (torch 2.13): it cannot run, so the coverage report counts it refused; torchmux's capture
    takes it after the mend pass (``.data`` exported as ``detach()``), answering as eager, and torch.export
    takes no module that torchmux does not."""
    import export_coverage

    out = tmp_path / "legacy.jsonl"
    assert export_coverage.main(["--corpus", "-k", "legacy autograd", "--json", str(out)]) == 0
    records = {r["module"]: r for r in map(json.loads, out.read_text().splitlines())}
    held = records["legacy_data_normalize"]
    assert not held["strict"]["ok"] and "fake tensor" in held["strict"]["why"], held
    assert held["torchmux"]["ok"] and held["torchmux"]["mended"] and held["torchmux"]["correct"], held
    taken = [r for r in records.values() if r.get("status") == "ok"]
    assert all(r["torchmux"]["ok"] for r in taken if r["nonstrict"]["ok"] or r["strict"]["ok"])


def test_export_coverage_takes_each_module_through_a_package(tmp_path, capsys) -> None:
    """``--package``: each module torchmux's capture takes is exported with the backend named, saved, loaded
    and called; the record says what ran and whether it answered as eager. ``Indexed`` takes a Python int
    (research code's layer index), which a package holds fixed and checks each call."""
    (tmp_path / "test_someone_indexed.py").write_text(INDEXED)
    import export_coverage

    out = tmp_path / "packages.jsonl"
    assert export_coverage.main([str(tmp_path), "--package", "onnxruntime,eager", "--json", str(out)]) == 0
    records = {r["module"]: r for r in map(json.loads, out.read_text().splitlines())}
    for name in ("Indexed#0", "Plain#1"):
        packages = records[name]["packages"]
        for backend in ("onnxruntime", "eager"):
            p = packages[backend]
            assert p["ok"] and p["exported"] == p["loaded"] == backend and p["correct"], (name, backend, p)
    report = capsys.readouterr().out
    assert "through a package (export -> save -> load -> call), 2 modules:" in report


INDEXED = HEADER + textwrap.dedent("""
    class Indexed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, res, i):
            if i == 1:
                res = self.fc(res)
            return (x + res) * math.sqrt(0.5)


    class Plain(nn.Module):
        def forward(self, x):
            return torch.tanh(x) * 2


    TESTCASES = [
        (Indexed, lambda: ([], {}), lambda: ([torch.rand([2, 4]), torch.rand([2, 4]), 1], {}), True),
        (Plain, lambda: ([], {}), lambda: ([torch.rand([3, 5])], {}), True),
    ]
    """)
