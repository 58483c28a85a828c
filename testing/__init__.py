"""The backend author's kit, shipped in the wheel: what torchmux checks at run time, runnable beforehand.

- :func:`conformance_tests` (:mod:`torchmux.testing.kit`): one import in your own pytest file,
  ``test_mine = conformance_tests(MyBackend())``, runs on every op your backend claims the checks the
  runtime applies to its answers (values, NaN/±inf, no input written, no output aliasing an input,
  fresh outputs, a second call, symbolic sizes if it claims them) and a model through
  ``torchmux.compile`` (frozen weights, regions). :func:`run_kit` returns the same as
  :class:`Result` objects; ``python -m torchmux.testing.kit BACKEND`` prints them.
- :mod:`torchmux.testing.probe`: ``python -m torchmux.testing.probe BACKEND [--dtype D ...] [--write
  claims.json]`` runs every case on one backend (claiming everything) and writes the ops it passed,
  per dtype, in the form :func:`torchmux.extend.load_claims` reads (from Python:
  :func:`torchmux.testing.probe.probe`, which also takes the backend object). BACKEND may be a plugin's module
  path, so the first claims file can be written before the plugin is installed.
- :mod:`torchmux.testing.cases`: one small program per Core ATen op (``CASES``, ``CASES_BY_OP``);
  :mod:`torchmux.testing.check`: trace a case to a GraphIR, compile it on a backend, compare with the
  reference interpreter (:func:`~torchmux.testing.check.check`).

The project's own conformance suite (tests/conformance) is :func:`conformance_tests` over every
installed backend.
"""

from typing import Any

from .cases import CASES, CASES_BY_OP, Case
from .check import case_ir, check, claims

#: re-exported lazily, so ``python -m torchmux.testing.kit`` / ``.probe`` run their module once
_LAZY = {
    "CHECKS": "kit",
    "Result": "kit",
    "conformance_tests": "kit",
    "resolve_backend": "kit",
    "run_kit": "kit",
}

__all__ = [
    "CASES",
    "CASES_BY_OP",
    "CHECKS",
    "Case",
    "Result",
    "case_ir",
    "check",
    "claims",
    "conformance_tests",
    "resolve_backend",
    "run_kit",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
