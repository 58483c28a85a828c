"""The second level of the cache: a Redis server a fleet of machines shares (``TORCHMUX_REMOTE_CACHE``).

The local folder (``$TORCHMUX_CACHE_DIR``) stays the first level. Reading a file: the local copy if there
is one; else the remote entry, written into the local folder; else a miss (the caller builds it and
publishes it, which writes both). The Redis key is the file's path under the cache folder, prefixed
``torchmux:``, so an entry is keyed exactly as the local file is (the folder and file names already hold
the graph fingerprint, signature, candidates and versions).

What travels:

- **data** (decisions, split plans, ONNX models, TVM tuning records): framed ``TMX1d`` + SHA-256 of the
  payload + payload. An entry whose frame or checksum is wrong (another program's key, a truncated
  write) is ignored with a warning.
- **executables** (shared libraries): framed ``TMX1s`` + HMAC-SHA256(fleet key, path + payload) +
  payload, only when ``TORCHMUX_FLEET_KEY_FILE`` names the fleet's key. Without the key they neither
  leave nor enter the machine; with a wrong signature they are refused. Either way they are rebuilt.

Failure is cheap by construction: every request has a short timeout (``TORCHMUX_REMOTE_TIMEOUT``,
0.2 s), no retries; the first failure warns once (:class:`TorchmuxRemoteCacheWarning`) and the server
is left alone for :data:`RETRY_AFTER` seconds, so a down Redis costs one timeout, not one per graph.

Counters (hits, misses, bytes, per level) are kept in memory and added to ``stats.json`` in the cache
folder when the process exits (``torchmux cache stats`` reads them).
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import json
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from . import settings
from .artifacts import atomic_write
from .errors import TorchmuxRemoteCacheWarning

__all__ = ["PREFIX", "fetch_artifact", "flush_stats", "publish_artifact", "read_bytes", "stats", "write_bytes"]

PREFIX = "torchmux:"
DATA, SIGNED = b"TMX1d", b"TMX1s"
RETRY_AFTER = 30.0  # seconds a failed server is left alone before it is tried again
STATS_FILE = "stats.json"

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_down_until: dict[str, float] = {}
_warned: set[str] = set()
_clients: dict[tuple[str, float], Any] = {}


# ------------------------------------------------------------------------------------------------
# the two levels, for files under the cache folder
# ------------------------------------------------------------------------------------------------


def fetch_artifact(path: Path, *, executable: bool = False) -> bool:
    """True if ``path`` (a file under ``$TORCHMUX_CACHE_DIR``) is there now: it was already, or the remote
    cache had it and it was written locally. False: the caller builds it (then :func:`publish_artifact`)."""
    if path.exists():
        _count("local_hits")
        return True
    _count("local_misses")
    data = read_bytes(_relative(path), executable=executable)
    if data is None:
        return False
    try:
        atomic_write(path, data)
    except OSError:
        return False
    return True


def publish_artifact(path: Path, *, executable: bool = False) -> None:
    """Send the local file ``path`` to the remote cache (nothing without one; executables only signed)."""
    rel = _relative(path)
    if rel is None or _url() is None:
        return
    try:
        data = path.read_bytes()
    except OSError:
        return
    write_bytes(rel, data, executable=executable)


def read_bytes(rel: str | None, *, executable: bool = False) -> bytes | None:
    """The checked payload the remote cache holds for ``rel``, or None (no server, miss, failure, bad entry)."""
    url = _url()
    if rel is None or url is None or (executable and _fleet_key() is None):
        return None
    raw = _request(url, "get", PREFIX + rel)
    if raw is None:
        _count("remote_misses")
        return None
    payload = _unframe(rel, raw, executable)
    if payload is None:
        _warn_once(
            f"bad:{rel}",
            f"torchmux: ignoring the remote cache's entry {PREFIX + rel} on {url}: it is not one "
            f"torchmux wrote{' and signed with this fleet key' if executable else ''} (or it was damaged); "
            "building it locally instead",
        )
        _count("remote_rejected")
        return None
    _count("remote_hits")
    _count("remote_bytes_read", len(payload))
    return payload


def write_bytes(rel: str, data: bytes, *, executable: bool = False) -> None:
    url = _url()
    if url is None:
        return
    framed = _frame(rel, data, executable)
    if framed is not None and _request(url, "set", PREFIX + rel, framed) is not None:
        _count("remote_writes")
        _count("remote_bytes_written", len(data))


def _relative(path: Path) -> str | None:
    try:
        return Path(path).resolve().relative_to(Path(settings.CACHE_DIR.get()).resolve()).as_posix()
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------
# framing: checksums for data, signatures for executables
# ------------------------------------------------------------------------------------------------


def _frame(rel: str, data: bytes, executable: bool) -> bytes | None:
    if not executable:
        return DATA + hashlib.sha256(data).digest() + data
    key = _fleet_key()
    if key is None:
        return None  # an unsigned executable never leaves the machine
    return SIGNED + hmac.new(key, rel.encode() + b"\0" + data, hashlib.sha256).digest() + data


def _unframe(rel: str, raw: bytes, executable: bool) -> bytes | None:
    head, tag, payload = raw[:5], raw[5:37], raw[37:]
    if len(raw) < 37:
        return None
    if not executable:
        return payload if head == DATA and hmac.compare_digest(tag, hashlib.sha256(payload).digest()) else None
    key = _fleet_key()
    if head != SIGNED or key is None:
        return None
    good = hmac.new(key, rel.encode() + b"\0" + payload, hashlib.sha256).digest()
    return payload if hmac.compare_digest(tag, good) else None


def _fleet_key() -> bytes | None:
    path = settings.FLEET_KEY_FILE.get()
    if path is None:
        return None
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        _warn_once(
            f"key:{path}",
            f"torchmux: cannot read the fleet key TORCHMUX_FLEET_KEY_FILE={path} ({e}); "
            "executable artifacts are built locally",
        )
        return None
    return key or None


# ------------------------------------------------------------------------------------------------
# the server: lazily connected, short timeouts, left alone for a while after a failure
# ------------------------------------------------------------------------------------------------


def _url() -> str | None:
    return settings.REMOTE_CACHE.get()


def _request(url: str, op: str, *args: Any) -> Any:
    """``client.<op>(*args)``, or None after any failure (warned once per server)."""
    if time.monotonic() < _down_until.get(url, 0.0):
        return None
    try:
        client = _client(url)
        return getattr(client, op)(*args) if client is not None else None
    except Exception as e:  # down, slow, refused, not speaking Redis: all cost the same
        _down_until[url] = time.monotonic() + RETRY_AFTER
        _count("remote_errors")
        _warn_once(
            f"down:{url}",
            f"torchmux: the remote cache {url} failed ({type(e).__name__}: {str(e)[:200]}); "
            f"compiling locally, and not asking it again for {RETRY_AFTER:.0f} s "
            f"(TORCHMUX_REMOTE_TIMEOUT={settings.REMOTE_TIMEOUT.get()} s)",
        )
        return None


def _client(url: str) -> Any:
    timeout = settings.REMOTE_TIMEOUT.get()
    with _lock:
        client = _clients.get((url, timeout))
        if client is None:
            try:
                import redis
                from redis.backoff import NoBackoff
                from redis.retry import Retry
            except ImportError:
                _warn_once(
                    "no-redis",
                    "torchmux: TORCHMUX_REMOTE_CACHE is set but the 'redis' client is not installed "
                    "(pip install 'torchmux[fleet]'); using the local cache only",
                )
                return None
            client = redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
            )
            _clients[(url, timeout)] = client
    return client


def _warn_once(what: str, message: str) -> None:
    if what in _warned:
        return
    _warned.add(what)
    warnings.warn(message, TorchmuxRemoteCacheWarning, stacklevel=3)


def reset() -> None:
    """Forget clients, failures and warnings (tests, or after changing TORCHMUX_REMOTE_CACHE)."""
    with _lock:
        _clients.clear()
        _down_until.clear()
        _warned.clear()


# ------------------------------------------------------------------------------------------------
# counters
# ------------------------------------------------------------------------------------------------


def _count(name: str, n: int = 1) -> None:
    _counts[name] += n


def stats() -> dict[str, int]:
    """This process's counters, not yet added to ``stats.json``."""
    return dict(_counts)


def flush_stats() -> None:
    """Add this process's counters to ``$TORCHMUX_CACHE_DIR/stats.json`` and start again from zero."""
    with _lock:
        if not _counts:
            return
        path = Path(settings.CACHE_DIR.get()) / STATS_FILE
        try:
            total = json.loads(path.read_text()) if path.exists() else {}
            if not isinstance(total, dict):
                total = {}
        except (OSError, ValueError):
            total = {}
        for k, v in _counts.items():
            total[k] = int(total.get(k, 0)) + v
        try:
            atomic_write(path, json.dumps(total, sort_keys=True))
        except OSError:
            return
        _counts.clear()


atexit.register(flush_stats)
