"""Command line: ``transformer-pde list`` and ``transformer-pde run NAME [--option value ...]``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path


def _option_parser(exp) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"transformer-pde run {exp.name}", description=exp.summary)
    p.add_argument("--out", type=Path, default=None, help=f"output directory (default runs/{exp.name})")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    hints = typing.get_type_hints(exp.config)
    for f in dataclasses.fields(exp.config):
        typ = hints[f.name]
        flags = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        if typ is bool:
            p.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction,
                           default=f.default, help=f"(default {f.default})")
        else:
            p.add_argument(*flags, dest=f.name, type=typ, default=f.default, metavar=typ.__name__.upper(),
                           help=f"(default {f.default})")
    return p


def main(argv: list[str] | None = None) -> int:
    from . import experiments
    from .experiments._runner import run_experiment

    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(prog="transformer-pde",
                                  description="Simulate self-attention dynamics and the Transformer PDE.")
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="name the experiments")
    run_p = sub.add_parser("run", help="run an experiment: transformer-pde run NAME [--option value]",
                           add_help=False)
    run_p.add_argument("name")
    args, rest = top.parse_known_args(argv)

    if args.command == "list":
        if rest:
            top.error(f"unrecognized arguments: {' '.join(rest)}")
        width = max(len(n) for n in experiments.REGISTRY)
        for name in sorted(experiments.REGISTRY):
            print(f"{name:<{width}}  {experiments.REGISTRY[name].summary}")
        return 0

    if args.name not in experiments.REGISTRY:
        top.error(f"unknown experiment '{args.name}'; available: "
                  f"{', '.join(sorted(experiments.REGISTRY))} (see 'transformer-pde list')")
    exp = experiments.REGISTRY[args.name]
    opts = _option_parser(exp).parse_args(rest)
    values = {f.name: getattr(opts, f.name) for f in dataclasses.fields(exp.config)}
    try:
        config = exp.make_config(**values)
    except ValueError as e:
        top.error(f"{exp.name}: {e}")
    out = opts.out or Path("runs") / exp.name
    out_info = run_experiment(exp, config, out, progress=not opts.no_progress)
    print(f"data:     {out_info['data']}")
    print(f"metadata: {out_info['metadata']}")
    for fig in out_info["figures"]:
        print(f"figure:   {fig}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
