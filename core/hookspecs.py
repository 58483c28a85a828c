"""Every hook a torchmux plugin can implement. The docstrings are the contract.

A plugin is a module (or object) whose functions carry ``@torchmux.hookimpl`` and whose names match the
specifications below. It is found through the ``torchmux.backends`` entry-point group; torchmux's own
backends register through that same group. pluggy checks each implementation's signature against
these specifications when the plugin registers: an implementation may accept fewer arguments than the
specification offers, never others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .backend import Backend
    from .ir import GraphIR

hookspec = pluggy.HookspecMarker("torchmux")

# -------------------------------------------------------------------------------------------------
# Backends
# -------------------------------------------------------------------------------------------------


@hookspec
def torchmux_add_backends() -> Sequence[Backend]:  # type: ignore[empty-body]  # a specification: pluggy calls the implementations
    """Return the backends this plugin provides (instances of :class:`torchmux.Backend`).

    Called once per plugin when the registry loads. Every plugin's answer is collected: backends
    compete, none wins by registration order. A backend's ``name`` must be unique across all plugins;
    a second backend with a taken name is reported by ``list_backends()`` as a problem and ignored.

    The call must be cheap: do not import the library the backend wraps here. Availability is asked
    later through ``Backend.availability()``, compilation through ``Backend.compile()``. An exception
    raised here marks this plugin broken (reported, with the error, by ``list_backends()`` and a
    warning) and every other plugin keeps working.
    """


# -------------------------------------------------------------------------------------------------
# Observation
# -------------------------------------------------------------------------------------------------


@hookspec
def torchmux_graph_captured(ir: GraphIR) -> None:
    """Called after the frontend captured and normalized a graph, before any backend sees it.

    ``ir`` is a linted :class:`torchmux.GraphIR`; treat it as read-only. Use it to log or collect
    graphs (the explain report and the tests do). Exceptions are reported as warnings and ignored.
    """


@hookspec
def torchmux_candidate_measured(
    ir: GraphIR, backend: str, seconds: float, ok: bool, reason: str, chosen: bool, eager_ops: str
) -> None:
    """Called once per candidate the autotuner measured for ``ir``, after it chose.

    ``seconds`` is the median latency (``inf`` when the candidate failed); ``ok`` says whether its
    outputs matched the reference interpreter; ``reason`` says why not (compile error, crash, wrong
    answer with the largest difference); ``chosen`` whether this is the candidate that runs ``ir``
    (the fastest is not always it: medians within 3% are a tie, decided by other rules, see
    ``autotune/tuner.py`` ``choose``); ``eager_ops`` which of ``ir``'s ops this candidate leaves to eager
    between its regions ("3 ops eager (aten.sort.default x2, ...)"; "" when none, or when it failed).
    An implementation may leave out ``chosen`` (or any argument).
    Exceptions are reported as warnings and ignored.
    """


#: Mark a plugin's hook implementations with this (re-exported as ``torchmux.hookimpl``).
hookimpl = pluggy.HookimplMarker("torchmux")
