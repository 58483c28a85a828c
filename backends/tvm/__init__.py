"""Apache TVM: each graph becomes a Relax module, built by TVM for the CPU (LLVM) or a GPU (CUDA).

This module is the cheap part: it says whether TVM is installed, in which version, without importing
it. The work (import through TVM's PyTorch frontend, build, on-disk cache, MetaSchedule tuning, the
DLPack hot path) is in ``_tvm_impl.py``, imported by :meth:`TvmBackend.compile`.

Options (``options={"tvm.<name>": value}``): :data:`OPTIONS` below, checked when ``compile()`` is
called (``torchmux.compile(..., options={"tvm.tune_seconds": 30})``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from torchmux import extend
from torchmux.extend import load_claims, load_nonfinite_unsafe, module_present, package_version, version_tuple

#: the oldest release whose API (tvm.compile, Relax VM, s_tir.meta_schedule, tvm-ffi DLPack) we use
MIN_VERSION = (0, 21)

OPTIONS: dict[str, extend.Option] = {
    "tune_seconds": extend.Option(
        float, 120.0, "wall-clock budget for MetaSchedule tuning of one graph (mode='max-autotune' only)"
    ),
    "tune_trials": extend.Option(int, 512, "at most this many measured trials for one graph, over all its tasks"),
    "tune_trials_per_task": extend.Option(
        int,
        64,
        "a task (one fused kernel) is tuned until the tuning database "
        "holds this many trials for it; tasks tuned that far are reused",
    ),
    "trials_per_round": extend.Option(int, 16, "trials measured between two looks at the clock"),
    "target": extend.Option(
        (dict, type(None)),
        None,
        "a TVM target in JSON-dict form ({'kind': 'llvm', 'mcpu': 'skylake'}) in place of the host's",
    ),
    "cache": extend.Option(bool, True, "read and write built libraries under TORCHMUX_CACHE_DIR/tvm"),
}


# ops TVM's importer reads a size of as a Python int (int(tir.Var) fails on a symbolic size)
_STATIC_ONLY = frozenset({"aten._native_batch_norm_legit_no_training.default"})


def _symbolic(node: torch.fx.Node) -> bool:
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return any(
        isinstance(t, torch.Tensor) and not all(isinstance(d, int) for d in t.shape)
        for v in values
        for t in (v if isinstance(v, (tuple, list)) else [v])
    )


class TvmBackend(extend.Backend):
    name = "tvm"
    dynamic_shapes = True  # symbolic Relax shapes from torch.export Dims: one build serves every size
    devices = ("cpu", "cuda")
    package = "apache-tvm"
    description = "Apache TVM Relax: LLVM on the CPU, CUDA with dlight schedules; MetaSchedule tuning in max-autotune"
    # untuned on the CPU (no BLAS: matmuls are plain loops) it loses 10-50x: auto builds it there only in
    # max-autotune, or where this machine saw it come close (autotune/screen.py)
    needs_tuning = ("cpu",)
    dtypes = (torch.float32,)  # float16 not yet probed on the CPU; claimed only once its cases pass
    # what the conformance suite passed (`python -m torchmux.testing.probe tvm --write ...`)
    claims = load_claims(Path(__file__).with_name("claims.json"))
    nonfinite_unsafe = load_nonfinite_unsafe(Path(__file__).with_name("claims.json"))
    contract_version = extend.CONTRACT_VERSION
    options_schema = OPTIONS

    def supports(self, node: torch.fx.Node) -> bool:
        """The claimed ops; with symbolic shapes, not those whose Relax importer needs a static size
        (the two-size conformance cases found them)."""
        if extend.op_name(node) in _STATIC_ONLY and _symbolic(node):
            return False
        return super().supports(node)

    def availability(self) -> extend.Availability:
        version = package_version(self.package)
        if version is None or not module_present("tvm"):
            return extend.Availability.no(
                "apache-tvm is not installed; install it with `pip install apache-tvm` "
                f"(version {'.'.join(map(str, MIN_VERSION))} or newer)"
            )
        if version_tuple(version) < MIN_VERSION:
            return extend.Availability.no(
                f"apache-tvm {version} is too old: torchmux needs {'.'.join(map(str, MIN_VERSION))} or newer "
                "(tvm.compile, Relax VM, s_tir.meta_schedule); upgrade with `pip install -U apache-tvm`"
            )
        return extend.Availability.yes()

    def compile(self, request: extend.CompileRequest) -> extend.CompiledGraph:
        from . import build

        return build.compile_graph(request)

    def save(self, compiled: extend.CompiledGraph, request: extend.CompileRequest) -> extend.SavedGraph | None:
        from . import build

        return build.save_graph(compiled)

    def load(self, request: extend.LoadRequest) -> extend.CompiledGraph:
        from . import build

        return build.load_graph(request)


@extend.hookimpl
def torchmux_add_backends() -> list[extend.Backend]:
    return [TvmBackend()]
