"""torchmux's Inductor backend on frozen graphs: a warm start finds them in Inductor's FX graph cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("inductor_warm_worker.py")


def _run(tmp_path: Path) -> dict:
    env = dict(
        os.environ,
        TORCHMUX_CACHE_DIR=str(tmp_path / "torchmux"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        TORCHMUX_VERBOSE="0",
    )
    out = subprocess.run([sys.executable, str(WORKER)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_frozen_graph_is_an_fx_cache_hit_in_the_trials_parent_and_on_a_warm_start(tmp_path):
    """Cold: the trial child lowers the frozen graph, the parent loads it from Inductor's FX graph cache.
    Warm (a second process): no trial, no child, the graph straight from that cache. After an in-place
    weight change the rebuilt graph is a hit as well, with the new weights bound (the worker checks the
    answers against eager): Inductor keys a frozen graph by its constants' specs, not their values."""
    cold = _run(tmp_path)
    assert cold["frozen"] == [True] and cold["backends"] == ["inductor"], cold
    assert cold["trials"] == 1 and cold["child_starts"] == 1, cold
    assert cold["first_call"]["hit"] >= 1 and cold["first_call"].get("bypass", 0) == 0, cold
    assert cold["after_change_hits"] >= 1, cold

    warm = _run(tmp_path)
    assert warm["frozen"] == [True] and warm["backends"] == ["inductor"], warm
    assert warm["trials"] == 0 and warm["child_starts"] == 0, warm  # the verdict was on disk: no child at all
    assert warm["first_call"]["hit"] >= 1, warm
    assert warm["first_call"].get("miss", 0) == 0 and warm["first_call"].get("bypass", 0) == 0, warm
    assert warm["after_change_hits"] >= 1, warm
