"""autotune/verdicts.py: a graph's structure (what its sizes do not change) and the verdicts kept for it."""

from __future__ import annotations

import torch

from torchmux.autotune import verdicts
from torchmux.core.registry import get_registry
from torchmux.core.trace import trace


def f(x):
    return torch.relu(x) * 2 + 1


def test_a_structure_is_the_graph_apart_from_its_sizes():
    at = {n: verdicts.structure(trace(f, [torch.randn(n, 8)])) for n in (4, 6)}
    assert at[4] == at[6]
    assert verdicts.structure(trace(lambda x: torch.tanh(x) * 2 + 1, [torch.randn(4, 8)])) != at[4]  # another op
    assert verdicts.structure(trace(f, [torch.randn(4, 8, dtype=torch.float64)])) != at[4]  # another dtype
    assert verdicts.structure(trace(f, [torch.randn(4, 8, 2)])) != at[4]  # another rank


def test_a_failed_verdict_stands_and_a_damaged_file_is_no_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "a"))
    eager = get_registry().get("eager")
    shape = verdicts.structure(trace(f, [torch.randn(4, 8)]))
    assert verdicts.recall(shape, eager, None) is None
    verdicts.record(shape, eager, None, True)
    assert verdicts.recall(shape, eager, None) == verdicts.Verdict(True, "", here=True)
    verdicts.record(shape, eager, None, False, "crashed with signal 6")
    verdicts.record(shape, eager, None, True)  # a later safe trial does not undo a crash
    assert verdicts.recall(shape, eager, None) == verdicts.Verdict(False, "crashed with signal 6", here=True)
    assert verdicts.recall(shape, eager, "max-autotune") is None  # another mode, another verdict

    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "b"))  # another cache: another memory, like the disk
    assert verdicts.recall(shape, eager, None) is None
    verdicts.record(shape, eager, None, False, "wrong answer: output 0")
    (path,) = (tmp_path / "b" / "verdicts").glob("*.json")
    assert '"ok": false' in path.read_text()
    verdicts._HERE.clear()  # as a new process finds it: on disk, not recorded here
    assert verdicts.recall(shape, eager, None) == verdicts.Verdict(False, "wrong answer: output 0", here=False)
    path.write_bytes(bytes(range(128, 256)))  # undecodable: no verdict, no exception
    assert verdicts.recall(shape, eager, None) is None
    path.write_text('{"ok": "yes"}')
    assert verdicts.recall(shape, eager, None) is None
    assert verdicts.carried("wrong answer: output 0") and not verdicts.carried("compile failed: ValueError")


def test_a_torchmux_backend_that_timed_out_is_tried_again_by_the_next_process(tmp_path, monkeypatch):
    """Slow, not stuck: torchmux's own backend past the deadline (a large graph on a busy machine) is skipped
    in this process only; a plugin's hang would be written down."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    eager = get_registry().get("eager")
    shape = verdicts.structure(trace(f, [torch.randn(3, 5)]))
    verdicts.record(shape, eager, None, False, "timed out after 30 s (isolated trial)")
    assert not verdicts.recall(shape, eager, None).ok
    assert not list(tmp_path.glob("verdicts/*.json"))
    verdicts._HERE.clear()  # a new process
    assert verdicts.recall(shape, eager, None) is None
