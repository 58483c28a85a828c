"""The conformance kit, shipped in the wheel: what a backend may claim is what it passes here.

- :mod:`torchmux.testing.cases`: one small program per Core ATen op (``CASES``, ``CASES_BY_OP``).
- :mod:`torchmux.testing.check`: trace a case to a GraphIR, compile it on a backend, compare with the
  reference interpreter (:func:`~torchmux.testing.check.check`).
- :mod:`torchmux.testing.probe`: ``python -m torchmux.testing.probe NAME [--dtype D ...] [--write
  claims.json]`` runs every case on one backend (claiming everything) and writes the ops it passed,
  per dtype, in the form :func:`torchmux.extend.load_claims` reads.

The project's own test suite (tests/conformance) runs the same cases over every installed backend.
"""

from .cases import CASES, CASES_BY_OP, Case
from .check import case_ir, check, claims

__all__ = ["CASES", "CASES_BY_OP", "Case", "case_ir", "check", "claims"]
