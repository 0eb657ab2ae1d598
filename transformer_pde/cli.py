"""Command line: ``transformer-pde list``, ``transformer-pde run NAME [--option value ...]`` and
``transformer-pde plot RUN_DIR``.

Options of ``run`` come from the experiment's config dataclass. They resolve in three
layers, later ones winning: defaults, ``--config file.toml``, explicit ``--option`` flags.
List options are comma-separated on the command line (``--betas 0.5,1,4``) and arrays in
TOML (``betas = [0.5, 1, 4]``); each item is checked, and an error names the option and item.

``transformer-pde plot RUN_DIR [--out DIR]`` redraws the figures of a complete run from its
saved ``data.npz`` / ``results.nc``, without recomputing.

Long runs of resumable experiments checkpoint every ``--checkpoint-every`` save intervals;
``transformer-pde run --resume DIR`` continues a killed or interrupted run from its last
checkpoint, with the options saved in ``DIR``, and ends bitwise equal to an uninterrupted
run. SIGINT and SIGTERM stop a run between chunks, marking it "interrupted" in
``DIR/metadata.json``; every file is written atomically, so even SIGKILL leaves a
consistent directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from pathlib import Path

_RUN_USAGE = ("transformer-pde run NAME [--config FILE.toml] [--option VALUE ...] [--out DIR]\n"
              "       transformer-pde run --resume DIR")
_PLOT_USAGE = "transformer-pde plot RUN_DIR [--out DIR]"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/NAME)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--config", type=Path, default=None, metavar="FILE.toml",
                   help="options from a TOML file (flat 'key = value'; flags given here win)")
    p.add_argument("--checkpoint-every", dest="checkpoint_every", type=_positive_int, default=None,
                   metavar="K", help="resumable experiments: checkpoint every K save intervals")
    p.add_argument("--resume", type=Path, default=None, metavar="DIR",
                   help="continue the unfinished run in DIR with its saved options")


def _text_parser(exp, key: str, typ):
    """argparse ``type=``: command-line text -> the typed option value (lists parsed here, once)."""
    from .experiments._options import parse_option_text

    def parse(text: str):
        try:
            return parse_option_text(exp.name, key, typ, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _option_parser(exp) -> argparse.ArgumentParser:
    from .experiments._options import format_value, list_item_type, type_name

    p = argparse.ArgumentParser(prog=f"transformer-pde run {exp.name}", description=exp.summary,
                                argument_default=argparse.SUPPRESS)
    _common_options(p)
    hints = exp.option_types()
    for f in dataclasses.fields(exp.config):
        typ = hints[f.name]
        flags = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        doc = f"(default {format_value(f.default)})"
        if typ is bool:
            p.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, help=doc)
        elif typ in (int, float, str):
            # plain types keep argparse's own messages ("invalid float value: 'hot'")
            p.add_argument(*flags, dest=f.name, type=typ, metavar=typ.__name__.upper(), help=doc)
        else:  # Literal variants and tuple[X, ...] lists
            metavar = type_name(typ).upper() if list_item_type(typ) in (int, float) else type_name(typ)
            p.add_argument(*flags, dest=f.name, type=_text_parser(exp, f.name, typ), metavar=metavar,
                           help=doc)
    return p


def _install_signal_handlers():
    """SIGTERM (and SIGINT) raise RunInterrupted, so the runner can mark the run and exit."""
    from .experiments._runner import RunInterrupted

    def handler(signum, frame):
        raise RunInterrupted(signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not in the main thread (e.g. called from a test thread)
            pass
    return previous


def main(argv: list[str] | None = None) -> int:
    from . import experiments
    from .experiments._base import load_toml
    from .experiments._runner import RunInterrupted, read_metadata, redraw, run_experiment

    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(prog="transformer-pde",
                                  description="Simulate self-attention dynamics and the Transformer PDE.")
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="name the experiments")
    run_p = sub.add_parser("run", help="run an experiment: transformer-pde run NAME [--option value]",
                           usage=_RUN_USAGE, add_help=False)
    run_p.add_argument("name", nargs="?", default=None)
    plot_p = sub.add_parser("plot", help="redraw the figures of a run from its saved data: "
                            "transformer-pde plot RUN_DIR", usage=_PLOT_USAGE)
    plot_p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="output directory of a complete run")
    plot_p.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write the figures here (default: RUN_DIR)")
    if len(argv) >= 1 and argv[0] == "run" and (len(argv) == 1 or argv[1].startswith("-")):
        # `run --resume DIR` / `run --config FILE`: no NAME (argparse would take DIR for it)
        args, rest = argparse.Namespace(command="run", name=None), argv[1:]
    else:
        args, rest = top.parse_known_args(argv)

    if args.command == "plot":
        if rest:
            plot_p.error(f"unrecognized arguments: {' '.join(rest)}")
        try:
            figures = redraw(args.run_dir, args.out)
        except ValueError as e:
            plot_p.error(str(e))
        for fig in figures:
            print(f"figure:   {fig}")
        return 0

    if args.command == "list":
        if rest:
            top.error(f"unrecognized arguments: {' '.join(rest)}")
        width = max(len(n) for n in experiments.REGISTRY)
        for name in sorted(experiments.REGISTRY):
            print(f"{name:<{width}}  {experiments.REGISTRY[name].summary}")
        return 0

    name = args.name
    resume_dir = None
    if name is None:
        pre = argparse.ArgumentParser(prog="transformer-pde run", usage=_RUN_USAGE, add_help=False)
        pre.add_argument("--resume", type=Path, default=None)
        pre.add_argument("--config", type=Path, default=None)
        pre.add_argument("-h", "--help", action="store_true")
        known, _ = pre.parse_known_args(rest)
        if known.help:
            print(f"usage: {_RUN_USAGE}\n\nexperiments: {', '.join(sorted(experiments.REGISTRY))}")
            return 0
        if known.resume is not None:
            resume_dir = known.resume
            try:
                meta = read_metadata(resume_dir)
            except ValueError as e:
                top.error(str(e))
            if meta is None:
                top.error(f"--resume {resume_dir}: no run there (metadata.json is missing)")
            name = meta.get("experiment")
        elif known.config is not None:
            try:
                name = load_toml(known.config).get("experiment")
            except ValueError as e:
                top.error(str(e))
            if name is None:
                top.error(f"{known.config} names no experiment; use transformer-pde run NAME "
                          f"--config {known.config}")
        else:
            top.error(f"run needs an experiment NAME or --resume DIR; available: "
                      f"{', '.join(sorted(experiments.REGISTRY))}")

    if name not in experiments.REGISTRY:
        top.error(f"unknown experiment '{name}'; available: "
                  f"{', '.join(sorted(experiments.REGISTRY))} (see 'transformer-pde list')")
    exp = experiments.REGISTRY[name]
    opts = vars(_option_parser(exp).parse_args(rest))
    control = {k: opts.pop(k, None) for k in ("out", "no_progress", "config", "checkpoint_every",
                                             "resume")}
    if control["resume"] is not None:
        resume_dir = control["resume"]

    try:
        if resume_dir is not None:
            given = sorted(k for k in ("config", "checkpoint_every") if control[k] is not None)
            given += sorted(opts)
            if given:
                raise ValueError(f"--resume continues a run with its saved options; remove "
                                 f"{', '.join('--' + g.replace('_', '-') for g in given)}")
            if control["out"] is not None and Path(control["out"]) != Path(resume_dir):
                raise ValueError("--resume DIR writes into DIR; do not also pass --out")
            meta = read_metadata(resume_dir)
            if meta is None:
                raise ValueError(f"--resume {resume_dir}: no run there (metadata.json is missing)")
            if meta.get("experiment") != exp.name:
                raise ValueError(f"--resume {resume_dir}: that directory holds a run of "
                                 f"{meta.get('experiment')!r}, not {exp.name!r}")
            if meta.get("status") == "complete":
                print(f"{resume_dir}: this run is already complete; nothing to do")
                print(f"data:     {Path(resume_dir) / 'data.npz'}")
                return 0
            if not exp.resumable:
                print(f"note: {exp.name} does not checkpoint; rerunning it from the start",
                      file=sys.stderr)
            config = exp.config_from_mapping(meta.get("config", {}), source=f"{resume_dir}/metadata.json")
            out = Path(resume_dir)
        else:
            mapping = load_toml(control["config"]) if control["config"] is not None else {}
            config = exp.config_from_mapping(mapping, source=str(control["config"] or "options"),
                                             **opts)
            out = control["out"] or Path("runs") / exp.name
    except ValueError as e:
        top.error(f"{exp.name}: {e}")

    previous = _install_signal_handlers()
    try:
        out_info = run_experiment(exp, config, out, progress=not control["no_progress"],
                                  checkpoint_every=control["checkpoint_every"],
                                  resume=resume_dir is not None)
    except ValueError as e:
        top.error(f"{exp.name}: {e}")
    except (KeyboardInterrupt, RunInterrupted) as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"\ninterrupted ({signal.Signals(signum).name}); the output directory is consistent. "
              f"Continue with: transformer-pde run --resume {out}", file=sys.stderr)
        return 128 + int(signum)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
    print(f"data:     {out_info['data']}")
    if out_info.get("grids"):
        print(f"grids:    {out_info['grids']}")
    print(f"metadata: {out_info['metadata']}")
    for fig in out_info["figures"]:
        print(f"figure:   {fig}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
