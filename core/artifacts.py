"""Where backends keep what they build, and how they write it.

Every on-disk artifact lives under ``$TORCHMUX_CACHE_DIR/<backend>/``; :func:`artifact_dir` names that
folder. Writes go through :func:`atomic_write`: the data lands in a temporary file in the same folder
and is renamed into place, so a reader (another process, another thread) sees the old file or the new
one, never half of one. Backends reach both through :mod:`torchmux.extend`.

**Executable artifacts are loaded only when authenticated.** A cache directory may be shared or
writable by someone else; a library or kernel planted there would run as the user. :func:`sign`
writes ``<file>.hmac`` beside an artifact: HMAC-SHA256 of its bytes under a per-user secret
(``TORCHMUX_KEY_FILE``, default ``~/.config/torchmux/key``: 32 random bytes, created 0600, outside the
cache, refused if another user can read or write it). :func:`authentic` says whether a file is
exactly what this user's torchmux wrote; a backend rebuilds anything else and never loads it.
A shared cache directory therefore shares data (decisions, ONNX models are re-checked anyway) but
never code: another user's libraries fail authentication and are rebuilt under this user's key.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from . import settings

__all__ = [
    "NONFINITE_KEY",
    "MissingClaims",
    "artifact_dir",
    "atomic_write",
    "authentic",
    "debug_dir",
    "load_claims",
    "load_nonfinite_unsafe",
    "sign",
]


def artifact_dir(*parts: str) -> Path:
    """``$TORCHMUX_CACHE_DIR/<parts...>`` (not created: a read-only cache never stops a compile)."""
    return Path(settings.CACHE_DIR.get()).joinpath(*parts)


def debug_dir() -> Path | None:
    """``$TORCHMUX_DEBUG_DIR`` if set: where code-generating backends write the source they generate."""
    return settings.DEBUG_DIR.get()


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` atomically, creating its folder. Raises ``OSError`` if it cannot."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


#: the longest :func:`building` waits for another process's build (past it, it builds beside that one)
BUILD_WAIT_SECONDS = 300.0


@contextlib.contextmanager
def building(folder: Path, wait: float = BUILD_WAIT_SECONDS) -> Iterator[bool]:
    """Held while this process builds an artifact into ``folder``: another process (another export of the
    same program, a test worker beside this one) that builds into the same folder waits for it, then
    finds what it built instead of building the same files at the same time (two compilers writing one
    shared library can leave a torn one behind, which kills the process that loads it). Yields whether
    the lock is held: not where the folder cannot be written or locked (a read-only cache, no ``fcntl``),
    nor after ``wait`` seconds (a build stuck in another process), where the build goes on unlocked."""
    try:
        import fcntl

        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".building.lock", "a+b")  # noqa: SIM115 -- closed below, after the unlock
    except (ImportError, OSError):
        yield False
        return
    held = False
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except OSError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        yield held
    finally:
        if held:
            fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


class MissingClaims(dict[str, frozenset[str]]):
    """What :func:`load_claims` returns for a claims file that does not exist yet: no claims (the
    backend claims no op, so every graph runs elsewhere), and the path it was looked for at, which the
    placement's reason names. The probe ignores claims, so it runs on such a backend all the same."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path


def load_claims(path: Path | str) -> dict[str, frozenset[str]]:
    """The ops a backend claims, per floating dtype, from the conformance suite's results.

    The file is what ``python -m torchmux.testing.probe BACKEND --write PATH`` writes:
    ``{"float32": ["aten.add.Tensor", ...], "float16": [...], "command": "..."}``. Keys are dtype names
    (``torch.float32`` without ``torch.``); the result maps each to the frozenset of ops that passed.

    A file that does not exist yet (a new plugin, before its first probe) is not an error: the result
    is an empty :class:`MissingClaims` (the backend claims nothing), with one warning that says how to
    write the file. A file that exists but does not parse raises ``ValueError`` naming it.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        warnings.warn(
            f"torchmux: claims file {path} does not exist yet, so this backend claims no op. Write it with "
            f"`python -m torchmux.testing.probe <your.plugin.module> --write {path}` (plugins.md, section 4)",
            stacklevel=2,
        )
        return MissingClaims(path)
    try:
        record = json.loads(text)
    except ValueError as e:
        raise ValueError(
            f"claims file {path} is not JSON ({e}); write it again with python -m torchmux.testing.probe"
        ) from e
    return {k: frozenset(v) for k, v in record.items() if k not in ("command", NONFINITE_KEY)}


#: the claims file's list of ops that differ from eager when their inputs hold NaN or ±inf
NONFINITE_KEY = "nonfinite_unsafe"


def load_nonfinite_unsafe(path: Path | str) -> frozenset[str]:
    """The ops a claims file lists under ``"nonfinite_unsafe"`` (empty if it has no such list, or no file yet)."""
    try:
        return frozenset(json.loads(Path(path).read_text()).get(NONFINITE_KEY, ()))
    except FileNotFoundError:
        return frozenset()


def _key() -> bytes:
    """This user's secret: read from ``TORCHMUX_KEY_FILE``, created (0600) on first use."""
    path = Path(settings.KEY_FILE.get())
    try:
        st = path.stat()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(
            f"{path} must belong to this user with mode 0600 (chmod 600 {path}); "
            "torchmux will not trust artifacts signed with a key others can read"
        )
    return path.read_bytes()


def _mac(path: Path) -> str:
    h = hmac.new(_key(), digestmod=hashlib.sha256)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sign(path: Path) -> None:
    """Write ``<path>.hmac``: this user's HMAC-SHA256 of the artifact at ``path``. Raises OSError if it cannot."""
    atomic_write(path.with_name(path.name + ".hmac"), _mac(path))


def authentic(path: Path) -> bool:
    """Whether ``path`` is an artifact this user's torchmux wrote, unaltered (its ``.hmac`` matches)."""
    try:
        expected = path.with_name(path.name + ".hmac").read_text().strip()
        return hmac.compare_digest(expected, _mac(path))
    except (OSError, ValueError):
        return False
