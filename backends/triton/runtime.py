"""Compile a plan with triton.jit and run it: kernels launched over a grid, ATen calls in between.

``triton.jit`` reads its function's source with ``inspect``, so every kernel is written to a file in
``TORCHMUX_CACHE_DIR/triton/`` (named by the hash of its source, so identical kernels are shared
across graphs and processes) and imported from there. With ``TORCHMUX_DEBUG_DIR`` set, each kernel's
source is also written there, named after the graph. Under ``TRITON_INTERPRET=1`` the same kernels
run in Triton's CPU interpreter.

**Symbolic graphs.** A graph with symbolic sizes compiles once for every size. At each call
:class:`_Sizes` reads each symbol's value from the inputs (a tensor's size, or the integer input
Dynamo passes for it); each launch evaluates its output shapes, row count and row length from them,
picks its block sizes (codegen.block_config) and grid, and passes the symbols to the kernel. A launch
whose sizes the kernel was not written for (a row longer than fusion.MAX_ROW, 2**31 elements or more)
runs the kernel's ops in ATen instead, for that call.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from torchmux.extend import GraphIR, artifact_dir, atomic_write, debug_dir

from . import codegen, fusion

__all__ = ["compile_graph", "CompiledTritonGraph"]

_loaded: dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _load(ks: codegen.KernelSource) -> Callable[..., Any]:
    """Write the kernel's source to the cache dir and import it; one module per distinct source.

    triton.jit reads a kernel's source from its file, so the file must exist; what is on disk is
    executed only if it is exactly the source generated here (a planted or truncated file is rewritten)."""
    digest = hashlib.sha256(ks.source.encode()).hexdigest()[:16]
    with _lock:
        if digest in _loaded:
            return _loaded[digest]
        path = artifact_dir("triton") / f"tmx_{digest}.py"
        try:
            same = path.read_text() == ks.source
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            atomic_write(path, ks.source)
        module_name = f"torchmux_triton_kernels.tmx_{digest}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        fn = getattr(module, ks.name)
        _loaded[digest] = fn
        return fn


Values = dict[str, int]  # "sym_<name>" -> the symbol's value at this call


class _Sizes:
    """Where each symbol of a graph is read from at a call, and sizes evaluated on those values."""

    def __init__(self, ir: GraphIR) -> None:
        self.where: dict[str, tuple[int, int | None]] = {}
        for i, node in enumerate(ir.placeholders):
            val = node.meta.get("val")
            sizes: list[tuple[int | None, Any]] = [(None, val)] if isinstance(val, torch.SymInt) else []
            if isinstance(val, torch.Tensor):
                sizes = [(d, size) for d, size in enumerate(val.shape)]
            for d, size in sizes:
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    self.where.setdefault(f"sym_{size.node.expr.name}", (i, d))
        missing = sorted(f"sym_{name}" for name in ir.symbols if f"sym_{name}" not in self.where)
        if missing:
            raise NotImplementedError(f"{ir.name}: symbols {missing} are no input's size nor an integer input")

    def values(self, args: Sequence[Any]) -> Values:
        return {name: int(args[i] if d is None else args[i].shape[d]) for name, (i, d) in self.where.items()}


def _evaluator(size: fusion.Size) -> Callable[[Values], int]:
    """``size`` (an int or a symbolic expression) as a function of the symbols' values."""
    if isinstance(size, int):
        return lambda values: size
    code = compile(fusion.size_code(size), "<size>", "eval")
    return lambda values: int(eval(code, {"__builtins__": {}}, values))  # noqa: S307 - our own size source


def _layout_of(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """The strides eager gives a value, when they describe a dense tensor; else contiguous ones."""
    dense = True
    expected = 1
    for size, st in sorted(zip(shape, stride), key=lambda p: p[1]):
        if size != 1 and st != expected:
            dense = False
            break
        expected *= size
    if dense:
        return stride
    return torch._prims_common.make_contiguous_strides_for(shape) if shape else ()


def _layout(val: torch.Tensor) -> tuple[int, ...]:
    return _layout_of(tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride()))


def _output_of(val: torch.Tensor) -> Callable[[Values], tuple[tuple[int, ...], tuple[int, ...]]]:
    """(shape, strides) of an output at a call: fixed for a static value, evaluated for a symbolic one
    (strides eager's when they print as sizes, else contiguous)."""
    shape = [_evaluator(fusion.shape_of_value(val, d)) for d in range(val.dim())]
    try:
        strides: list[Callable[[Values], int]] | None = [
            _evaluator(fusion.stride_of_value(val, d)) for d in range(val.dim())
        ]
    except NotImplementedError:
        strides = None

    def at(values: Values) -> tuple[tuple[int, ...], tuple[int, ...]]:
        dims = tuple(f(values) for f in shape)
        if strides is None:
            return dims, tuple(torch._prims_common.make_contiguous_strides_for(dims)) if dims else ()
        return dims, _layout_of(dims, tuple(f(values) for f in strides))

    return at


class _Launch:
    """One kernel launch: allocate its outputs, pass pointers, strides and symbols, grid from the block config.

    With ``tune``, the first launch times every candidate block config (a few runs each; a kernel only
    writes its own outputs, so running it again is harmless) and keeps the fastest."""

    def __init__(
        self, ks: codegen.KernelSource, fn: Any, tune: bool, interpret: bool
    ) -> None:  # fn: a triton.JITFunction (fn[grid](...))
        assert ks.kernel is not None
        self.ks, self.fn, self.kernel, self.interpret = ks, fn, ks.kernel, interpret
        self.dtypes = [n.meta["val"].dtype for n in ks.outputs]
        self.static = ks.config is not None
        if self.static:
            outs = [(tuple(int(s) for s in n.meta["val"].shape), _layout(n.meta["val"])) for n in ks.outputs]
            self.outs: Callable[[Values], list[tuple[tuple[int, ...], tuple[int, ...]]]] = lambda values: outs
        else:
            at = [_output_of(n.meta["val"]) for n in ks.outputs]
            self.outs = lambda values: [f(values) for f in at]
        self.rows = _evaluator(codegen.rows_of(self.kernel))
        self.row_len = _evaluator(self.kernel.domain.row_len)
        self.numel = _evaluator(self.kernel.domain.numel)
        self.config = ks.config
        self.configs: dict[tuple[int, int], codegen.BlockConfig] = {}
        self.tune = tune and len(ks.candidates) > 1

    def _launch(self, cfg: codegen.BlockConfig, args: list[Any]) -> None:
        self.fn[(cfg.programs,)](*args, BLOCK_R=cfg.block_r, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps)

    def _autotune(self, args: list[Any], device: torch.device) -> None:
        def timed(cfg: codegen.BlockConfig) -> float:
            best = float("inf")
            for _ in range(3):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                self._launch(cfg, args)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                best = min(best, time.perf_counter() - t0)
            return best

        for cfg in self.ks.candidates:  # compile each first, untimed
            self._launch(cfg, args)
        self.config = min(self.ks.candidates, key=timed)
        self.tune = False

    def _config_at(self, values: Values) -> codegen.BlockConfig | None:
        """This call's block config; None when the sizes are beyond what the kernel was written for."""
        if self.config is not None:
            return self.config
        rows, row_len = self.rows(values), self.row_len(values)
        if row_len > fusion.MAX_ROW or self.numel(values) >= 2**31:
            return None
        key = (rows, row_len)
        if key not in self.configs:
            self.configs[key] = codegen.block_config(self.kernel, self.interpret, rows, row_len)
        return self.configs[key]

    def __call__(self, env: dict[fx.Node, Any], values: Values, device: torch.device) -> None:
        cfg = self._config_at(values)
        if cfg is None:
            _aten(self.kernel.nodes, self.ks.outputs, env)
            return
        outs = [
            torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for (shape, stride), dtype in zip(self.outs(values), self.dtypes)
        ]
        if not any(t.numel() == 0 for t in outs):
            args: list[Any] = []
            for node in self.ks.inputs:
                t = env[node]
                args.append(t)
                args.extend(t.stride())
            for t in outs:
                args.append(t)
                args.extend(t.stride())
            args.extend(values[f"sym_{sym}"] for sym in self.ks.symbols)
            if self.tune:
                self._autotune(args, device)
                cfg = self.config
            assert cfg is not None
            self._launch(cfg, args)
        for node, t in zip(self.ks.outputs, outs):
            env[node] = t


def _target(node: fx.Node) -> Callable[..., Any]:
    target: Callable[..., Any] = node.target  # type: ignore[assignment]  # a call_function node's target is a callable
    if target in (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default):
        return torch.ops.aten.reshape.default  # our buffers may be laid out unlike eager's
    return target


def _fetch(a: Any, env: dict[fx.Node, Any]) -> Any:
    if isinstance(a, fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_fetch(x, env) for x in a)
    return a


def _aten(nodes: Sequence[fx.Node], outputs: Sequence[fx.Node], env: dict[fx.Node, Any]) -> None:
    """A kernel's ops one by one in ATen (a call whose sizes the kernel was not written for)."""
    local = dict(env)
    for node in nodes:
        local[node] = _target(node)(*_fetch(node.args, local), **_fetch(dict(node.kwargs), local))
    for node in outputs:
        env[node] = local[node]


def _extern(node: fx.Node) -> Callable[[dict[fx.Node, Any], Values], None]:
    target = _target(node)

    def run(env: dict[fx.Node, Any], values: Values) -> None:
        env[node] = target(*_fetch(node.args, env), **_fetch(dict(node.kwargs), env))

    return run


class CompiledTritonGraph:
    """The compiled callable: ``kernel_count`` kernels and the ATen calls between them."""

    def __init__(self, ir: GraphIR, steps: list[Any], launches: list[_Launch], device: torch.device) -> None:
        self.ir = ir
        self.sizes = _Sizes(ir)
        self.launches = launches
        self.sources = [launch.ks for launch in launches]
        self.kernel_count = len(launches)
        self.device = device
        self._placeholders = ir.placeholders
        self._constants = {n: getattr(ir.gm, str(n.target)) for n in ir.graph.nodes if n.op == "get_attr"}
        self._outputs = ir.outputs
        self._steps = steps
        # free each intermediate after its last use
        last: dict[fx.Node, int] = {}
        for i, step in enumerate(steps):
            for n in step[1]:
                last[n] = i
        keep = {o for o in self._outputs if isinstance(o, fx.Node)}
        self._free = [[n for n, j in last.items() if j == i and n not in keep] for i in range(len(steps))]

    def __call__(self, *args: Any) -> list[Any]:
        env: dict[fx.Node, Any] = dict(zip(self._placeholders, args))
        env.update(self._constants)
        values = self.sizes.values(args)
        for (run, _), free in zip(self._steps, self._free):
            run(env, values)
            for n in free:
                env.pop(n, None)
        return [env[o] if isinstance(o, fx.Node) else o for o in self._outputs]


def compile_graph(ir: GraphIR, example_inputs: Sequence[Any], *, autotune: bool = False) -> CompiledTritonGraph:
    """Plan, generate, load, run once. ``autotune``: time a few block configs per kernel on that run.
    Raises (NotImplementedError, triton's errors) when it cannot."""
    device = next((t.device for t in example_inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    interpret = interpreting()
    if device.type != "cuda" and not interpret:
        raise RuntimeError(
            f"triton kernels run on CUDA tensors (got {device.type}); set TRITON_INTERPRET=1 "
            "before anything imports triton to run them in the CPU interpreter"
        )
    for node in ir.graph.nodes:  # constants embedded in the graph are read like inputs
        if node.op == "get_attr" and "val" not in node.meta:
            node.meta["val"] = getattr(ir.gm, str(node.target))
    plan = fusion.plan(ir.graph)
    debug = debug_dir()
    steps: list[tuple[Callable[[dict[fx.Node, Any], Values], None], list[fx.Node]]] = []
    sources: list[codegen.KernelSource] = []
    launches: list[_Launch] = []
    stem = "".join(ch if ch.isalnum() else "_" for ch in ir.name)
    for step in plan:
        if isinstance(step, fusion.Extern):
            steps.append((_extern(step.node), list(step.node.all_input_nodes)))
            continue
        ks = codegen.generate(step, interpret)
        if debug is not None:
            Path(debug).mkdir(parents=True, exist_ok=True)
            (Path(debug) / f"{stem}_{len(sources)}_{ks.name}.py").write_text(ks.source)
        sources.append(ks)
        launch = _Launch(ks, _load(ks), autotune, interpret)
        launches.append(launch)
        steps.append((functools.partial(launch, device=device), list(ks.inputs)))
    compiled = CompiledTritonGraph(ir, steps, launches, device)
    compiled(*example_inputs)  # Triton compiles at first launch: let its errors come from compile()
    return compiled
