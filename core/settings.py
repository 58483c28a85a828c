"""Every ``TORCHMUX_*`` environment variable, defined once and documented where it is defined.

A setting is read each time it is asked for (``settings.CACHE_DIR.get()``), so tests and users can
change the environment at run time. Defining the same name twice is an error at import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")
_DEFINED: dict[str, Setting] = {}


class Setting(NamedTuple, Generic[T]):
    """One environment variable: its name, the value when unset or empty, how its text is read, and what
    it does (the text a bad value's error ends with). A NamedTuple: built at import, faster than a frozen
    dataclass (core/registry.py, PluginProblem)."""

    name: str
    default: T
    parse: Callable[[str], T]
    doc: str

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        try:
            return self.parse(raw)
        except ValueError as e:
            raise ValueError(f"environment variable {self.name}={raw!r} is invalid: {e}. {self.doc}") from None


def _flag(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def _define(name: str, default: T, parse: Callable[[str], T], doc: str) -> Setting[T]:
    if name in _DEFINED:
        raise RuntimeError(f"setting {name} is defined twice; define each TORCHMUX_* variable once in core/settings.py")
    s = Setting(name, default, parse, doc)
    _DEFINED[name] = s
    return s


def all_settings() -> list[Setting]:
    return list(_DEFINED.values())


DISABLE_PLUGIN_AUTOLOAD = _define(
    "TORCHMUX_DISABLE_PLUGIN_AUTOLOAD",
    False,
    _flag,
    "When set, third-party plugins are not loaded from the 'torchmux.backends' entry-point group; "
    "torchmux's own built-in backends still load, and TORCHMUX_PLUGINS can name plugin modules to load.",
)
PLUGINS: Setting[tuple[str, ...]] = _define(
    "TORCHMUX_PLUGINS",
    tuple[str, ...](),
    lambda raw: tuple(p.strip() for p in raw.split(",") if p.strip()),
    "Comma-separated module names to register as plugins in addition to (or, with autoload off, "
    "instead of) the entry points.",
)
CACHE_DIR = _define(
    "TORCHMUX_CACHE_DIR",
    Path(os.path.expanduser("~/.cache/torchmux")),
    lambda raw: Path(raw).expanduser(),
    "Where compiled artifacts (ONNX models, TVM libraries, tuning records, autotune decisions) are cached. "
    "Delete the folder to clear the cache.",
)
VERBOSE = _define(
    "TORCHMUX_VERBOSE",
    False,
    _flag,
    "Log every autotune measurement and every fallback to stderr.",
)
DEBUG_DIR = _define(
    "TORCHMUX_DEBUG_DIR",
    None,
    lambda raw: Path(raw).expanduser(),
    "If set, backends that generate code (triton) write the source of every kernel into this folder.",
)


def _redis_url(raw: str) -> str:
    if not raw.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("expected a Redis URL such as redis://host:6379/0 (or rediss://, unix://)")
    return raw


def _seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError("expected a positive number of seconds")
    return value


REMOTE_CACHE = _define(
    "TORCHMUX_REMOTE_CACHE",
    None,
    _redis_url,
    "A Redis server the fleet shares, e.g. redis://cache-host:6379/0: decisions and data artifacts (ONNX "
    "models, TVM tuning records, split plans) are read from it after the local cache misses and written to "
    "both. Needs the 'redis' client (pip install torchmux[fleet]). A Redis that is down costs a warning.",
)
REMOTE_TIMEOUT = _define(
    "TORCHMUX_REMOTE_TIMEOUT",
    0.2,
    _seconds,
    "Seconds a remote cache request may take (connect, read, write) before torchmux gives up on it, warns "
    "once and compiles locally.",
)
FLEET_KEY_FILE = _define(
    "TORCHMUX_FLEET_KEY_FILE",
    None,
    lambda raw: Path(raw).expanduser(),
    "A file holding the secret the fleet shares. With it, executable artifacts (shared libraries) travel "
    "through the remote cache signed with HMAC-SHA256 and are loaded only when the signature checks; "
    "without it they never travel and are rebuilt locally from the shared data.",
)
DISTRIBUTED_TIMEOUT = _define(
    "TORCHMUX_DISTRIBUTED_TIMEOUT",
    1800.0,
    _seconds,
    "Under torch.distributed, how long ranks other than 0 wait for rank 0's autotune decision on a graph.",
)
ISOLATE_MODES = ("off", "third-party", "all")  # also the option isolate=... (core/config.py)
ISOLATE = _define(
    "TORCHMUX_ISOLATE",
    "all",
    lambda raw: _choice(raw, ISOLATE_MODES),
    "Which candidate backends auto tries first in a child process (a crash or hang there cannot take the "
    "program down): 'all' (default), 'third-party' (plugins not shipped with torchmux), or 'off'. "
    "The option isolate=... overrides it per compile().",
)
#: The trial deadline's default: one candidate's compile of one graph and its first two checked calls. The
#: slowest cold first call of a whole bench model under auto measured here (README, "Compile time": every
#: candidate built, each tried in a child first) took 17 s; 30 s is about twice that, so no honest backend
#: comes near it, and it is what a backend that hangs costs a first call (plus the trial child's start,
#: isolate.STARTUP_SECONDS, when the child is not up yet), once per graph structure (autotune/verdicts.py).
TRIAL_DEADLINE_SECONDS = 30.0
#: ... under mode="max-autotune", where backends tune (TVM's MetaSchedule budget alone is 120 s a graph)
TUNING_TRIAL_DEADLINE_SECONDS = 300.0
TRIAL_DEADLINE = _define(
    "TORCHMUX_TRIAL_DEADLINE",
    TRIAL_DEADLINE_SECONDS,
    float,
    "Seconds a candidate's trial (its compile and first two checked calls, in a child process or a worker "
    "thread) may take before it fails as 'timed out' and the next candidate (eager at worst) is used. "
    "Default 30, or 300 under mode='max-autotune' (tuning takes minutes); set, it applies to every mode.",
)
TRIAL_CHILD_IDLE = _define(
    "TORCHMUX_TRIAL_CHILD_IDLE",
    300.0,
    _seconds,
    "Seconds the isolated-trial child process waits for the next trial before it exits and gives its "
    "memory back (a later trial starts a new one).",
)
KEY_FILE = _define(
    "TORCHMUX_KEY_FILE",
    Path(os.path.expanduser("~/.config/torchmux/key")),
    lambda raw: Path(raw).expanduser(),
    "The per-user secret (created 0600 on first use, kept outside the cache) that authenticates the "
    "executable artifacts torchmux caches (HMAC-SHA256): a library planted in the cache is rebuilt, never loaded.",
)


def _choice(raw: str, allowed: tuple[str, ...]) -> str:
    if raw not in allowed:
        raise ValueError(f"expected one of {', '.join(allowed)}")
    return raw
