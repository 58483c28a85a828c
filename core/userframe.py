"""Warnings that point at the user's line, not at torch's, torchmux's or a worker thread's.

A fallback warning is raised deep inside Dynamo's call path, or in the thread a graph compiles in;
``warnings.warn(stacklevel=N)`` then names ``threading.py`` or a torch file. :func:`user_location` walks
the stack to the first frame outside torch, torchmux and the standard library's threading, and
:func:`warn_at` issues the warning there with ``warnings.warn_explicit``.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import torch

_SKIP_MODULES = ("torch", "torchmux", "threading", "contextlib", "functools", "importlib", "pluggy")
#: torch's installed package folder, with a trailing separator
TORCH_DIR = os.path.dirname(os.path.abspath(str(torch.__file__))) + os.sep


def in_torch(filename: str) -> bool:
    """Whether ``filename`` (a code object's or a traceback's) is one of torch's own files: its polyfills,
    ``nn.Module``'s call, Dynamo. The one test every "the user's line, not torch's" walk uses."""
    return os.path.abspath(filename).startswith(TORCH_DIR)


@dataclass(frozen=True)
class Location:
    filename: str
    lineno: int
    module: str
    globals: dict[str, Any]


def user_location() -> Location | None:
    """The innermost frame of the calling thread that belongs to neither torch nor torchmux."""
    frame = sys._getframe(1)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        name = frame.f_code.co_filename
        if (
            module.split(".")[0] not in _SKIP_MODULES
            and not name.startswith("<")
            and not in_torch(name)
            and os.path.isfile(name)
        ):
            return Location(name, frame.f_lineno, module, frame.f_globals)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def warn_at(message: str, category: type[Warning], where: Location | None = None) -> None:
    """Warn at ``where`` (default: the user's frame in this thread; a plain warning if there is none)."""
    where = where or user_location()
    if where is None:
        warnings.warn(message, category, stacklevel=2)
        return
    registry = where.globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category, where.filename, where.lineno, where.module, registry)
