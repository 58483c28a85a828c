"""``torchmux cache``: look at, clear, ship and count what torchmux keeps in ``$TORCHMUX_CACHE_DIR``.

- ``ls``: every decision (graph, winner, each candidate's measurement, age) and every artifact folder
  (backend, files, bytes, age).
- ``clear [--older-than 7d]``: delete everything, or what was last written longer ago than that.
- ``export FILE`` / ``import FILE``: a portable bundle (tar.gz) to ship tuned decisions with a model into
  a container or an air-gapped machine. It holds data only, the files :data:`BUNDLED` names:
  decisions (with their split plans), ONNX models, TVM tuning records, and a ``MANIFEST.json`` with
  each file's SHA-256. Import checks every member before writing anything: a plain file, a name that
  matches :data:`BUNDLED` (no absolute path, no ``..``, no shared library), the SHA-256 the manifest
  gives, and a JSON file's schema; one bad member refuses the whole bundle.
- ``demotions [--clear] [--backend NAME]``: the backends demoted after a later check failed (a wrong
  answer or an exception after their trial, autotune/verify.py), and the failed verdicts that carry a
  demotion or a failed trial to every graph of the same structure (autotune/verdicts.py): backend, its
  version, graph, reason, age. Both are keyed on the backend's name and version and torch's and
  torchmux's versions (a demotion also on the graph and input signature, a verdict on the structure and
  mode), and hold across processes until then; ``--clear`` deletes them (of one backend with
  ``--backend``), so the next process tries that backend again.
- ``stats``: hits, misses and bytes of the local and the remote level (core/remote_cache.py counts them
  and adds them to ``stats.json`` when a process exits), and the cache's size on disk.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from ..core import remote_cache, settings
from ..core.artifacts import atomic_write, sign

#: what a bundle may hold, as paths under the cache folder (the only names import accepts)
BUNDLED = {
    "decision": re.compile(r"decisions/[0-9a-f]{16,64}\.json"),
    "onnx": re.compile(r"onnxruntime/[0-9a-f]{16,64}/model(\.opt)?\.onnx"),
    "tuning": re.compile(r"tvm/tuning/[0-9a-f]{8,64}/records\.json"),
}
MANIFEST = "MANIFEST.json"
MAX_MEMBER = 2 << 30  # 2 GiB: an ONNX model with its weights inside fits


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="torchmux cache",
        description=f"inspect and manage torchmux's cache (TORCHMUX_CACHE_DIR={settings.CACHE_DIR.get()})",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("ls", help="decisions with their measurements, artifacts with their sizes and ages")
    clear = sub.add_parser("clear", help="delete the cache, or what is older than --older-than")
    clear.add_argument(
        "--older-than",
        type=_duration,
        default=None,
        metavar="AGE",
        help="e.g. 30m, 12h, 7d: keep what was written more recently",
    )
    exp = sub.add_parser("export", help="write decisions, ONNX models and tuning records to a bundle (tar.gz)")
    exp.add_argument("file", type=Path)
    imp = sub.add_parser("import", help="check a bundle and add what it holds to the cache")
    imp.add_argument("file", type=Path)
    dem = sub.add_parser("demotions", help="backends demoted after a later check failed; --clear forgets them")
    dem.add_argument("--clear", action="store_true", help="delete the demotion records")
    dem.add_argument("--backend", default=None, metavar="NAME", help="only this backend's records")
    sub.add_parser("stats", help="hits, misses and bytes, local and remote")
    args = parser.parse_args(argv)
    root = Path(settings.CACHE_DIR.get())
    try:
        if args.action == "ls":
            print(listing(root))
        elif args.action == "clear":
            n, size = clear_cache(root, args.older_than)
            print(f"removed {n} files ({_size(size)}) from {root}")
        elif args.action == "export":
            members = export_bundle(root, args.file)
            print(f"wrote {args.file}: {len(members)} files ({', '.join(_kinds(members))})")
        elif args.action == "import":
            members = import_bundle(root, args.file)
            print(f"imported {len(members)} files into {root} ({', '.join(_kinds(members))})")
        elif args.action == "demotions":
            print(demotions(root, args.backend, clear=args.clear))
        elif args.action == "stats":
            print(format_stats(root))
    except BundleError as e:
        print(f"torchmux cache {args.action}: {e}", file=sys.stderr)
        return 1
    return 0


class BundleError(ValueError):
    """A bundle that cannot be written or must not be imported; the message says which member and why."""


# ------------------------------------------------------------------------------------------------ ls
def listing(root: Path) -> str:
    now, lines = time.time(), [f"torchmux cache at {root}"]
    decisions = sorted((root / "decisions").glob("*.json"), key=lambda p: p.stat().st_mtime)
    lines.append(f"decisions: {len(decisions)}")
    for path in decisions:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            lines.append(f"  {path.stem[:12]}  (unreadable)")
            continue
        runs = ", ".join(f"{m.get('backend')} {_ms(m.get('seconds'))}" for m in record.get("measurements", []))
        split = " split" if record.get("plan") else ""
        lines.append(
            f"  {path.stem[:12]}  {record.get('graph', '?'):<28} -> {record.get('backend')}{split}"
            f"  [{runs}]  {_age(now - path.stat().st_mtime)}"
        )
    lines.append("artifacts:")
    for backend in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "decisions") if root.exists() else []:
        for entry in sorted(backend.iterdir()):
            files = [f for f in ([entry] if entry.is_file() else entry.rglob("*")) if f.is_file()]
            if files:
                newest = max(f.stat().st_mtime for f in files)
                lines.append(
                    f"  {backend.name}/{entry.name:<34} {len(files):>3} files {_size(sum(f.stat().st_size for f in files)):>9}"
                    f"  {_age(now - newest)}"
                )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- demotions
def demotions(root: Path, backend: str | None = None, *, clear: bool = False) -> str:
    """The demotion records under ``root/demoted`` and the failed verdicts under ``root/verdicts`` (a
    demotion or a failed trial carried to every graph of the same structure, autotune/verdicts.py), of
    ``backend`` only if given, one line each; with ``clear``, deleted, and the last line says how many."""
    now, lines, counts = time.time(), [], {"demoted": 0, "verdicts": 0}
    for folder in ("demoted", "verdicts"):
        for path in sorted((root / folder).glob("*.json"), key=lambda p: p.stat().st_mtime):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                record = {}
            record = record if isinstance(record, dict) else {}
            name = str(record.get("backend", "?"))
            if (backend is not None and name != backend) or record.get("ok") is True:
                continue  # another backend's, or a verdict that the trial was safe
            what = f"{name} {record['version']}" if record.get("version") else name
            what += f" on {record['graph']}" if record.get("graph") else ""
            what += " (every graph of this structure)" if folder == "verdicts" else ""
            lines.append(f"  {what}: {record.get('reason', '(unreadable)')}  {_age(now - path.stat().st_mtime)}")
            counts[folder] += 1
            if clear:
                path.unlink()
    who = f" of {backend}" if backend else ""
    total = f"{counts['demoted']} demotion records and {counts['verdicts']} failed verdicts{who}"
    if clear:
        return "\n".join([*lines, f"removed {total} from {root}"])
    return "\n".join([f"{total} in {root}", *lines])


# --------------------------------------------------------------------------------------------- clear
def clear_cache(root: Path, older_than: float | None) -> tuple[int, int]:
    """Remove every file (or those last written more than ``older_than`` seconds ago); (files, bytes)."""
    if not root.exists():
        return 0, 0
    cutoff = time.time() - older_than if older_than is not None else None
    n = size = 0
    for f in sorted(root.rglob("*"), reverse=True):
        if f.is_file() and f.name != remote_cache.STATS_FILE and (cutoff is None or f.stat().st_mtime < cutoff):
            size += f.stat().st_size
            f.unlink()
            n += 1
        elif f.is_dir() and not any(f.iterdir()):
            f.rmdir()
    return n, size


# ----------------------------------------------------------------------------------- export / import
def bundled_files(root: Path) -> dict[str, Path]:
    out = {}
    for f in sorted(root.rglob("*")) if root.exists() else []:
        rel = f.relative_to(root).as_posix()
        if f.is_file() and _kind(rel):
            out[rel] = f
    return out


def export_bundle(root: Path, target: Path) -> list[str]:
    files = bundled_files(root)
    manifest = {"format": 1, "files": {rel: hashlib.sha256(f.read_bytes()).hexdigest() for rel, f in files.items()}}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
        for rel, f in files.items():
            tar.add(f, arcname=rel, recursive=False)
    atomic_write(target, buf.getvalue())
    return list(files)


def import_bundle(root: Path, source: Path) -> list[str]:
    """Check every member of the bundle, then write them all (nothing is written if one is bad)."""
    try:
        tar = tarfile.open(source, mode="r:*")  # noqa: SIM115  (closed by the `with tar:` below, after the error check)
    except (OSError, tarfile.TarError) as e:
        raise BundleError(f"{source} is not a torchmux cache bundle ({e})") from None
    checked: dict[str, bytes] = {}
    with tar:
        members = tar.getmembers()
        manifest = _manifest(tar, members, source)
        for m in members:
            if m.name == MANIFEST:
                continue
            if not m.isfile():
                raise BundleError(f"{m.name!r} is not a plain file (links and devices are refused)")
            if not _kind(m.name):
                raise BundleError(
                    f"{m.name!r} is not something a bundle may hold (decisions, ONNX models and "
                    "TVM tuning records only; never a path outside the cache or an executable)"
                )
            if m.size > MAX_MEMBER:
                raise BundleError(f"{m.name!r} is {_size(m.size)}, more than a bundle member may be")
            data = tar.extractfile(m).read()  # type: ignore[union-attr]
            if manifest.get(m.name) != hashlib.sha256(data).hexdigest():
                raise BundleError(f"{m.name!r} does not match the SHA-256 in {MANIFEST} (damaged or altered)")
            _check_content(m.name, data)
            checked[m.name] = data
    missing = set(manifest) - set(checked)
    if missing:
        raise BundleError(f"{MANIFEST} lists files the bundle lacks: {sorted(missing)[:3]}")
    for rel, data in checked.items():
        atomic_write(root / rel, data)
        if _kind(rel) == "onnx":  # checked against the manifest's SHA-256: signed as this user's (ONNX Runtime
            sign(root / rel)  # loads a cached model only with this user's digest beside it)
    return list(checked)


def _manifest(tar: tarfile.TarFile, members: list[tarfile.TarInfo], source: Path) -> dict[str, str]:
    entry = next((m for m in members if m.name == MANIFEST and m.isfile()), None)
    if entry is None:
        raise BundleError(f"{source} has no {MANIFEST}: not written by `torchmux cache export`")
    try:
        manifest = json.loads(tar.extractfile(entry).read())  # type: ignore[union-attr]
        files = manifest["files"]
        assert manifest.get("format") == 1 and isinstance(files, dict)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    except (ValueError, KeyError, TypeError, AssertionError):
        raise BundleError(f"{MANIFEST} in {source} is malformed") from None
    return files


def _check_content(rel: str, data: bytes) -> None:
    kind = _kind(rel)
    if kind == "onnx":
        if not data[:1] == b"\x08":  # an ONNX ModelProto starts with field 1 (ir_version), a varint
            raise BundleError(f"{rel!r} is not an ONNX model")
        return
    try:
        record = json.loads(data)
        if kind == "decision":
            assert isinstance(record, dict) and isinstance(record.get("backend"), str)
            assert isinstance(record.get("measurements", []), list)
            for m in record.get("measurements", []):
                assert isinstance(m, dict) and isinstance(m.get("backend"), str)
                assert m.get("seconds") is None or isinstance(m["seconds"], (int, float))
            plan = record.get("plan")
            assert plan is None or (
                isinstance(plan, dict)
                and all(isinstance(c, int) for c in plan.get("cuts", []))
                and all(isinstance(b, str) for b in plan.get("backends", []))
            )
        else:  # tuning records
            assert isinstance(record, dict) and isinstance(record.get("workloads"), dict)
    except (ValueError, AssertionError, AttributeError):
        raise BundleError(f"{rel!r} is not a valid torchmux {kind} record") from None


def _kind(rel: str) -> str | None:
    return next((k for k, pattern in BUNDLED.items() if pattern.fullmatch(rel)), None)


def _kinds(members: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for rel in members:
        counts[_kind(rel) or "?"] = counts.get(_kind(rel) or "?", 0) + 1
    return [f"{n} {k}" for k, n in sorted(counts.items())] or ["empty"]


# --------------------------------------------------------------------------------------------- stats
def format_stats(root: Path) -> str:
    remote_cache.flush_stats()
    try:
        counts: dict[str, Any] = json.loads((root / remote_cache.STATS_FILE).read_text())
    except (OSError, ValueError):
        counts = {}
    on_disk = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0
    c = {
        k: int(counts.get(k, 0))
        for k in (
            "local_hits",
            "local_misses",
            "remote_hits",
            "remote_misses",
            "remote_rejected",
            "remote_errors",
            "remote_writes",
            "remote_bytes_read",
            "remote_bytes_written",
        )
    }
    remote = settings.REMOTE_CACHE.get() or "not configured (TORCHMUX_REMOTE_CACHE)"
    return "\n".join(
        [
            f"local  {root}: {c['local_hits']} hits, {c['local_misses']} misses, {_size(on_disk)} on disk",
            (
                f"remote {remote}: {c['remote_hits']} hits, {c['remote_misses']} misses, {c['remote_rejected']} rejected, "
                f"{c['remote_errors']} errors; {_size(c['remote_bytes_read'])} read, "
                f"{c['remote_writes']} writes ({_size(c['remote_bytes_written'])})"
            ),
        ]
    )


# ------------------------------------------------------------------------------------------- helpers
def _duration(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age; write e.g. 90s, 30m, 12h, 7d or 2w")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[match[2]]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _ms(seconds: Any) -> str:
    return f"{seconds * 1e3:.3f} ms" if isinstance(seconds, (int, float)) else "failed"


__all__ = ["BUNDLED", "BundleError", "clear_cache", "export_bundle", "import_bundle", "listing", "main"]
