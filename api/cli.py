"""The ``torchmux`` command: ``torchmux list``, ``torchmux demo``, ``torchmux bench``, ``torchmux cache``,
``torchmux package inspect FILE``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # bench parses its own options (argparse's REMAINDER drops leading --options)
        from ..bench.cli import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["cache"]:  # ls, clear, export, import, stats (api/cache_cli.py)
        from .cache_cli import main as cache_main

        return cache_main(argv[1:])
    parser = argparse.ArgumentParser(prog="torchmux", description="torchmux: every backend competes, per graph.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="show every backend, whether it can run here, and why not")
    demo = sub.add_parser("demo", help="compile a real model with backend='auto' and show what ran where")
    demo.add_argument("--model", default="bert", choices=["bert", "mlp", "cnn"])
    bench = sub.add_parser("bench", help="benchmark the model zoo across systems (see `torchmux bench --help`)")
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    sub.add_parser("cache", help="inspect and manage the cache: ls, clear, export, import, stats")
    package = sub.add_parser("package", help="what a package (torchmux.export(...).save(path)) holds")
    package.add_argument("action", choices=["inspect"])
    package.add_argument("file", help="the package file")
    args = parser.parse_args(argv)

    if args.command == "package":
        from ..core.package import PackageError
        from .load import inspect_package

        try:
            print(inspect_package(args.file))
        except PackageError as e:
            print(f"torchmux package inspect: {e}", file=sys.stderr)
            return 1
        return 0
    if args.command == "list":
        from ..core.registry import format_backends, list_backends

        print(format_backends(list_backends()))
        return 0
    if args.command == "demo":
        from ..bench.demo import run_demo

        return run_demo(args.model)
    if args.command == "bench":
        from ..bench.cli import main as bench_main

        return bench_main(args.rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
