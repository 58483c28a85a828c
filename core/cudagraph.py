"""One call replayed as a CUDA graph: the launches of a whole call recorded once, replayed with one.

At small batches a GPU call is launch-bound: the CPU's pace, one kernel launch after another, not the
GPU's work, sets its time. :func:`record` runs ``fn`` twice on a side stream (lazy initialization, the
caching allocator's first blocks, a library's own warm-up), then records one call on static input
buffers into a ``torch.cuda.CUDAGraph``. The callable it returns copies the caller's inputs into those
buffers, replays the graph and returns clones of its outputs, so a later replay cannot overwrite what
the caller holds (a backward graph's ``None`` gradients pass as they are). A lock makes each call one
copy-replay-clone: two threads never share the static buffers at once.

What it records is what ``fn`` launched on that one call, for those shapes: a callable whose work
depends on its inputs' values (a host sync, a data-dependent size) cannot be recorded, or replays the
recorded call's choices. The caller checks the graphed callable's answers against the reference
before trusting it, as any candidate's.

A call CUDA forbids during a capture (a host sync, ``cudaMalloc``, a query of an event recorded before
it: AOTInductor's thread-safe model container asks whether its last run finished before it runs again,
so a library to record is loaded single-threaded, ``LoadRequest.recorded``) fails the recording.
``capture_error_mode``: "global" (the default) fails it whichever thread makes such a call;
"thread_local", only the recording thread's, so a recording that hangs in a thread the caller gave up on
(``autotune/tuner.py`` ``within_deadline``) leaves the rest of the process free to run CUDA. A failed
recording can leave the callable's library unusable: record a callable of its own, not one in use.

Used by the ``cudagraphs`` backend (eager's ATen graph recorded) and by ``torchmux.export`` on CUDA,
which measures each shipped candidate replayed this way beside itself (``api/export.py``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch


def record(
    fn: Callable[..., Sequence[Any]], example_inputs: Sequence[Any], *, capture_error_mode: str = "global"
) -> Callable[..., list[Any]]:
    """``fn`` recorded on copies of ``example_inputs`` (CUDA tensors); see the module docstring."""
    static_in = [t.clone() if isinstance(t, torch.Tensor) else t for t in example_inputs]
    # the inputs' GPU, not the thread's current one (a trial thread starts on GPU 0)
    device = next((t.device for t in static_in if isinstance(t, torch.Tensor) and t.is_cuda), None)
    with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up outside the recording (allocator, lazy init)
                fn(*static_in)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode=capture_error_mode):
            static_out = list(fn(*static_in))
    lock = threading.Lock()

    def run(*args: Any) -> list[Any]:
        with lock:
            for dst, src in zip(static_in, args):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            graph.replay()
            return [t.clone() if isinstance(t, torch.Tensor) else t for t in static_out]

    return run
