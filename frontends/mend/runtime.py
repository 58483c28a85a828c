"""What mended code calls at run time (the rule modules emit calls to these, through ``_mend_rt``).

Everything here is plain Python that Dynamo inlines; each test below is decided while Dynamo traces
(types, shapes, dtypes, grad mode, module types), so it costs nothing in the graph.

- :func:`deferred` is the one function put in ``torch._dynamo.config.reorderable_logging_functions``:
  Dynamo moves the call to after the graph and passes it the graph's tensors. It replays a print, a
  ``warnings.warn``, a logging call, a ``.item()`` or a failed check exactly as the user wrote it,
  with the user's file and line. Outside Dynamo it simply runs at once.
- :func:`pred`, :func:`mergeable`, :func:`merge`, :func:`pure_module`: the runtime guards of the
  if/else rewrite. When a guard says no, the mended code runs the user's original statements.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch._dynamo.comptime import comptime
from torch.fx.experimental.symbolic_shapes import statically_known_true

try:
    import numpy

    _np: Any = numpy
except ImportError:  # no NumPy: the rule that calls size_prod finds no np.prod to rewrite
    _np = None

# --- deferred effects --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    """One print/warn/log/check site, registered when its function was mended."""

    kind: str  # "print", "warn", "log", "item", "check"
    callee: Callable[[dict[str, Any]], Any] | None  # evaluates the callee (or exception class) in the user's globals
    globals: dict[str, Any]
    filename: str
    lineno: int
    funcname: str
    parts: tuple[Any, ...]  # how to rebuild the positional arguments from the runtime values (see _rebuild)
    kwargs: tuple[tuple[str, Any], ...] = ()  # constant keyword arguments
    guarded: int = 0  # 1: first runtime value is a predicate, run only if true; -1: only if false
    level: int = 0  # the logging level for kind "log"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Lazy:
    """A global expression (``sys.stderr``) evaluated when the effect is replayed."""

    get: Callable[[dict[str, Any]], Any]


EFFECTS: list[Effect] = []
NOTES: list[str] = []  # every rewrite applied, "file:line: what"
FIRED: set[int] = set()  # the NOTES keys Dynamo traced through (what explain reports)
#: NOTES key -> (file, first line, last line, wide) of the statement a rewrite replaced; ``wide``: the
#: rewrite changes a value read after that statement (``verdict`` judges breaks by these)
SPANS: dict[int, tuple[str, int, int, bool]] = {}


def note(text: str) -> int:
    NOTES.append(text)
    return len(NOTES) - 1


def fired(key: int) -> bool:
    """Record, while Dynamo traces (``comptime``; nothing at run time), that rewrite ``key`` took effect."""
    comptime(lambda ctx: _record(ctx.get_local("key")))
    return True


def _record(key: Any) -> None:
    # a runtime helper compiled as a frame of its own (after a break in its caller) may see its key as a
    # symbolic int once it recompiles: then the rewrite is not reported rather than failing the trace
    if key.is_python_constant():
        FIRED.add(key.as_python_constant())


def register(effect: Effect) -> int:
    EFFECTS.append(effect)
    return len(EFFECTS) - 1


def _deferred(key: int, *values: Any) -> None:
    """Perform effect ``key`` with the runtime ``values`` (reordered after the graph by Dynamo)."""
    effect = EFFECTS[key]
    if effect.kind == "check" and torch.compiler.is_exporting() and isinstance(values[0], torch.Tensor):
        _export_check(effect, values[0])
        return
    if effect.guarded:
        taken, values = bool(values[0]), values[1:]
        if taken != (effect.guarded > 0):
            return
    args = [_rebuild(p, values) for p in effect.parts]
    kwargs = {k: v.get(effect.globals) if isinstance(v, Lazy) else v for k, v in effect.kwargs}
    if effect.kind == "item":  # a .item() whose value nobody used: still raise what it would raise
        for v in args:
            v.item()
        return
    assert effect.callee is not None  # every effect but "item" (returned above) names its callee
    callee = effect.callee(effect.globals)
    if effect.kind == "check":
        if bool(args[0]) == effect.extra["raise_if"]:
            error = callee(*args[1:])
            if hasattr(error, "add_note"):  # Python 3.11+
                error.add_note(
                    f"(checked by torchmux after the graph; the check is at {effect.filename}:{effect.lineno})"
                )
            raise error
        return
    if effect.kind == "print":
        print(*args, **kwargs)
    elif effect.kind == "warn" and callee is warnings.warn:
        _warn(effect, *args, **kwargs)
    elif effect.kind == "log" and _is_logger_method(callee):
        _log(effect, callee.__self__, *args)
    elif effect.kind == "log" and callee is getattr(logging, callee.__name__, None):
        root = logging.getLogger()
        if not root.handlers:
            logging.basicConfig()
        _log(effect, root, *args)
    else:  # the name now means something else: call it as written
        callee(*args, **kwargs)


def _export_check(effect: Effect, test: torch.Tensor) -> None:
    """A check while ``torch.export`` traces the mended code (non-strict: this runs as Python): there is
    no "after the graph" in an exported program, so the check becomes ``torch._check`` on the test's
    value, which export keeps as a runtime assertion in the program. On data that fails it the program
    raises a RuntimeError naming the user's exception and line (the user's message when it is a
    constant), where eager raised the exception itself."""
    ok = as_bool(test)
    if effect.extra["raise_if"]:
        ok = torch.logical_not(ok)
    exc = effect.callee(effect.globals) if effect.callee is not None else None
    said = [str(p[1]) for p in effect.parts[1:] if p[0] == "const"]
    what = f"{getattr(exc, '__name__', 'AssertionError')}" + (f": {' '.join(said)}" if said else "")
    torch._check(ok.item(), lambda: f"{what} (the check at {effect.filename}:{effect.lineno}, kept by torchmux.export)")


#: what mended code calls; Dynamo must never trace into it (it runs between graphs, as plain Python)
deferred = torch.compiler.disable(_deferred, recursive=True)


_CONVERSIONS: dict[str, Callable[[object], str]] = {"r": repr, "s": str, "a": ascii}  # f"{x!r}", !s, !a


def _rebuild(part: Any, values: tuple[Any, ...]) -> Any:
    """A part is ("const", v), ("value", i, converts), ("fstring", pieces) or ("percent", fmt, parts, is_tuple)."""
    tag = part[0]
    if tag == "const":
        return part[1]
    if tag == "value":
        return _convert(values[part[1]], part[2])
    if tag == "fstring":
        out = []
        for piece in part[1]:
            if isinstance(piece, str):
                out.append(piece)
                continue
            index, convert, conversion, spec = piece
            v = _convert(values[index], convert)
            v = _CONVERSIONS[conversion](v) if conversion else v
            out.append(format(v, _rebuild(spec, values) if spec is not None else ""))
        return "".join(out)
    if tag == "percent":  # "fmt" % x or "fmt" % (x, y)
        items = tuple(_rebuild(p, values) for p in part[2])
        return part[1] % (items if part[3] else items[0])
    raise AssertionError(part)


def _convert(value: Any, converts: tuple[str, ...]) -> Any:
    """Apply the conversions the rewrite moved out of the graph, innermost first."""
    for c in converts:
        if c == "item":
            value = value.item()
        elif c == "tolist":
            value = value.tolist()
        elif c == "size":
            value = torch.Size(value.tolist()) if isinstance(value, torch.Tensor) else value
        else:
            value = {"int": int, "float": float, "bool": bool}[c](value)
    return value


def drawn(value: Any, lo: Any, hi: Any) -> Any:
    """``random.randint(lo, hi)``'s number, said to lie in ``[lo, hi]`` (:mod:`.items`). Dynamo draws it
    as a tensor and reads it back as an unbacked size; ``torch._check`` gives that size its range, so a
    test the range decides (``x[:, start:]`` is at least ``size`` long) needs no branch. Outside Dynamo:
    the int itself, the checks true."""
    value = int(value)
    torch._check(value >= lo)
    torch._check(value <= hi)
    return value


def size_prod(note: int, value: Any, array: bool) -> Any:
    """``np.prod(value)`` (``np.prod(np.array(value))`` with ``array``) (:mod:`.items`): while Dynamo
    traces a shape (a ``torch.Size``, or a non-empty tuple or list of ints or symbolic ints), the product
    of its sizes as Python computes it; NumPy's, as written, otherwise."""
    if (
        torch.compiler.is_compiling()
        and isinstance(value, (tuple, list))
        and value
        and all(type(d) is int or isinstance(d, torch.SymInt) for d in value)
    ):
        fired(note)
        out = 1
        for d in value:
            out = out * d
        return out
    return _np.prod(_np.array(value)) if array else _np.prod(value)


def grid(note: int, nd_grid: Any, bounds: tuple[tuple[Any, Any, Any], ...], several: bool, sparse: bool) -> Any:
    """``nd_grid[s0, s1, ...]`` (``np.mgrid``, or ``np.ogrid`` with ``sparse``; ``bounds`` each slice's
    start, stop, step; ``several``: the key was a tuple) (:mod:`.items`): while Dynamo traces and every
    bound is a Python number, the same grid from ``np.arange`` (``np.linspace`` for NumPy's complex step, a
    number of points, the stop included) and ``np.meshgrid(..., indexing="ij")``, which it traces; the
    subscript as written otherwise."""
    numbers = all(
        (b is None and i != 1) or type(b) in (int, float, complex) for part in bounds for i, b in enumerate(part)
    )
    if not (torch.compiler.is_compiling() and numbers):
        key = tuple(slice(*part) for part in bounds)
        return nd_grid[key if several else key[0]]
    fired(note)
    axes = []
    floats = any(type(b) in (float, complex) for part in bounds for b in part)  # NumPy's grid: float throughout
    for start, stop, step in bounds:
        start = 0 if start is None else start
        if isinstance(step, complex):
            axes.append(_np.linspace(start, stop, int(abs(step))))
        else:
            axes.append(_np.arange(float(start) if floats else start, stop, 1 if step is None else step))
    if not several:
        return axes[0]
    if sparse:
        return tuple(_np.meshgrid(*axes, indexing="ij", sparse=True))
    return _np.stack(_np.meshgrid(*axes, indexing="ij"))


def size_in(v: Any) -> Any:
    """A torch.Size as a tensor, so it can leave the graph with a deferred log (``torch.Size`` cannot)."""
    return torch.tensor(list(v), dtype=torch.int64) if isinstance(v, torch.Size) else v


def _warn(effect: Effect, message: Any, category: Any = None, stacklevel: int = 1, *rest: Any) -> None:
    if isinstance(message, Warning):
        category = message.__class__
    category = category or UserWarning
    module = effect.globals.get("__name__", "<string>")
    registry = effect.globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category, effect.filename, effect.lineno, module, registry, effect.globals)


def _is_logger_method(callee: Any) -> bool:
    return isinstance(getattr(callee, "__self__", None), logging.Logger) and callee.__name__ in _LEVELS


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


def _log(effect: Effect, logger: logging.Logger, msg: Any, *args: Any) -> None:
    if not logger.isEnabledFor(effect.level):
        return
    record = logger.makeRecord(
        logger.name, effect.level, effect.filename, effect.lineno, msg, args, None, effect.funcname
    )
    logger.handle(record)


# --- the if/else rewrite's guards --------------------------------------------------------------------

#: modules whose forward has no side effect, draws no random numbers and cannot raise on some data
#: (not nn.Embedding: an index out of range raises)
_PURE_MODULES = (
    nn.Linear,
    nn.Bilinear,
    nn.Identity,
    nn.Flatten,
    nn.Unflatten,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.LocalResponseNorm,
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Sigmoid,
    nn.Tanh,
    nn.Softmax,
    nn.LogSoftmax,
    nn.ELU,
    nn.LeakyReLU,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Softplus,
    nn.PReLU,
    nn.SELU,
    nn.CELU,
    nn.GLU,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool2d,
)
#: modules that draw random numbers or update statistics in training mode only
_PURE_IN_EVAL = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
)


#: the rule for each kind above, in one dict: looking a type up in a dict costs Dynamo one lookup where
#: ``type(m) in <tuple>`` builds (and guards) a variable for every type it compares with, ~2 ms a call
_KINDS: dict[type, str] = {**dict.fromkeys(_PURE_MODULES, "pure"), **dict.fromkeys(_PURE_IN_EVAL, "eval")}
_KINDS[nn.Sequential] = "sequential"


#: user module classes whose ``forward`` the mend pass read as side-effect free (``analysis.pure_forward``):
#: class -> (that forward, the ``self.<name>`` modules it calls)
PURE_FORWARDS: dict[type, tuple[Any, tuple[str, ...]]] = {}


def pure_module(m: Any) -> bool:
    """True if calling ``m`` has no side effect: a built-in torch.nn module of a known kind, a Sequential
    of such, or a user module whose forward only computes values from pure modules (no hooks, no forward
    set on the instance)."""
    kind = type(m)
    rule = _KINDS.get(kind)
    if rule == "pure":
        return True
    if rule == "sequential":
        return _all_pure(m)
    if rule == "eval":
        return not m.training
    if kind in PURE_FORWARDS:
        forward, calls = PURE_FORWARDS[kind]
        if kind.forward is not forward or m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__:
            return False
        for name in calls:
            if not pure_module(getattr(m, name)):
                return False
        return True
    return False


def data_test(p: Any) -> Any:
    """An if-test's value. A bool Dynamo holds symbolically (a comparison of a float ``.item()`` inside a
    helper, or of a data-dependent size such as ``t[mask].numel() > 0``) becomes a 0-d bool tensor, so the
    rules can select in the graph; Python asked for it would break the graph. Unless what Dynamo knows of
    its sizes decides it without a guard (``statically_known_true``: a crop ``x[:, n:]`` with ``n`` in a
    range that :func:`drawn` or a ``torch._check`` gave): then it is that constant, and the user's if runs
    as written, in the graph. Anything else is unchanged (a constant bool is not a tensor test:
    ``p is True or p is False`` holds only for those)."""
    if torch.compiler.is_compiling() and isinstance(p, bool) and not (p is True or p is False):
        if statically_known_true(p):
            return True
        if statically_known_true(torch.sym_not(p)):
            return False
        return torch.scalar_tensor(p, dtype=torch.bool)
    return p


def pred(p: Any) -> bool:
    """True if ``p`` is a one-element tensor: the if/else on it can become a select in the graph."""
    return isinstance(p, torch.Tensor) and p.numel() == 1 and p.device.type != "meta"


def as_bool(p: torch.Tensor) -> torch.Tensor:
    """``p`` (one element) as a 0-d bool tensor; ``p`` itself when it is one already (a masked loop's
    state): no more nodes in the graph, nor work for Dynamo."""
    if p.dtype == torch.bool and p.dim() == 0:
        return p
    return p.reshape(()).bool()


def mergeable(p: torch.Tensor, a: Any, b: Any, computed: bool = False) -> bool:
    """True if ``torch.where`` gives exactly what the chosen branch gives, values and gradients.

    Tensors must agree in shape, dtype and device (no broadcasting, no promotion). Under autograd the
    branch not taken would receive zero gradients, which can turn into NaN through a singular
    derivative, so a tensor that needs gradients is not merged (torch.cond is used instead), unless
    ``computed``: both values were computed before the choice (a masked loop's old and new values, both
    sides of a conditional expression). Then torch.cond could only pick between them too, and its
    backward gives the operands its branch did not use zero gradients, as ``torch.where``'s does: the
    same values and gradients, without tracing two subgraphs per choice.
    """
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        for x, y in zip(a, b):  # a loop, not all(<generator>): each call Dynamo traces costs ~0.7 ms
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):  # the tensor case below, inline
                if not computed and torch.is_grad_enabled() and (x.requires_grad or y.requires_grad):
                    return False
                if not (x.shape == y.shape and x.dtype == y.dtype and x.device == y.device == p.device):
                    return False
            elif not mergeable(p, x, y, computed):
                return False
        return True
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if not computed and torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and p.device == a.device
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    return a is b or (type(a) is type(b) and type(a) in (int, float, bool, str) and a == b)


def cond_ok(p: torch.Tensor, a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """True if both branches give tensors ``torch.cond`` can join (same shape, dtype and device)."""
    return all(
        isinstance(x, torch.Tensor)
        and isinstance(y, torch.Tensor)
        and x.shape == y.shape
        and x.dtype == y.dtype
        and x.device == y.device
        for x, y in zip(a, b)
    )


def snap(v: Any) -> Any:
    """A copy of a logged tensor, taken where the log was, for functions that change tensors in place."""
    return v.clone() if isinstance(v, torch.Tensor) else v


def merge(p: torch.Tensor, a: Any, b: Any) -> Any:
    if isinstance(a, (tuple, list)):
        p, out = as_bool(p), []
        for x, y in zip(a, b):  # not a comprehension: its own function for Dynamo to trace (Python 3.11)
            out.append(torch.where(p, x, y) if isinstance(x, torch.Tensor) else merge(p, x, y))
        return type(a)(out)
    if isinstance(a, torch.Tensor):
        return torch.where(as_bool(p), a, b)
    return a


def exact(x: Any) -> Any:
    """``x.item()`` in an if-test or check, kept in the graph where that is exact: a floating one-element
    tensor becomes a float64 0-d tensor (every float16/bfloat16/float32/float64 value is a float64, and
    float64 arithmetic and comparisons are what Python's floats do). Anything else (integer tensors,
    whose promotion against a Python float would round) is ``.item()``-ed as the user wrote it."""
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() == 1 and x.device.type != "meta":
        return x.reshape(()).double()
    return x.item()


def not_(x: Any) -> Any:
    """``not x`` of an if-test: a one-element tensor stays a (bool) tensor, anything else is Python's."""
    if isinstance(x, torch.Tensor) and x.numel() == 1 and x.device.type != "meta":
        return torch.logical_not(x.reshape(()))
    return not x


def pick(note: int, p: Any, a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    """A nested if on a tensor, lowered: both branches ran (they have no side effects); keep the values
    of the one ``p`` takes. A select in the graph when the values can merge; otherwise Python decides
    (a graph break there, never another value)."""
    if pred(p) and mergeable(p, a, b):
        fired(note)
        return merge(p, a, b)
    return a if p else b


#: False while a program that torch.cond refused runs (see ``switches.cond_refused``): its rewritten ifs
#: then branch in Python. Each program's entry sets it to its own state around its call; Dynamo guards on it
COND = True


#: how many times Dynamo traced a torch.cond of ours (``mend.scoped`` retries a failed trace only then)
COND_TRACES = 0


def _count_cond() -> None:
    global COND_TRACES
    COND_TRACES += 1


#: the break :func:`_on_data_dependent_size` makes, as ``torchmux.explain`` words it (at the user's if)
DATA_DEPENDENT_IF = (
    "an if on a data-dependent size branches in Python: torch.cond cannot take branches that use tensors "
    "of that size (torch.where is used where both sides can run)"
)


def _on_data_dependent_size(ctx: Any) -> None:
    """While Dynamo traces :func:`cond`: a predicate that tests a data-dependent size (``data_test`` of
    ``t[mask].size(0) == 0``) breaks the graph here, and the if runs in Python (the plain if below, as
    eager runs it). ``torch.cond`` refuses such branches (they close over tensors of that size: torch 2.13
    "could not guard on Eq(5*u0, 0)"), and a refused trace costs a whole second trace of the frame (the
    entry's retry, with every rewritten if in Python from then on): the same graphs, half the capture."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        node = ctx.get_local("p").as_proxy().node
    except Exception:  # noqa: BLE001 -- not a traced tensor: nothing to decide here
        return
    if node.target is torch.scalar_tensor and node.args:
        source = node.args[0]
        value = source.meta.get("example_value") if isinstance(source, torch.fx.Node) else source
        if isinstance(value, torch.SymBool) and free_unbacked_symbols(value):
            ctx.graph_break(DATA_DEPENDENT_IF)


def cond(p: torch.Tensor, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
    """``torch.cond`` when Dynamo traces; a plain if when Python runs the code (eagerly)."""
    if COND and torch.compiler.is_compiling():
        comptime(_on_data_dependent_size)
        comptime(lambda ctx: _count_cond())
        return torch.cond(as_bool(p), lambda: fresh(true_fn()), lambda: fresh(false_fn()), ())
    return true_fn() if p else false_fn()


def loopable(carried: tuple[Any, ...], read_after: tuple[bool, ...], n: Any = 0) -> bool:
    """Whether a loop rewritten by ``loops`` can be ``torch.while_loop`` now: Dynamo traces, ``n`` (a trip
    count) is an integer, and every carried value is a tensor that needs no gradient, or a Python int
    nobody reads after the loop (a counter: carried as an int64 tensor; an int read after the loop
    would leave the graph as an unbacked symbolic int, for which Dynamo returned a wrong constant).
    When not, the mended code runs the user's loop as written (so no break is added)."""
    if not (COND and _WHILE_LOOP is not None and torch.compiler.is_compiling() and isinstance(n, int)):
        return False
    for c, r in zip(carried, read_after):
        if not (
            (type(c) is int and not r)
            or (isinstance(c, torch.Tensor) and not (torch.is_grad_enabled() and c.requires_grad))
        ):
            return False
    return True


_WHILE_LOOP = getattr(getattr(torch, "_higher_order_ops", None), "while_loop", None)
try:  # the operator itself: torch.while_loop's wrapper flattens the carried values with pytree, which Dynamo
    # traces line by line (~100 ms a loop); ours are a flat tuple of tensors already, so the wrapper's
    # flattened functions are these functions, and Dynamo takes the operator's call as the wrapper makes it
    _WHILE_LOOP_OP: Any = torch.ops.higher_order.while_loop
except (AttributeError, RuntimeError):
    _WHILE_LOOP_OP = None


def _while(cond_fn: Callable[..., Any], body_fn: Callable[..., Any], carried: tuple[torch.Tensor, ...]) -> Any:
    """``torch.while_loop(cond_fn, body_fn, carried)`` as Dynamo traces it, ``carried`` a tuple of tensors."""
    if _WHILE_LOOP_OP is not None:
        return _WHILE_LOOP_OP(cond_fn, body_fn, carried, ())
    assert _WHILE_LOOP is not None  # loopable() said so
    return _WHILE_LOOP(cond_fn, body_fn, carried)


def loop(
    note: int, test_fn: Callable[..., Any], body_fn: Callable[..., tuple[Any, ...]], carried: tuple[Any, ...]
) -> tuple[Any, ...]:
    """A ``while`` on a tensor test as ``torch.while_loop`` (where :func:`loopable` said so)."""
    comptime(lambda ctx: _count_cond())
    fired(note)
    lifted = []
    for c in carried:  # loops here, not generators: each is one more function for Dynamo to trace
        lifted.append(torch.tensor(c, dtype=torch.int64) if type(c) is int else c)
    return tuple(_while(lambda *c: as_bool(test_fn(*c)), lambda *c: fresh(body_fn(*c)), tuple(lifted)))


def repeat(note: int, n: int, body_fn: Callable[..., tuple[Any, ...]], carried: tuple[Any, ...]) -> tuple[Any, ...]:
    """``for _ in range(n)`` with ``n`` from tensor data as ``torch.while_loop`` with a counter (where
    :func:`loopable` said so)."""
    comptime(lambda ctx: _count_cond())
    fired(note)
    stop = torch.scalar_tensor(n, dtype=torch.int64)
    start = torch.zeros((), dtype=torch.int64)
    out = _while(lambda i, *c: i < stop, lambda i, *c: (i + 1, *fresh(body_fn(*c))), (start, *carried))
    return tuple(out[1:])


def fresh(outs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Copies of a branch's outputs: torch.cond refuses a branch output that aliases its input."""
    copies = []
    for o in outs:
        copies.append(o.clone() if isinstance(o, torch.Tensor) else o)
    return tuple(copies)


# --- tensor tests inside expressions (``expressions``, ``analysis.exact_items``) ----------------------


def all_(*operands: Callable[[], Any]) -> Any:
    """``a and b and ...`` as a test. Python's short circuit while the operands are Python values; once
    one is a one-element tensor, the later ones run too (the rewrite checked they may) and the answer
    is a 0-d bool tensor. A later tensor of more elements makes Python decide first, as it would."""
    acc = None  # the tensor part of the answer so far
    for thunk in operands:
        v = thunk()
        if pred(v):
            acc = as_bool(v) if acc is None else acc & as_bool(v)
        elif acc is not None and isinstance(v, torch.Tensor):
            if not acc:
                return False
            acc = None
            if not v:
                return False
        elif acc is not None:
            acc = acc & bool(v)
        elif not v:
            return False
    return True if acc is None else acc


def any_(*operands: Callable[[], Any]) -> Any:
    """``a or b or ...`` as a test; see :func:`all_`."""
    acc = None
    for thunk in operands:
        v = thunk()
        if pred(v):
            acc = as_bool(v) if acc is None else acc | as_bool(v)
        elif acc is not None and isinstance(v, torch.Tensor):
            if acc:
                return True
            acc = None
            if v:
                return True
        elif acc is not None:
            acc = acc | bool(v)
        elif v:
            return True
    return False if acc is None else acc


def choose(note: int, p: Any, a: Callable[[], Any], b: Callable[[], Any]) -> Any:
    """``a if p else b`` with ``p`` a tensor test: both sides run and ``torch.where`` picks (they merge;
    when Dynamo traces, values needing gradients too: see ``mergeable``); otherwise Python's conditional
    expression."""
    if not pred(p):
        return a() if p else b()
    x, y = a(), b()
    if mergeable(p, x, y, computed=torch.compiler.is_compiling()):
        fired(note)
        return merge(p, x, y)
    return x if p else y


# --- legacy autograd (``legacy``) --------------------------------------------------------------------


def variable(note: int, data: Any) -> Any:
    """``Variable(t)`` / ``Variable(t, requires_grad=False)``: ``t.detach()`` when Dynamo traces (what the
    legacy constructor gives: a tensor sharing ``t``'s data, needing no gradient); the constructor itself
    otherwise."""
    if isinstance(data, torch.Tensor) and torch.compiler.is_compiling():
        fired(note)
        return data.detach()
    return torch.autograd.Variable(data)


def no_backward_apply(note: int, apply: Any, *args: Any) -> Any:
    """``Fn.apply(*args)`` of a Function whose backward only raises and whose outputs are all marked
    non-differentiable (``legacy.has_no_backward``): under ``torch.no_grad()`` while Dynamo traces (the same
    outputs, none needing gradients, as ``apply`` gives; Dynamo then traces no backward), as written
    otherwise."""
    if torch.compiler.is_compiling() and torch.is_grad_enabled():
        fired(note)
        with torch.no_grad():
            return apply(*args)
    return apply(*args)


def tracing(note: int) -> bool:
    """Whether Dynamo traces this call (then rewrite ``note`` took effect): the test of a rewrite that swaps
    an object for one Dynamo can trace (``legacy.modern_applies``)."""
    if torch.compiler.is_compiling():
        fired(note)
        return True
    return False


def data_of(note: int, value: Any) -> Any:
    """``value.data`` (:mod:`.legacy`, mended for ``torch.export``): ``value.detach()`` while export traces a
    tensor (the same values; export records it, where it gives ``.data`` no place), ``.data`` otherwise."""
    if isinstance(value, torch.Tensor) and torch.compiler.is_exporting():
        fired(note)
        return value.detach()
    return value.data


def new_resized(note: int, t: Any, how: str, *size: Any) -> Any:
    """``t.new().resize_(*size)`` or ``t.new().resize_as_(other)``: ``t.new_empty`` of that size while
    Dynamo traces a tensor (the same uninitialized, contiguous tensor; Dynamo refuses ``resize_``), the
    code as written otherwise."""
    if isinstance(t, torch.Tensor) and torch.compiler.is_compiling():
        if how == "resize_":
            fired(note)
            return t.new_empty(*size)
        if len(size) == 1 and isinstance(size[0], torch.Tensor):
            fired(note)
            return t.new_empty(size[0].shape)
    return getattr(t.new(), how)(*size)


# --- attribute dicts (``attrs``) ----------------------------------------------------------------------


def attr(note: int, obj: Any, name: str) -> Any:
    """``obj.<name>``. While Dynamo traces an attribute dict (``__getattr__ = dict.__getitem__`` or
    ``dict.get``) without that name on its class or in its ``__dict__``, Python's lookup ends in that
    ``__getattr__``: read the item the same way (Dynamo refuses the C ``__getattr__`` itself)."""
    if isinstance(obj, dict) and torch.compiler.is_compiling() and not hasattr(type(obj), name) and _no_own(obj):
        getter, cls = getattr(type(obj), "__getattr__", None), type(obj)
        if getter is dict.__getitem__ and cls.__getitem__ is dict.__getitem__:
            fired(note)
            return obj[name]
        if getter is dict.get and cls.get is dict.get:
            fired(note)
            return obj.get(name)
    return getattr(obj, name)


def _no_own(obj: Any) -> bool:
    try:
        return not vars(obj)
    except TypeError:  # __slots__: no instance attributes at all
        return True


# --- a for loop with ``if <tensor>: break`` (``loops.break_convert``) ----------------------------------


def maskable(iterable: Any, calls_items: bool, *modules: Any) -> bool:
    """Whether the loop may keep running after its break test was true (values frozen): every module its
    body calls is side-effect free, the items of ``iterable`` too when the body calls them."""
    if modules and not _all_pure(modules):
        return False
    if not calls_items:
        return True
    return isinstance(iterable, (nn.ModuleList, nn.Sequential, list, tuple)) and _all_pure(iterable)


def _all_pure(modules: Any) -> bool:
    # a loop, not all(<generator>): where Dynamo skipped the caller, it would try (and fail) to trace a generator
    for m in modules:
        if _KINDS.get(type(m)) != "pure" and not pure_module(m):  # the common case without a call to trace
            return False
    return True


def until(
    note: int, masked_ok: bool, state: Any, old: tuple[Any, ...], new: tuple[Any, ...], test: Any
) -> tuple[Any, Any]:
    """One iteration of a masked loop: the carried values and the new state. State is None before the first
    iteration, ``(stopped,)`` (a 0-d bool tensor) while masking, else the test itself (Python decides).

    ``torch.where`` picks between the old and new values, both computed already: values needing
    gradients too when Dynamo traces (see ``mergeable``); eagerly, Python decides then, as written."""
    if masked_ok and pred(test):
        compiling = torch.compiler.is_compiling()
        if state is None and mergeable(test, old, new, compiling):
            fired(note)
            return new, (as_bool(test),)
        if isinstance(state, tuple) and mergeable(state[0], old, new, compiling):
            fired(note)
            return tuple(merge(state[0], old, new)), (state[0] | as_bool(test),)
    if isinstance(state, tuple) and state[0]:  # masking cannot go on: Python decides whether it had stopped
        return old, True
    return new, test


def after_break(p: Any, at_break: tuple[Any, ...], at_end: tuple[Any, ...]) -> tuple[Any, ...]:
    """One iteration's carried values when the break test ``p`` sits mid-body: those at the test if it
    held, those at the end of the body otherwise (both were computed: they have no side effects; the
    choice as in ``until``)."""
    if pred(p) and mergeable(p, at_break, at_end, torch.compiler.is_compiling()):
        return tuple(merge(p, at_break, at_end))
    return at_break if p else at_end


def stopped(state: Any) -> bool:
    """Whether to ``break`` now: never while masking, else the test, as the user wrote it."""
    return not isinstance(state, tuple) and bool(state)
