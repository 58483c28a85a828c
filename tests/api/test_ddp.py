"""A torchmux-compiled model inside DistributedDataParallel, and one sharded by FSDP2 (``fully_shard``):
2 CPU processes (gloo, mp.spawn), 3 steps each.

Losses and gradients equal the same run uncompiled; rank 0 alone measures, rank 1 runs rank 0's
choice for every graph (autotune/distributed.py), so the ranks never disagree on a backend.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp(request.param)
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(out), "eager,onnxruntime", "3", request.param],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # its output explains a failure
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_losses_and_gradients_equal_uncompiled(ranks: list[dict]) -> None:
    for rank in ranks:
        want_losses, want_grads = rank["want"]
        got_losses, got_grads = rank["got"]
        assert len(got_losses) == 3
        torch.testing.assert_close(got_losses, want_losses, rtol=1e-5, atol=1e-6)
        for got, want in zip(got_grads, want_grads):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the gradients were averaged: both ranks hold the same ones, though their data differ
    for g0, g1 in zip(ranks[0]["got"][1][-1], ranks[1]["got"][1][-1]):
        torch.testing.assert_close(g0, g1)


def test_only_rank_0_tunes_and_ranks_agree(ranks: list[dict]) -> None:
    assert ranks[0]["measured"], "rank 0 measured the candidates"
    assert ranks[1]["measured"] == [], f"rank 1 measured {ranks[1]['measured']}"
    assert ranks[0]["chosen"] and ranks[0]["chosen"] == ranks[1]["chosen"]
