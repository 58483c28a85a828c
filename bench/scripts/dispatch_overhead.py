"""What torchmux adds to every call: a tiny model where the work is small and the overhead shows.

    python -m torchmux.bench.scripts.dispatch_overhead [--layers 10] [--calls 2000] [--rounds 7] [--parts]
    python -m torchmux.bench.scripts.dispatch_overhead --model resnet [--batch-size 8]
    python -m torchmux.bench.scripts.dispatch_overhead --model resnet --export [--batch-size 8]

Ten 4x4 Linear layers on a 2x4 input, one thread, under ``torch.no_grad()``:

- eager, ``torch.compile`` (Inductor) and ``torchmux.compile(backend="inductor")`` with the mend pass
  on (the default) and off. They run the same ATen ops or Inductor code (torchmux's frozen); the
  difference is what happens around them: Dynamo's guards and AOTAutograd's wrapper (torch.compile's
  cost too), plus torchmux's (its runner's lookup, the frozen weights' check, the verify policy's
  input scan, the mend pass's Python wrappers);
- ONNX Runtime used directly (``torch.onnx.export(..., dynamo=True)`` and an ``InferenceSession`` fed
  NumPy arrays, the bench's ``onnxruntime-export``) and ``torchmux.compile(backend="onnxruntime")``:
  the same session work, and what torchmux (and Dynamo under it) adds to each call.

``--model NAME`` (a bench zoo model) asks where torchmux's ONNX Runtime backend loses to ONNX Runtime
used directly on a real model: it times the direct path, the same session torchmux built called on
its own, torchmux's own layers around it with no Dynamo (what a call that skipped Dynamo would cost:
a module call, a check of the inputs' specs, grad mode and ``training`` flags, the frozen weights'
check and the verify policy), that session behind Dynamo alone (a Dynamo backend that calls it: the
floor of any Dynamo-based system, torch.compile included), the same with Dynamo's guards filtered out
(unsafe; only to split Dynamo's floor into its guards and the rest), and torchmux's call. Dynamo's per-call cost grows with
the model's guards (one per parameter, module attribute, config value) and, after a run that walked
megabytes of weights, with the CPU cache misses its guard tree and frames then take: ~20 us between
back-to-back calls, ~100 us (ResNet) to ~200 us (T5) after a real model's run.

``--model NAME --export`` times a package (``torchmux.export`` saved and loaded with ``torchmux.load``)
against the library used directly: ONNX Runtime direct against ``torchmux-export:onnxruntime`` (and the
package's own session called alone: the difference to direct is the model ONNX Runtime runs, the rest
is the package's call), and
AOTInductor's loaded package called as its docs show (``loaded(*args)``) and through its loader's
``boxed_run`` (the floor: no pytree work) against ``torchmux-export:inductor``. What the package adds
is its input check and the output's structure.

The systems run in interleaved rounds of ``--calls`` calls (machine noise hits them alike); each
figure is the best round, in microseconds per call of the calling thread's CPU time: everything runs
in that thread (one thread; Inductor's code and ONNX Runtime at one intra-op thread run in the
caller's), so the time other jobs on a shared machine take from it is left out. ``--parts`` also times the layers of one torchmux
call from the inside out (the backend's compiled graph, the Guard that applies the verify policy, the
frozen weights' check, the GraphRunner, then everything above it: Dynamo, AOTAutograd, the API's
wrappers), so the differences between rows say where the time goes.
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

import torchmux


class Stack(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """Best of five runs of ``calls`` calls, in microseconds per call (one system alone)."""
    return interleaved({"fn": fn}, calls, 5)["fn"]


def interleaved(
    fns: dict[str, Callable[[], Any]], calls: int, rounds: int, clock: Callable[[], float] = time.thread_time
) -> dict[str, float]:
    """Each round times every function for ``calls`` calls; a function's figure is its best round (us/call)."""
    for fn in fns.values():
        for _ in range(50):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = clock()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (clock() - t0) / calls * 1e6)
    return best


def _onnxruntime(model: torch.nn.Module) -> dict[str, Callable[..., Any]]:
    try:
        import onnxruntime  # noqa: F401 -- only whether it is there
    except ImportError:
        return {}
    from torchmux.bench.run import ONNX_EXPORT, make_compiled

    return {
        "onnxruntime direct": make_compiled(ONNX_EXPORT, model, threads=1),
        "torchmux onnxruntime": torchmux.compile(
            model, backend="onnxruntime", options={"onnxruntime.intra_op_num_threads": 1}
        ),
    }


def parts(compiled: Callable[..., Any], x: torch.Tensor, calls: int, rounds: int) -> dict[str, float]:
    """The layers of one call of ``compiled`` (a torchmux model of one graph), innermost first (us/call)."""

    runner, args = _runner_of(compiled, (x,))
    (frozen,) = runner._fns.values()  # FrozenCall (weights as constants) around the Guard
    guard = getattr(frozen, "fn", frozen)
    user = frozen._user(args) if hasattr(frozen, "_user") else args
    return interleaved(
        {
            "backend's compiled graph": lambda: guard.fn(*user),
            "+ Guard (verify policy)": lambda: guard(*user),
            "+ frozen weights' check": lambda: frozen(*args),
            "+ GraphRunner": lambda: runner(*args),
            "+ Dynamo, AOTAutograd, API": lambda: compiled(x),
        },
        calls,
        rounds,
    )


def zoo_floor(name: str, batch: int, calls: int, rounds: int) -> dict[str, float]:
    """``--model``: ONNX Runtime direct, torchmux's session alone, behind Dynamo alone, torchmux (us/call)."""
    from torchmux.bench.run import ONNX_EXPORT, make_compiled
    from torchmux.bench.zoo import build

    model, args = build(name, batch)
    direct = make_compiled(ONNX_EXPORT, model, threads=1)
    compiled = torchmux.compile(model, backend="onnxruntime", options={"onnxruntime.intra_op_num_threads": 1})
    no_replay = torchmux.compile(
        model, backend="onnxruntime", options={"onnxruntime.intra_op_num_threads": 1, "replay": False}
    )
    with torch.no_grad():
        direct(*args)
        compiled(*args)
        no_replay(*args)
        runner, runner_args = _runner_of(compiled, args)
        (frozen,) = runner._fns.values()  # FrozenCall around the Guard around the OrtGraph
        session, user = frozen.fn.fn, frozen._user(runner_args)

        def floor_backend(gm: Any, example_inputs: Any) -> Callable[..., Any]:
            return lambda *a: session(*frozen._user(a))

        behind_dynamo = torch.compile(model, backend=floor_backend)
        behind_dynamo(*args)
        unguarded = torch.compile(model, backend=floor_backend, options={"guard_filter_fn": _no_guards})
        unguarded(*args)
        return interleaved(
            {
                "onnxruntime direct": lambda: direct(*args),
                "torchmux's session alone": lambda: session(*user),
                "torchmux's layers, no Dynamo": _without_dynamo(model, args, frozen, runner_args),
                "the session behind Dynamo": lambda: behind_dynamo(*args),
                "  same, Dynamo's guards off": lambda: unguarded(*args),
                "torchmux onnxruntime": lambda: compiled(*args),
                "  same, replay off": lambda: no_replay(*args),
            },
            calls,
            rounds,
        )


def export_overhead(name: str, batch: int, calls: int, rounds: int) -> dict[str, float]:
    """``--model --export``: each library used directly against torchmux's package of it (us/call)."""
    import os
    import tempfile

    from torch._inductor import aoti_compile_and_package, aoti_load_package

    from torchmux.bench.run import ONNX_EXPORT, make_compiled
    from torchmux.bench.zoo import build

    model, args = build(name, batch)
    folder = tempfile.mkdtemp(prefix="torchmux-export-overhead-")
    direct = make_compiled(ONNX_EXPORT, model, threads=1)
    options = {"onnxruntime.intra_op_num_threads": 1}
    ort_pkg = torchmux.load(
        torchmux.export(model, args, backend="onnxruntime", options=options).save(os.path.join(folder, "o.tmux"))
    )
    with torch.no_grad():
        path = aoti_compile_and_package(torch.export.export(model, args), package_path=os.path.join(folder, "m.pt2"))
    aoti = aoti_load_package(path)
    boxed = aoti.loader.boxed_run
    aoti_pkg = torchmux.load(torchmux.export(model, args, backend="inductor").save(os.path.join(folder, "i.tmux")))
    ort_alone = ort_pkg._fn  # the package's session with no input check and no output structure
    with torch.no_grad():
        for fn in (direct, ort_pkg, aoti, aoti_pkg):
            fn(*args)
        return interleaved(
            {
                "onnxruntime direct": lambda: direct(*args),
                "  the package's onnxruntime session alone": lambda: ort_alone(*args),
                "torchmux-export:onnxruntime": lambda: ort_pkg(*args),
                "aoti (loaded(*args))": lambda: aoti(*args),
                "aoti loader.boxed_run": lambda: boxed(list(args)),
                "torchmux-export:inductor": lambda: aoti_pkg(*args),
            },
            calls,
            rounds,
        )


def _no_guards(entries: Sequence[Any]) -> list[bool]:
    return [False] * len(entries)  # unsafe: for measuring what Dynamo's guards cost, nothing else


def _without_dynamo(
    model: torch.nn.Module, args: Sequence[Any], frozen: Any, runner_args: Sequence[Any]
) -> Callable[[], Any]:
    """What a call would cost with torchmux's own layers (frozen weights' check, verify policy, session)
    and no Dynamo under them: the module's ``__call__`` (hooks and all), a check of each input's
    shape, dtype and strides and of grad mode, every submodule's ``training`` flag, then the frozen call
    on the arguments Dynamo passed (the weights, then the input). A measurement of a design, not one."""
    specs = [(a.shape, a.dtype, a.stride()) for a in args]
    modules = list(model.modules())
    training = [m.training for m in modules]
    grad = torch.is_grad_enabled()

    class Replay(torch.nn.Module):
        def forward(self, *xs: Any) -> Any:
            if (
                torch.is_grad_enabled() is not grad
                or [(x.shape, x.dtype, x.stride()) for x in xs] != specs
                or [m.training for m in modules] != training
            ):
                raise RuntimeError("would fall back to Dynamo")
            return frozen(*runner_args)

    replay = Replay()
    return lambda: replay(*args)


def _runner_of(compiled: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, tuple]:
    """The GraphRunner one call of ``compiled`` (a model of one graph) goes through, and its arguments."""
    from torchmux.autotune.runner import GraphRunner

    seen: dict[str, Any] = {}
    call = GraphRunner.__call__

    def recording_call(self: GraphRunner, *a: Any) -> Any:
        seen["runner"], seen["args"] = self, a
        return call(self, *a)

    GraphRunner.__call__ = recording_call  # type: ignore[method-assign]
    try:
        compiled(*args)
    finally:
        GraphRunner.__call__ = call  # type: ignore[method-assign]
    return seen["runner"], seen["args"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parts", action="store_true", help="also time the layers of one torchmux call")
    ap.add_argument("--model", help="a bench zoo model: where torchmux onnxruntime's time goes on it (see above)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--export", action="store_true", help="with --model: packages against the libraries used directly")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if a.model and a.export:
        figures = export_overhead(a.model, a.batch_size, max(1, a.calls // 20), a.rounds)
        print(f"{a.model}, batch {a.batch_size}, 1 thread: {'system':28s} {'us/call':>9s} {'vs direct':>10s}")
        for name, us in figures.items():
            base = figures["onnxruntime direct" if "onnxruntime" in name else "aoti (loaded(*args))"]
            print(f"{'':28s}{name:28s} {us:9.1f} {us - base:+9.1f}")
        return
    if a.model:
        floor = zoo_floor(a.model, a.batch_size, max(1, a.calls // 20), a.rounds)
        direct = floor["onnxruntime direct"]
        print(f"{a.model}, batch {a.batch_size}, 1 thread: {'system':26s} {'us/call':>9s} {'vs direct':>10s}")
        for name, us in floor.items():
            print(f"{'':28s}{name:26s} {us:9.1f} {us / direct:9.3f}x")
        return
    model, x = Stack(a.layers).eval(), torch.randn(2, 4)
    systems = {
        "eager": model,
        "torch.compile": torch.compile(model),
        "torchmux inductor": torchmux.compile(model, backend="inductor"),
        "torchmux inductor, mend off": torchmux.compile(model, backend="inductor", options={"mend": False}),
        "torchmux inductor, replay off": torchmux.compile(model, backend="inductor", options={"replay": False}),
        # unfrozen: the same Inductor code as torch.compile's (frozen, each Linear calls MKL from Python)
        "torchmux inductor, freeze off": torchmux.compile(model, backend="inductor", options={"freeze": False}),
        **_onnxruntime(model),
    }
    with torch.no_grad():
        for fn in systems.values():
            fn(x)  # compile
        figures = interleaved({name: functools.partial(fn, x) for name, fn in systems.items()}, a.calls, a.rounds)
        inside = parts(systems["torchmux inductor"], x, a.calls, a.rounds) if a.parts else {}
    base = figures["torch.compile"]
    print(f"{'system':30s} {'us/call':>8s} {'vs torch.compile':>17s}")
    for name, us in figures.items():
        if "onnxruntime" not in name:
            print(f"{name:30s} {us:8.1f} {us - base:+16.1f}")
    if "onnxruntime direct" in figures:
        direct = figures["onnxruntime direct"]
        print(f"\n{'system':30s} {'us/call':>8s} {'vs onnxruntime direct':>22s}")
        for name in ("onnxruntime direct", "torchmux onnxruntime"):
            print(f"{name:30s} {figures[name]:8.1f} {figures[name] - direct:+21.1f}")
    if inside:
        print(f"\n{'torchmux inductor, inside out':30s} {'us/call':>8s} {'this layer':>11s}")
        previous = 0.0
        for name, us in inside.items():
            print(f"{name:30s} {us:8.1f} {us - previous:+11.1f}")
            previous = us


if __name__ == "__main__":
    main()
