"""Apache TVM: each graph becomes a Relax module, built by TVM for the CPU (LLVM) or a GPU (CUDA).

This module is the cheap part: it says whether TVM is installed, in which version, without importing
it. The work (import through TVM's PyTorch frontend, build, on-disk cache, MetaSchedule tuning, the
DLPack hot path) is in ``_tvm_impl.py``, imported by :meth:`TvmBackend.compile`.

Options (``options={"tvm.<name>": value}``):

- ``tune_seconds`` (float, 120): wall-clock budget for MetaSchedule tuning of one graph
  (``mode="max-autotune"`` only).
- ``tune_trials`` (int, 512): at most this many measured trials for one graph, over all its tasks.
- ``tune_trials_per_task`` (int, 64): a task (one fused kernel) is tuned until the tuning database
  holds this many trials for it; tasks already tuned that far (by any graph, any process) are reused.
- ``trials_per_round`` (int, 16): trials measured between two looks at the clock.
- ``target`` (dict): a TVM target in JSON-dict form (``{"kind": "llvm", "mcpu": "skylake"}``), in
  place of the host's.
- ``cache`` (bool, True): read and write built libraries under ``TORCHMUX_CACHE_DIR/tvm``.
"""

from __future__ import annotations

import torch

import torchmux
from torchmux.core.backend import module_present, package_version, version_tuple

#: the oldest release whose API (tvm.compile, Relax VM, s_tir.meta_schedule, tvm-ffi DLPack) we use
MIN_VERSION = (0, 21)


class TvmBackend(torchmux.Backend):
    name = "tvm"
    devices = ("cpu", "cuda")
    package = "apache-tvm"
    description = "Apache TVM Relax: LLVM on the CPU, CUDA with dlight schedules; MetaSchedule tuning in max-autotune"
    dtypes = (torch.float32,)  # float16 not yet probed on the CPU; claimed only once its cases pass
    # `python tests/conformance/probe.py tvm` (float32): every case passes; regenerate when TVM changes
    ops: frozenset[str] | None = frozenset({
        "aten.abs.default",
        "aten.neg.default",
        "aten.exp.default",
        "aten.expm1.default",
        "aten.log.default",
        "aten.log1p.default",
        "aten.sqrt.default",
        "aten.rsqrt.default",
        "aten.reciprocal.default",
        "aten.sin.default",
        "aten.cos.default",
        "aten.tanh.default",
        "aten.sigmoid.default",
        "aten.erf.default",
        "aten.relu.default",
        "aten.gelu.default",
        "aten.floor.default",
        "aten.ceil.default",
        "aten.round.default",
        "aten.sign.default",
        "aten.pow.Tensor_Scalar",
        "aten.clamp.default",
        "aten.leaky_relu.default",
        "aten.hardtanh.default",
        "aten.elu.default",
        "aten.add.Tensor",
        "aten.sub.Tensor",
        "aten.mul.Tensor",
        "aten.div.Tensor",
        "aten.maximum.default",
        "aten.minimum.default",
        "aten.pow.Tensor_Tensor",
        "aten.fmod.Tensor",
        "aten.eq.Tensor",
        "aten.ne.Tensor",
        "aten.gt.Tensor",
        "aten.lt.Tensor",
        "aten.le.Tensor",
        "aten.ge.Scalar",
        "aten.le.Scalar",
        "aten.logical_and.default",
        "aten.logical_not.default",
        "aten.where.self",
        "aten.scalar_tensor.default",
        "aten._to_copy.default",
        "aten.sum.dim_IntList",
        "aten.mean.dim",
        "aten.amax.default",
        "aten.amin.default",
        "aten.var.correction",
        "aten.argmax.default",
        "aten.prod.dim_int",
        "aten.cumsum.default",
        "aten.any.dim",
        "aten.mm.default",
        "aten.bmm.default",
        "aten.addmm.default",
        "aten.convolution.default",
        "aten.max_pool2d_with_indices.default",
        "aten.avg_pool2d.default",
        "aten._native_batch_norm_legit_no_training.default",
        "aten.native_layer_norm.default",
        "aten._softmax.default",
        "aten._log_softmax.default",
        "aten.native_group_norm.default",
        "aten.view.default",
        "aten.permute.default",
        "aten.expand.default",
        "aten.unsqueeze.default",
        "aten.squeeze.dims",
        "aten.cat.default",
        "aten.slice.Tensor",
        "aten.select.int",
        "aten.index.Tensor",
        "aten.gather.default",
        "aten.embedding.default",
        "aten.constant_pad_nd.default",
        "aten.clone.default",
        "aten.split_with_sizes.default",
        "aten.arange.start_step",
        "aten.full.default",
    })

    def availability(self) -> torchmux.Availability:
        version = package_version(self.package)
        if version is None or not module_present("tvm"):
            return torchmux.Availability.no(
                "apache-tvm is not installed; install it with `pip install apache-tvm` "
                f"(version {'.'.join(map(str, MIN_VERSION))} or newer)"
            )
        if version_tuple(version) < MIN_VERSION:
            return torchmux.Availability.no(
                f"apache-tvm {version} is too old: torchmux needs {'.'.join(map(str, MIN_VERSION))} or newer "
                "(tvm.compile, Relax VM, s_tir.meta_schedule); upgrade with `pip install -U apache-tvm`"
            )
        return torchmux.Availability.yes()

    def compile(self, request: torchmux.CompileRequest) -> torchmux.CompiledGraph:
        from . import _tvm_impl

        return _tvm_impl.compile_graph(request)


@torchmux.hookimpl
def torchmux_add_backends() -> list[torchmux.Backend]:
    return [TvmBackend()]
