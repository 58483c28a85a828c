"""Plugin discovery and the backend registry.

Plugins come from the ``torchmux.backends`` entry-point group (torchmux's own backends included: they
are listed in its pyproject.toml like anyone else's) and from ``TORCHMUX_PLUGINS``. A plugin that fails
to import, registers a hook pluggy rejects, or raises from ``torchmux_add_backends`` is recorded as a
:class:`PluginProblem`, reported by ``list_backends()`` and a warning, and everything else keeps working.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import pluggy

from . import hookspecs, settings
from .backend import Availability, Backend, contract_problem
from .errors import BackendUnavailableError, PluginError, UnknownBackendError

ENTRY_POINT_GROUP = "torchmux.backends"
SELF_DIST = "torchmux"

__all__ = [
    "BackendInfo",
    "PluginProblem",
    "Registry",
    "find_backend",
    "get_registry",
    "list_backends",
    "register_plugin",
]


# The registry's records are NamedTuples, not dataclasses: on Python 3.11 a frozen dataclass is built by
# compiling its methods' source at import (~1.3 ms each here), a NamedTuple in ~0.2 ms, and ``import
# torchmux`` is paid by every process that only loads a package (README, "Start-up")
class PluginProblem(NamedTuple):
    """A plugin that failed to import or register: its entry point's name, its distribution, what went wrong."""

    plugin: str
    package: str
    error: str


class BackendInfo(NamedTuple):
    """One row of ``list_backends()``."""

    name: str
    version: str
    devices: tuple[str, ...]
    available: bool
    reason: str
    plugin: str
    package: str
    description: str = ""
    dynamic_shapes: bool = False  # takes symbolic graphs (one compile serves every size)


class _Entry(NamedTuple):
    """A registered backend and the plugin (and distribution) it came from."""

    backend: Backend
    plugin: str
    package: str


class Registry:
    def __init__(self, autoload: bool = True) -> None:
        self.pm = pluggy.PluginManager("torchmux")
        self.pm.add_hookspecs(hookspecs)
        self.problems: list[PluginProblem] = []
        self._entries: dict[str, _Entry] = {}
        self._plugin_package: dict[str, str] = {}
        self.skipped: list[str] = []  # third-party entry points not loaded (TORCHMUX_DISABLE_PLUGIN_AUTOLOAD)
        if autoload:
            self._load_entry_points()
            for mod in settings.PLUGINS.get():
                self._register_module(mod, name=mod, package=_distribution_of(mod))
        self._collect()

    # ------------------------------------------------------------------ loading
    @classmethod
    def of_plugin(cls, plugin: str, package: str | None = None) -> Registry:
        """A registry of the one plugin named ``plugin`` (its entry point, read from the distribution
        ``package`` alone when given, or its ``TORCHMUX_PLUGINS`` module): what :func:`find_backend`
        builds to open one backend without importing every plugin or reading every distribution."""
        registry = cls(autoload=False)
        registry._load_entry_points(only=plugin, package=package)
        if not registry.pm.has_plugin(plugin) and plugin in settings.PLUGINS.get():
            registry._register_module(plugin, name=plugin, package=_distribution_of(plugin))
        registry._collect()
        return registry

    def _load_entry_points(self, only: str | None = None, package: str | None = None) -> None:
        third_party = not settings.DISABLE_PLUGIN_AUTOLOAD.get()
        found: Any = ()
        if package is not None:
            try:
                found = importlib.metadata.distribution(package).entry_points.select(group=ENTRY_POINT_GROUP)
            except importlib.metadata.PackageNotFoundError:
                pass
        named = bool(found)  # read from the distribution ``package``: its name is known, its metadata unparsed (~5 ms)
        if not found:
            found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        for ep in found if only is None else found.select(name=only):
            dist = package if named and package else ep.dist.name if ep.dist is not None else "?"
            if dist != SELF_DIST and not third_party:
                self.skipped.append(f"{ep.name} ({dist})")
                continue
            if self.pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as e:  # a broken plugin never takes torchmux down
                self._problem(ep.name, dist, f"failed to import {ep.value!r}: {type(e).__name__}: {e}")
                continue
            self._register(plugin, ep.name, dist)

    def _register_module(self, module: str, name: str, package: str) -> None:
        try:
            plugin = importlib.import_module(module)
        except Exception as e:
            self._problem(name, package, f"failed to import {module!r}: {type(e).__name__}: {e}")
            return
        self._register(plugin, name, package)

    def _register(self, plugin: Any, name: str, package: str) -> bool:
        if self.pm.is_registered(plugin):  # the same module named twice (TORCHMUX_PLUGINS=torchmux.backends.eager)
            return True  # keeps the first registration: never removes it
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except Exception as e:  # pluggy's validation names the hook and the offending signature
            if self.pm.get_plugin(name) is plugin:  # only what this call registered is taken back
                self.pm.unregister(plugin)
            self._problem(name, package, f"{type(e).__name__}: {e}")
            return False
        self._plugin_package[name] = package
        return True

    def register(self, plugin: Any, name: str | None = None) -> None:
        """Register a plugin at run time (tests, notebooks): a module or object with ``@torchmux.hookimpl``
        functions, or a :class:`Backend` instance (wrapped in a plugin that adds it)."""
        if _is_backend(plugin):
            name = name or f"backend:{plugin.name}"
            plugin = _SingleBackendPlugin(plugin)
        name = name or getattr(plugin, "__name__", None) or repr(plugin)
        if not any(callable(getattr(plugin, h, None)) for h in dir(plugin) if h.startswith("torchmux_")):
            raise PluginError(
                f"register_plugin({plugin!r}): it has no torchmux_* hook (such as a @torchmux.hookimpl "
                "torchmux_add_backends function); pass a module or object that has one, or a torchmux.Backend"
            )
        if not self._register(plugin, name, "(registered at run time)"):
            raise PluginError(self.problems[-1].error)
        self._collect()

    def _problem(self, plugin: str, package: str, error: str) -> None:
        error = " ".join(error.split())
        self.problems.append(PluginProblem(plugin, package, error))
        warnings.warn(f"torchmux plugin {plugin!r} (from {package}) is broken and was skipped: {error}", stacklevel=3)

    def _collect(self) -> None:
        """Ask every plugin for its backends, one plugin at a time, so that one failing does not hide the rest."""
        for impl in self.pm.hook.torchmux_add_backends.get_hookimpls():
            name = impl.plugin_name
            if any(e.plugin == name for e in self._entries.values()):
                continue
            package = self._plugin_package.get(name, "?")
            try:
                backends = list(cast(Callable[[], Any], impl.function)() or [])
            except Exception as e:
                self._problem(name, package, f"torchmux_add_backends raised {type(e).__name__}: {e}")
                continue
            for b in backends:
                problem = contract_problem(b)
                if problem:
                    self._problem(name, package, f"torchmux_add_backends {problem}")
                elif b.name in self._entries:
                    other = self._entries[b.name]
                    self._problem(
                        name,
                        package,
                        f"backend name {b.name!r} is already taken by plugin {other.plugin!r} ({other.package}); ignored",
                    )
                else:
                    self._entries[b.name] = _Entry(b, name, package)

    # ------------------------------------------------------------------ queries
    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def get(self, name: str) -> Backend:
        if name not in self._entries:
            raise UnknownBackendError(
                name,
                self.names,
                [(p.plugin, p.package, p.error) for p in self.problems],
                skipped=self.skipped if settings.DISABLE_PLUGIN_AUTOLOAD.get() else None,
            )
        return self._entries[name].backend

    def availability(self, name: str) -> Availability:
        backend = self.get(name)
        try:
            return backend.availability()
        except Exception as e:
            return Availability.no(f"its availability check raised {type(e).__name__}: {e}")

    def require(self, name: str) -> Backend:
        """The backend, or an error that says why it cannot run here."""
        backend = self.get(name)
        avail = self.availability(name)
        if not avail.ok:
            raise BackendUnavailableError(name, avail.reason)
        return backend

    def available(self) -> list[Backend]:
        return [e.backend for n, e in self._entries.items() if self.availability(n).ok]

    def info(self) -> list[BackendInfo]:
        """One row per backend: what it is, whether it runs here and why not, the devices it runs on here."""
        rows = []
        for name, e in self._entries.items():
            avail = self.availability(name)
            try:
                version = e.backend.version
            except Exception:
                version = "?"
            devices = tuple(e.backend.devices)
            if avail.ok:  # what it runs on here: ONNX Runtime's CPU-only wheel lists no CUDA provider
                devices = tuple(d for d in devices if _supports_device(e.backend, d))
            rows.append(
                BackendInfo(
                    name,
                    version,
                    devices,
                    avail.ok,
                    avail.reason,
                    e.plugin,
                    e.package,
                    getattr(e.backend, "description", ""),
                    bool(getattr(e.backend, "dynamic_shapes", False)),
                )
            )
        for p in self.problems:
            rows.append(BackendInfo(f"({p.plugin})", "?", (), False, f"plugin broken: {p.error}", p.plugin, p.package))
        return rows

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def package_of(self, name: str) -> str | None:
        """The distribution that provides backend ``name`` ("torchmux" for the built-ins), or None."""
        entry = self._entries.get(name)
        return entry.package if entry else None

    def plugin_of(self, name: str) -> str | None:
        """The plugin name (a module name for modules registered at run time) that provides backend ``name``."""
        entry = self._entries.get(name)
        return entry.plugin if entry else None

    def notify(self, hook_name: str, **kwargs: Any) -> None:
        """Call an observation hook plugin by plugin; one that raises is named in a warning, the others still run."""
        for impl in reversed(getattr(self.pm.hook, hook_name).get_hookimpls()):  # pluggy's order: last registered first
            try:
                impl.function(**{k: kwargs[k] for k in impl.argnames if k in kwargs})
            except Exception as e:
                warnings.warn(
                    f"torchmux plugin {impl.plugin_name!r}: its {hook_name} hook raised "
                    f"{type(e).__name__}: {e}; the other plugins' hooks still ran",
                    stacklevel=2,
                )


def _distribution_of(module: str) -> str:
    """The installed distribution that provides ``module`` (a TORCHMUX_PLUGINS entry); "TORCHMUX_PLUGINS" if none does."""
    dists = importlib.metadata.packages_distributions().get(module.split(".")[0], [])
    return dists[0] if dists else "TORCHMUX_PLUGINS"


def _supports_device(backend: Backend, device: str) -> bool:
    try:
        return bool(backend.supports_device(device))
    except Exception:  # noqa: BLE001 -- a plugin's own check that fails: its declared devices stand
        return True


def _is_backend(obj: Any) -> bool:
    return isinstance(obj, Backend) or (
        not isinstance(obj, type)
        and isinstance(getattr(obj, "name", None), str)
        and callable(getattr(obj, "compile", None))
        and callable(getattr(obj, "supports", None))
    )


class _SingleBackendPlugin:
    """The plugin ``register_plugin(backend)`` registers for a bare Backend instance."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    @hookspecs.hookimpl
    def torchmux_add_backends(self) -> list[Any]:
        return [self.backend]

    def __repr__(self) -> str:
        return f"<plugin adding backend {self.backend.name!r}>"


_REGISTRY: Registry | None = None
_LOCK = threading.Lock()


def get_registry(reload: bool = False) -> Registry:
    """The process-wide registry, loaded on first use. ``reload=True`` discovers plugins again."""
    global _REGISTRY
    with _LOCK:
        if _REGISTRY is None or reload:
            _REGISTRY = Registry()
        return _REGISTRY


def find_backend(name: str, plugin: str | None = None, package: str | None = None) -> Backend | None:
    """Backend ``name`` for a caller that knows which plugin provides it and from which distribution (a
    package records both), without discovering every plugin: the process's registry where one is loaded
    already, else a registry of that one plugin (``plugin``, else the plugin named as the backend is, as
    the built-ins are); every plugin only when that one does not provide ``name``. None when no
    installed plugin does."""
    if _REGISTRY is None:
        one = Registry.of_plugin(plugin or name, package)
        if name in one.names:
            return one.get(name)
    registry = get_registry()
    return registry.get(name) if name in registry.names else None


def list_backends(reload: bool = False) -> list[BackendInfo]:
    """One record per backend (name, version, devices, available, reason, plugin, package), then one per broken plugin."""
    return get_registry(reload).info()


def register_plugin(plugin: Any, name: str | None = None) -> None:
    """Register a plugin at run time; its backends join the registry at once.

    ``plugin`` is a module or an object with ``@torchmux.hookimpl`` functions named after the hooks
    (core/hookspecs.py), or a :class:`Backend` instance. ``name`` defaults to the module's name (for a
    Backend, ``"backend:<its name>"``). Raises :class:`PluginError` when the object has no
    ``torchmux_*`` hook or a hook does not match its specification (the message names the plugin, the
    hook and the argument). A backend that breaks the contract (:func:`contract_problem`) or whose name
    is taken is skipped with a warning and listed by ``list_backends()`` as a broken plugin.
    Registering the same object twice is a no-op.
    """
    get_registry().register(plugin, name)


def format_backends(rows: list[BackendInfo]) -> str:
    header = ("backend", "version", "devices", "available", "dynamic", "plugin (package)", "why not / what")
    table = [header] + [
        (
            r.name,
            r.version,
            ",".join(r.devices) or "-",
            "yes" if r.available else "no",
            "yes" if r.dynamic_shapes else "-",
            f"{r.plugin} ({r.package})",
            " ".join((r.reason or r.description).split()),
        )
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header) - 1)]
    lines = []
    for i, row in enumerate(table):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 20)
    return "\n".join(lines)
