"""Achieved memory bandwidth of torchmux's Triton code generator on memory-bound work (needs a CUDA GPU).

    python bench/scripts/triton_bandwidth.py [--rows 8192] [--cols 4096] [--dtype float32] [--json out.json]

For a long pointwise chain (ten ops with broadcasting), softmax, layer norm and RMS norm on large
tensors, it times three implementations of the same function: eager PyTorch, Inductor
(``torch.compile``) and the graph compiled by torchmux's ``triton`` backend. Each is checked against
eager first. Achieved bandwidth counts the bytes a perfect fusion moves (every input read once, every
output written once) over the median time; the figure that matters is its fraction of the device's
copy bandwidth, measured here with a large ``Tensor.copy_`` (read + write). Eager moves more bytes than
it is credited with (one round trip per op), which is why fusion wins.

Timing uses ``triton.testing.do_bench`` (CUDA events, cache flushed between runs, median). Without a
CUDA GPU the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def chain10(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    y = x * scale + shift
    y = torch.sigmoid(y) * y
    y = torch.tanh(y) + 0.5 * y
    y = torch.exp(-y.abs()) * y - 0.1
    return torch.relu(y) + x


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def workloads(
    rows: int, cols: int, dtype: torch.dtype
) -> dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]]:
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, device="cuda").to(dtype)

    return {
        "pointwise x10": (chain10, (r(rows, cols), r(cols), r(rows, 1))),
        "softmax": (lambda x: torch.softmax(x, -1), (r(rows, cols),)),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (cols,), w, b), (r(rows, cols), r(cols), r(cols))),
        "rms_norm": (rms_norm, (r(rows, cols), r(cols))),
    }


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (counted as read + write)."""
    from triton.testing import do_bench

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=200)
    return 2 * nbytes / (ms * 1e-3)


def compile_triton(fn: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
    from torchmux.backends.triton import TritonBackend
    from torchmux.core.backend import CompileRequest
    from torchmux.core.trace import trace

    ir = trace(fn, args, name="bench")
    compiled = TritonBackend().compile(CompileRequest(ir, list(args)))
    print(f"    triton: {compiled.kernel_count} kernel(s) for {len(ir.op_nodes)} ATen ops")  # type: ignore[attr-defined]
    return lambda *a: compiled(*a)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            "triton_bandwidth.py needs a CUDA GPU (torch sees none); it measures GPU memory bandwidth. "
            "Run it on a GPU machine. Nothing was measured."
        )
        return 0
    from triton.testing import do_bench

    dtype = getattr(torch, opts.dtype)
    peak = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {peak / 1e9:.0f} GB/s; {opts.rows}x{opts.cols} {opts.dtype}")
    results: list[dict[str, Any]] = []
    header = f"{'workload':<15} {'system':<9} {'ms':>8} {'GB/s':>8} {'of copy':>8}"
    for name, (fn, args) in workloads(opts.rows, opts.cols, dtype).items():
        print(name)
        expected = fn(*args)
        moved = sum(a.numel() * a.element_size() for a in args) + expected.numel() * expected.element_size()
        systems = {"eager": fn, "inductor": torch.compile(fn, backend="inductor"), "triton": compile_triton(fn, args)}
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        for system, impl in systems.items():
            torch.testing.assert_close(impl(*args), expected, atol=tol, rtol=tol)
            ms = do_bench(lambda impl=impl: impl(*args), warmup=25, rep=100)
            bw = moved / (ms * 1e-3)
            results.append(dict(workload=name, system=system, ms=ms, gbps=bw / 1e9, fraction_of_copy=bw / peak))
        torch._dynamo.reset()
    print()
    print(header)
    for row in results:
        print(
            f"{row['workload']:<15} {row['system']:<9} {row['ms']:>8.3f} {row['gbps']:>8.0f} {row['fraction_of_copy']:>8.2f}"
        )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                dict(
                    device=torch.cuda.get_device_name(),
                    copy_gbps=peak / 1e9,
                    rows=opts.rows,
                    cols=opts.cols,
                    dtype=opts.dtype,
                    results=results,
                ),
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
