"""Every corpus program: the basic patterns (``programs.py``) and research-style modules (``research.py``)."""

from __future__ import annotations

from programs import PROGRAMS as BASICS
from programs import Program
from research import RESEARCH

ALL: list[Program] = BASICS + RESEARCH
CATEGORIES: list[str] = list(dict.fromkeys(p.category for p in ALL))
