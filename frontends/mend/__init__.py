"""The mend pass, as a package: the algorithm is described in :mod:`.pipeline`."""

from .pipeline import Mended, Rewrites, mend, mend_function, mended, source_of, unmend
from .switches import TraceSwitches, cond_refusals, cond_refused, scoped, tracing

__all__ = [
    "Mended",
    "Rewrites",
    "TraceSwitches",
    "cond_refusals",
    "cond_refused",
    "mend",
    "mend_function",
    "mended",
    "scoped",
    "source_of",
    "tracing",
    "unmend",
]
