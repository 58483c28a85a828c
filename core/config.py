"""The validated arguments of ``torchmux.compile``: which backends may run, mode, options."""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import settings
from .backend import Backend
from .errors import BadArgumentError
from .registry import get_registry

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_TUNING_MODES = ("max-autotune", "max-autotune-no-cudagraphs")  # backends tune: compiles take minutes

#: torchmux's own options (everything else in ``options`` must name a backend)
OWN_OPTIONS: dict[str, tuple[type, Any, str]] = {
    "verify": (
        object,
        True,
        "when the chosen backend's answer is checked against the reference: 'off' (False), 'first', "
        "'sparse' (True, the default: calls 1, 2, 4, 8, ..., then every 8192nd, and inputs of a new kind), 'always'",
    ),
    "autotune_budget": (float, 0.5, "seconds of timing per graph and input shape when choosing a backend"),
    "mend": (bool, True, "rewrite graph-breaking Python (tensor if, print, .item() for logging...) before capture"),
    "replay": (
        bool,
        True,
        "a module's later calls run Dynamo's cached code directly when Dynamo's guards pass (frontends/replay.py)",
    ),
    "isolate": (
        str,
        None,
        "which candidates auto tries first in a child process: 'off', 'third-party', 'all' "
        "(default: TORCHMUX_ISOLATE, else 'all')",
    ),
    "trial_deadline": (
        float,
        None,
        "seconds a candidate's trial (compile and first two checked calls, child process or worker thread) may "
        "take (default: TORCHMUX_TRIAL_DEADLINE, else 30; 300 under mode='max-autotune')",
    ),
    "freeze": (
        bool,
        True,
        (
            "inference graphs get their weights as constants (a weight changed in place is noticed "
            "and the graph frozen again; writes through p.data are not: pass False if you write "
            "weights that way)"
        ),
    ),
    "split": (
        int,
        None,
        "auto: also try each graph cut into up to N segments, each on its fastest correct backend "
        "(default 4 under mode='max-autotune', else 0: off)",
    ),
}


@dataclass(frozen=True)
class CompileConfig:
    backends: tuple[Backend, ...]  # the candidates (one when the user named one)
    auto: bool  # True: measure and choose; False: the user named exactly one backend
    mode: str | None = None
    own: Mapping[str, Any] = field(default_factory=dict)
    backend_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def options_for(self, backend: str) -> dict[str, Any]:
        return dict(self.backend_options.get(backend, {}))

    def get(self, key: str) -> Any:
        return self.own.get(key, OWN_OPTIONS[key][1])

    @property
    def split_segments(self) -> int:
        """How many segments auto may cut a graph into (split.py); 0: whole graphs only."""
        value = self.own.get("split")
        if value is None:
            return 4 if self.mode in ("max-autotune", "max-autotune-no-cudagraphs") else 0
        return max(0, value)

    @property
    def isolation(self) -> str:
        """Which candidates are tried in a child first: the option ``isolate``, else ``TORCHMUX_ISOLATE``."""
        return str(self.own.get("isolate") or settings.ISOLATE.get())

    @property
    def trial_deadline(self) -> float:
        """Seconds a trial may take: the option ``trial_deadline``, else ``TORCHMUX_TRIAL_DEADLINE``, else
        30 (``settings.TRIAL_DEADLINE_SECONDS``; 300 under ``mode="max-autotune"``, where backends tune)."""
        if self.own.get("trial_deadline"):
            return float(self.own["trial_deadline"])
        if not os.environ.get(settings.TRIAL_DEADLINE.name) and self.mode in _TUNING_MODES:
            return settings.TUNING_TRIAL_DEADLINE_SECONDS
        return float(settings.TRIAL_DEADLINE.get())

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.backends]


def resolve(backend: Any, mode: str | None, options: Mapping[str, Any] | None) -> CompileConfig:
    """Turn compile()'s arguments into a CompileConfig, or raise an error that says what to pass instead."""
    registry = get_registry()
    if mode not in MODES:
        raise BadArgumentError(f"mode={mode!r} is not a mode; pass one of {', '.join(repr(m) for m in MODES)}")
    if backend is None or backend == "auto":
        chosen, auto = tuple(b for b in registry.available() if getattr(b, "auto", True)), True
    elif isinstance(backend, str):
        chosen, auto = (registry.require(backend),), False
    elif isinstance(backend, Backend) or (hasattr(backend, "compile") and hasattr(backend, "name")):
        avail = backend.availability()
        if not avail.ok:
            from .errors import BackendUnavailableError

            raise BackendUnavailableError(backend.name, avail.reason)
        chosen, auto = (backend,), False
    elif isinstance(backend, Sequence) and backend and all(isinstance(b, str) for b in backend):
        for name in backend:
            registry.get(name)  # unknown names are an error
        chosen = tuple(registry.get(n) for n in backend if registry.availability(n).ok)
        if not chosen:
            raise BadArgumentError(
                f"backend={list(backend)!r}: none of these can run here "
                f"({'; '.join(f'{n}: {registry.availability(n).reason}' for n in backend)})"
            )
        auto = True
    else:
        raise BadArgumentError(
            f"backend={backend!r} is not accepted; pass 'auto', a backend name ({', '.join(registry.names)}), "
            "a list of names for auto to choose from, or a torchmux.Backend object"
        )
    if auto and not any(b.name == "eager" for b in chosen) and "eager" in registry.names:
        chosen = chosen + (registry.get("eager"),)  # the fallback is always a candidate
    own, per_backend = _split_options(options or {}, set(registry.names) | {b.name for b in chosen})
    by_name = {**{n: registry.get(n) for n in per_backend if n in registry.names}, **{b.name: b for b in chosen}}
    for name, given in per_backend.items():
        check_backend_options(by_name[name], given)
    return CompileConfig(chosen, auto, None if mode == "default" else mode, own, per_backend)


def _split_options(options: Mapping[str, Any], backend_names: set[str]) -> tuple[dict, dict]:
    if not isinstance(options, Mapping):
        raise BadArgumentError(f"options must be a dict, got {type(options).__name__}")
    own: dict[str, Any] = {}
    per: dict[str, dict[str, Any]] = {}
    for key, value in options.items():
        if key in OWN_OPTIONS:
            typ = OWN_OPTIONS[key][0]
            if not isinstance(value, typ) and not (typ is float and isinstance(value, int)):
                raise BadArgumentError(f"options[{key!r}] must be {typ.__name__}, got {value!r}")
            own[key] = _checked(key, value)
        elif key in backend_names and isinstance(value, Mapping):
            per.setdefault(key, {}).update(value)
        elif "." in key and key.split(".", 1)[0] in backend_names:
            b, k = key.split(".", 1)
            per.setdefault(b, {})[k] = value
        else:
            raise BadArgumentError(
                f"options[{key!r}] is not a known option. torchmux's own: "
                + ", ".join(f"{k} ({v[2]})" for k, v in OWN_OPTIONS.items())
                + f"; backend options are written '<backend>.<option>' or {{'<backend>': {{...}}}} "
                f"with a backend among {', '.join(sorted(backend_names))}"
            )
    for name, opts in per.items():
        if "providers" in opts:
            _check_providers(name, opts["providers"])
    return own, per


def check_backend_options(backend: Backend, given: Mapping[str, Any]) -> None:
    """Refuse an option the backend does not declare, or a value of the wrong type, naming the allowed
    options. A backend without ``options_schema`` (free-form options, or an older plugin) accepts any."""
    schema = getattr(backend, "options_schema", None)
    if schema is None:
        return
    allowed = "; ".join(f"{k} ({o.type_name}, default {o.default!r}): {o.help}" for k, o in schema.items()) or "(none)"
    for key, value in given.items():
        if key not in schema:
            close = difflib.get_close_matches(key, list(schema), n=1)
            hint = f" Did you mean {backend.name + '.' + close[0]!r}?" if close else ""
            raise BadArgumentError(
                f"options[{backend.name + '.' + key!r}]: backend {backend.name!r} has no option {key!r}.{hint} "
                f"Its options: {allowed}"
            )
        if not schema[key].check(value):
            raise BadArgumentError(
                f"options[{backend.name + '.' + key!r}] must be {schema[key].type_name}, got {value!r} "
                f"({type(value).__name__}). {key}: {schema[key].help}"
            )


def _check_providers(backend: str, providers: Any) -> None:
    """A provider list is names, or (name, options dict) pairs, in priority order."""
    ok = (
        isinstance(providers, (list, tuple))
        and bool(providers)
        and all(
            (isinstance(p, str) and p)
            or (isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], Mapping))
            for p in providers
        )
    )
    if not ok:
        raise BadArgumentError(
            f"options['{backend}.providers']={providers!r}: pass a non-empty list of execution provider names "
            "or (name, options dict) pairs, best first, e.g. ['CUDAExecutionProvider', 'CPUExecutionProvider']"
        )


def _checked(key: str, value: Any) -> Any:
    """``options[key]`` if it is within what the option accepts; else an error saying what is allowed."""
    if key == "verify" and not (isinstance(value, bool) or value in ("off", "first", "sparse", "always")):
        raise BadArgumentError(
            f"options['verify'] must be bool (True: 'sparse', False: 'off') or one of 'off', 'first', "
            f"'sparse', 'always'; got {value!r}"
        )
    if key == "autotune_budget" and (isinstance(value, bool) or not math.isfinite(value) or value < 0):
        raise BadArgumentError(f"options['autotune_budget']={value!r}: pass a finite number of seconds >= 0")
    if key == "isolate" and value not in settings.ISOLATE_MODES:
        raise BadArgumentError(f"options['isolate']={value!r}: pass 'off', 'third-party' or 'all'")
    if key == "trial_deadline" and (isinstance(value, bool) or not math.isfinite(value) or value <= 0):
        raise BadArgumentError(f"options['trial_deadline']={value!r}: pass a finite number of seconds > 0")
    if key == "split" and (isinstance(value, bool) or value < 0):
        raise BadArgumentError(f"options['split']={value!r}: pass an int >= 0 (0: no split)")
    return value
