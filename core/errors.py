"""One exception tree. Every message says what was wrong and what to do about it."""

from __future__ import annotations


class TorchmuxError(Exception):
    """Base of every error torchmux raises on purpose."""


class UnknownBackendError(TorchmuxError, ValueError):
    def __init__(
        self,
        name: str,
        known: list[str],
        broken: list[tuple[str, str, str]] | None = None,
        skipped: list[str] | None = None,
    ):
        """``broken``: (plugin, where it came from, error) of every plugin that failed to load;
        ``skipped``: with TORCHMUX_DISABLE_PLUGIN_AUTOLOAD set, the installed third-party plugins it kept
        from loading (None: the variable is not set)."""
        self.name, self.known, self.broken, self.skipped = name, known, list(broken or []), skipped
        message = f"unknown backend {name!r}. Known backends: {', '.join(sorted(known)) or '(none)'}. "
        if self.broken:
            likely = [b for b in self.broken if name.lower() in b[0].lower()] or self.broken
            message += (
                "It may come from a plugin that is broken and was skipped: "
                + "; ".join(f"plugin {p!r} (from {src}) is broken: {err}" for p, src, err in likely)
                + ". Fix that error; `torchmux list` shows every plugin's state."
            )
        elif self.skipped is not None:
            message += (
                "TORCHMUX_DISABLE_PLUGIN_AUTOLOAD is set, so no third-party plugin was loaded (installed: "
                f"{', '.join(self.skipped) or 'none'}). Unset that variable, or name the plugin's module in "
                "TORCHMUX_PLUGINS (e.g. TORCHMUX_PLUGINS=my_package.torchmux_plugin) to load just that one."
            )
        else:
            message += (
                "Run `torchmux list` to see each one and whether it can run here; a third-party backend "
                "must be pip-installed so its 'torchmux.backends' entry point is found, or named in TORCHMUX_PLUGINS."
            )
        super().__init__(message)


class BackendUnavailableError(TorchmuxError, RuntimeError):
    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason
        super().__init__(f"backend {name!r} cannot run here: {reason}")


class BadArgumentError(TorchmuxError, ValueError):
    """A public function got an argument it does not accept; the message names it and what it accepts."""


class FullGraphError(TorchmuxError, RuntimeError):
    """fullgraph=True was asked for but the program breaks into several graphs."""


class PluginError(TorchmuxError, RuntimeError):
    """A plugin failed to import or registered a hook that does not match the hook specification."""


class IRLintError(TorchmuxError, AssertionError):
    """A graph does not satisfy the normalized-IR invariants (see torchmux.core.ir)."""


class TorchmuxFallbackWarning(UserWarning):
    """A backend failed, crashed or answered wrong on a graph, and torchmux ran the graph another way."""


class NoCorrectBackendError(TorchmuxError, RuntimeError):
    """No candidate backend produced a correct answer for a graph (eager always should: this is a bug)."""


class TorchmuxRemoteCacheWarning(TorchmuxFallbackWarning):
    """The remote cache (TORCHMUX_REMOTE_CACHE) could not be used: down, slow, or an entry failed its check.
    torchmux goes on with the local cache and compiles locally."""
