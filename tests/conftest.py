"""Shared test setup.

- Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 must be set before anything
  imports triton, so it is set here, first.
- Every on-disk cache goes to a fresh folder for the test session (TORCHMUX_CACHE_DIR), so tests never
  read a cache an earlier run left and a second process started by a test finds this run's cache;
  the key that signs cached libraries (TORCHMUX_KEY_FILE) is a fresh one beside it.
- Tests marked ``gpu`` skip without a CUDA device.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TORCHMUX_CACHE_DIR", tempfile.mkdtemp(prefix="torchmux-test-cache-"))
# the per-user key that signs cached libraries: a fresh one, outside the cache, never the user's own
os.environ.setdefault("TORCHMUX_KEY_FILE", os.path.join(tempfile.mkdtemp(prefix="torchmux-test-key-"), "key"))

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible to torch); runs on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
