"""Command line: ``transformer-pde list``, ``transformer-pde run NAME [--option value ...]``,
``transformer-pde plot RUN_DIR``, ``transformer-pde info RUN_DIR`` and ``transformer-pde cache``.

Options of ``run`` come from the experiment's config dataclass. They resolve in three
layers, later ones winning: defaults, ``--config file.toml``, explicit ``--option`` flags.
An option is spelled one way, in kebab case (``--num-saves``, field ``num_saves``; booleans
``--animate`` / ``--no-animate``). List options are comma-separated on the command line
(``--betas 0.5,1,4``) and arrays in TOML (``betas = [0.5, 1, 4]``); each item is checked, and
an error names the option and item. ``run NAME --help`` shows each option's meaning, range and
default. ``list``, ``--help``, ``info`` and ``cache`` import no JAX: they answer at once.

``transformer-pde plot RUN_DIR [--out DIR]`` redraws the figures of a complete run from its
saved ``data.npz`` / ``results.nc``, without recomputing. ``transformer-pde info RUN_DIR``
prints a run's experiment, status, options, provenance and outputs (the arrays of
``data.npz``, the grids of ``results.nc`` and how to open them).

Long runs of resumable experiments checkpoint every ``--checkpoint-every`` save intervals;
``transformer-pde run --resume DIR`` continues a killed, interrupted or failed run from its
last good checkpoint, with the options saved in ``DIR``, and ends bitwise equal to an
uninterrupted run. Running the same command again into a directory whose run is unfinished
continues it the same way; a run with other options there is refused, naming them. One run
at a time holds a directory (a lock; a second run there stops at once, naming the first).
SIGINT and SIGTERM stop a run, marking it "interrupted" in ``DIR/metadata.json``; every file
is written atomically, so even SIGKILL leaves a consistent directory.

Compiled programs are kept in JAX's persistent compilation cache, per user
(``$XDG_CACHE_HOME/transformer_pde/jax``, ``~/.cache/...`` by default): a second run loads them
instead of compiling; every experiment's concrete solves (and phase-diagram's and
normalization's whole programs) also keep their traced programs there (``programs/``,
runs/programs.py), so a second run does not trace them either. ``--compile-cache DIR`` moves it, ``--compile-cache off``
turns both off, as does the environment variable ``TRANSFORMER_PDE_COMPILE_CACHE`` (a directory
or ``off``). ``transformer-pde cache`` says what the cache holds; ``--clear`` empties it of what
runs wrote there (each edit or upgrade starts a new set of programs beside the old ones).

Errors are one line on stderr, never a traceback (``--debug``, or the environment variable
``TRANSFORMER_PDE_DEBUG=1``, prints it too). Exit status: 0 done; 2 bad input: a bad option,
file or directory, a run that cannot be continued, a directory in use (nothing was run), or
a value the computation itself refused (ValueError; the run is marked "failed"); 1 the run
failed otherwise (non-finite state, I/O error, JAX runtime error, damaged file; it is marked
"failed", and once the cause is fixed ``--resume`` retries it from its last good
checkpoint), or an internal error; 128 + N interrupted by signal N.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import re
import signal
import sys
import traceback
from pathlib import Path

_RUN_USAGE = ("transformer-pde run NAME [--config FILE.toml] [--option VALUE ...] [--out DIR]\n"
              "       transformer-pde run --resume DIR")
_PLOT_USAGE = "transformer-pde plot RUN_DIR [--out DIR]"
_INFO_USAGE = "transformer-pde info RUN_DIR"
_CACHE_USAGE = "transformer-pde cache [--compile-cache DIR] [--clear]"
_DEBUG_ENV = "TRANSFORMER_PDE_DEBUG"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``prog: error: message (see prog --help)``.
    A value starting with a minus and a digit or a point is a value, not an option: argparse
    knew only plain negative numbers, so ``--betas -1,2`` (β < 0 in a list) was refused."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-[\d.]")  # no option starts so

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(text, limit: int = 1000) -> str:
    """A message on one line: whitespace runs (newlines included) become one space, an
    Equinox runtime error is cut to its own message, and very long text is shortened."""
    text = str(text)
    m = re.search(r"EquinoxRuntimeError: ([^\n]+)", text)
    if m:
        text = m.group(1)
    lines = [ln.strip() for ln in text.splitlines()]
    text = " ".join(ln for ln in lines if ln and not re.fullmatch(r"[-=_*~]{3,}", ln))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _directory(text: str) -> Path:
    """A directory argument: a non-empty path ('' would be the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a directory, got {text!r} (an empty path would "
                                         f"write into the current directory; pass '.' to mean it)")
    return Path(text)


def _common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=_directory, default=None, help="output directory (default runs/NAME)")
    p.add_argument("--replace", action="store_true",
                   help="replace a complete run in the output directory (of other options; or of these: "
                        "compute it again)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--config", type=Path, default=None, metavar="FILE.toml",
                   help="options from a TOML file (flat 'key = value'; flags given here win)")
    p.add_argument("--checkpoint-every", dest="checkpoint_every", type=_positive_int, default=None,
                   metavar="K", help="resumable experiments: checkpoint every K save intervals")
    p.add_argument("--resume", type=_directory, default=None, metavar="DIR",
                   help="continue the unfinished run in DIR with its saved options")
    p.add_argument("--compile-cache", dest="compile_cache", default=None, metavar="DIR|off",
                   help="JAX's persistent compilation cache: a directory, or 'off' (default "
                        "$TRANSFORMER_PDE_COMPILE_CACHE, else $XDG_CACHE_HOME/transformer_pde/jax); "
                        "a second run loads the compiled programs it can keep instead of compiling "
                        "them (JAX keeps none that holds a run-time check's host callback), and "
                        "the traced programs of its solves too")


def option_flag(name: str) -> str:
    """The one spelling of an option on the command line: ``num_saves`` -> ``--num-saves``."""
    return "--" + name.replace("_", "-")


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
    from .experiments._options import (
        describe_range,
        format_value,
        list_item_type,
        option_bounds,
        option_docs,
        type_name,
    )

    p = _Parser(prog=f"transformer-pde run {exp.name}", description=exp.summary,
                argument_default=argparse.SUPPRESS)
    _common_options(p)
    hints, bounds, docs = exp.option_types(), option_bounds(exp.config), option_docs(exp.config)
    for f in dataclasses.fields(exp.config):
        typ = hints[f.name]
        flags = [option_flag(f.name)]
        ranges = f"{describe_range(bounds[f.name])}; " if f.name in bounds else ""
        doc = f"{docs.get(f.name, '')} ({ranges}default {format_value(f.default)})".strip()
        doc = doc.replace("%", "%%")  # argparse %-formats help texts
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


def _explain(e: BaseException) -> tuple[int, str]:
    """Exit status and the one-line message of an exception that ends a command."""
    import zipfile
    import zlib

    from ._io import DirectoryBusyError
    from .runs import FailedRun, SignalReceived

    if isinstance(e, SignalReceived):
        return 128 + e.signum, f"interrupted ({signal.Signals(e.signum).name})"
    if isinstance(e, KeyboardInterrupt):
        return 128 + signal.SIGINT, "interrupted (SIGINT)"
    if isinstance(e, FailedRun):
        code, text = _explain(e.cause)
        if code == 2:
            text += (f" (the run in {e.run_dir} is marked failed; write a run with other options "
                     f"elsewhere, or remove the directory)")
        else:
            text += (f" (the run in {e.run_dir} is marked failed; once the cause is fixed, "
                     f"transformer-pde run --resume {e.run_dir} retries it from its last good "
                     f"checkpoint)")
        return code, text
    if isinstance(e, (ValueError, DirectoryBusyError)):
        return 2, one_line(e)
    if isinstance(e, OSError):
        where = f" ({e.filename})" if e.filename else ""
        return 1, f"{type(e).__name__}: {one_line(e.strerror or e)}{where}"
    if isinstance(e, (ArithmeticError, MemoryError, RuntimeError, EOFError, zipfile.BadZipFile,
                      zlib.error)):
        return 1, f"{type(e).__name__}: {one_line(e)}"
    return 1, (f"internal error, {type(e).__name__}: {one_line(e)} (please report it, with the "
               f"traceback that --debug prints)")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns 0, or raises SystemExit with the status (see the module
    docstring) after one line on stderr. As the program (``argv`` None: the ``transformer-pde``
    script, ``python -m transformer_pde.cli``) the process ends with the command
    (:func:`_end_process`)."""
    if argv is None:
        try:
            code = _command(sys.argv[1:])
        except SystemExit as e:
            code = e.code
        _end_process(code)
    return _command(list(argv))


def _end_process(code) -> None:
    """End the process now, once stdout and stderr are flushed. After a run's status is written
    nothing is left to do, but JAX's exit-time teardown (clearing its backends and caches, freeing
    device buffers) and the interpreter's last collection kept the process alive after its
    directory said complete (2 s for a reduced normalizing-flow run here, 30 s reported at full
    size). Every file is written atomically when it is written, so none is pending; without JAX
    loaded the exit is the usual one."""
    sys.stdout.flush()
    sys.stderr.flush()
    if "jax" in sys.modules and (code is None or isinstance(code, int)):
        os._exit(code or 0)
    raise SystemExit(code)


def _command(argv: list[str]) -> int:
    debug = "--debug" in argv or os.environ.get(_DEBUG_ENV, "").strip() not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    try:
        with _rare_full_collections():
            return _main(argv)
    except SystemExit:
        raise
    except BaseException as e:
        code, message = _explain(e)
        if debug:
            traceback.print_exception(e)
        print(f"transformer-pde: error: {message}", file=sys.stderr)
        raise SystemExit(code) from None


GC_THRESHOLDS = (700, 10, 1000)
"""Python's garbage-collector thresholds while the command runs (the default is (700, 10, 10)):
young collections as usual, full ones 100x rarer. A full collection walks every live object, and
after importing JAX and tracing a program that is millions (0.06 s a pass); the command's cyclic
garbage is young. phase-diagram at the peers' settings: 7.41 -> 7.08 s, peak memory +6 MB.
Restored when the command returns."""


@contextlib.contextmanager
def _rare_full_collections():
    previous = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)


def _main(argv: list[str]) -> int:
    from . import experiments

    top = _Parser(prog="transformer-pde",
                  description="Simulate self-attention dynamics and the Transformer PDE.")
    top.add_argument("--debug", action="store_true",
                     help=f"on an error, print the traceback too (or set {_DEBUG_ENV}=1)")
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="name the experiments")
    run_p = sub.add_parser("run", help="run an experiment: transformer-pde run NAME [--option value]",
                           usage=_RUN_USAGE, add_help=False)
    run_p.add_argument("name", nargs="?", default=None)
    plot_p = sub.add_parser("plot", help="redraw the figures of a run from its saved data: "
                            "transformer-pde plot RUN_DIR", usage=_PLOT_USAGE)
    plot_p.add_argument("run_dir", type=_directory, metavar="RUN_DIR", help="output directory of a complete run")
    plot_p.add_argument("--out", type=_directory, default=None, metavar="DIR",
                        help="write the figures here (default: RUN_DIR)")
    info_p = sub.add_parser("info", help="what a run directory holds: experiment, status, options, "
                            "provenance, outputs: transformer-pde info RUN_DIR", usage=_INFO_USAGE)
    info_p.add_argument("run_dir", type=_directory, metavar="RUN_DIR", help="output directory of a run")
    cache_p = sub.add_parser("cache", help="what the compile cache holds, and clearing it: "
                             "transformer-pde cache [--clear]", usage=_CACHE_USAGE,
                             description="Runs keep their compiled and traced programs in the compile "
                             "cache. Each edit or upgrade of transformer-pde or the libraries it "
                             "traces through starts a new set beside the old ones, which no run reads "
                             "again: --clear removes what JAX and transformer-pde wrote there (and "
                             "nothing else); the next run of each experiment compiles again.")
    cache_p.add_argument("--compile-cache", default=None, metavar="DIR",
                         help="the cache to look at (default: as run finds it, from "
                              "TRANSFORMER_PDE_COMPILE_CACHE or $XDG_CACHE_HOME/transformer_pde/jax)")
    cache_p.add_argument("--clear", action="store_true",
                         help="remove what JAX and transformer-pde wrote there (the next run compiles again)")
    if len(argv) >= 1 and argv[0] == "run" and (len(argv) == 1 or argv[1].startswith("-")):
        # `run --resume DIR` / `run --config FILE`: no NAME (argparse would take DIR for it)
        args, rest = argparse.Namespace(command="run", name=None), argv[1:]
    else:
        args, rest = top.parse_known_args(argv)

    if args.command == "plot":
        from .runs import redraw

        if rest:
            plot_p.error(f"unrecognized arguments: {' '.join(rest)}")
        for fig in redraw(args.run_dir, experiments.get, args.out):
            print(f"figure:   {fig}")
        return 0

    if args.command == "info":
        from .runs import run_info

        if rest:
            info_p.error(f"unrecognized arguments: {' '.join(rest)}")
        print(run_info(args.run_dir))
        return 0

    if args.command == "cache":
        if rest:
            cache_p.error(f"unrecognized arguments: {' '.join(rest)}")
        return _cache(args.compile_cache, args.clear)

    if args.command == "list":
        if rest:
            top.error(f"unrecognized arguments: {' '.join(rest)}")
        width = max(len(n) for n in experiments.REGISTRY)
        for name in sorted(experiments.REGISTRY):
            print(f"{name:<{width}}  {experiments.REGISTRY[name].summary}")
        return 0
    return _run(experiments, args.name, rest)


def _cache(option: str | None, clear: bool) -> int:
    """``transformer-pde cache``: where the compile cache is and what it holds, or ``--clear``."""
    from .runs.cache_contents import cache_contents, clear_compile_cache
    from .runs.compile_cache import resolve_compile_cache

    directory = resolve_compile_cache(option)
    if directory is None:
        print("the compile cache is off (--compile-cache off or TRANSFORMER_PDE_COMPILE_CACHE=off): "
              "nothing to show; name a directory with --compile-cache DIR")
        return 0
    if clear:
        removed = clear_compile_cache(directory)
        print(f"compile cache {directory}: removed {removed.total()}")
    held = cache_contents(directory)  # a ValueError names a path that is not a directory
    if not directory.exists():
        print(f"compile cache {directory}: not made yet (the first run makes it)")
        return 0
    print(f"compile cache {directory}:")
    print(held.table())
    return 0


def _run(experiments, name: str | None, rest: list[str]) -> int:
    """``transformer-pde run``: resolve the experiment and its options, then run it."""
    from .experiments._base import load_toml
    from .runs import FailedRun, InterruptedRun, SignalReceived, run_experiment, stop_on_signals
    from .runs.compile_cache import enable_compile_cache, resolve_compile_cache
    from .runs.directory import read_metadata
    from .runs.signals import pending_signal

    def available() -> str:  # only for help and errors: listing imports every experiment's config
        return ", ".join(sorted(experiments.REGISTRY))

    resume_dir = None
    if name is None:
        pre = _Parser(prog="transformer-pde run", usage=_RUN_USAGE, add_help=False)
        pre.add_argument("--resume", type=Path, default=None)
        pre.add_argument("--config", type=Path, default=None)
        pre.add_argument("-h", "--help", action="store_true")
        known, _ = pre.parse_known_args(rest)
        if known.help:
            print(f"usage: {_RUN_USAGE}\n\nexperiments: {available()}")
            return 0
        if known.resume is not None:
            resume_dir = known.resume
            meta = read_metadata(resume_dir)
            if meta is None:
                raise ValueError(f"--resume {resume_dir}: no run there (metadata.json is missing)")
            name = meta["experiment"]
        elif known.config is not None:
            name = load_toml(known.config).get("experiment")
            if name is None:
                raise ValueError(f"{known.config} names no experiment; use transformer-pde run NAME "
                                 f"--config {known.config}")
        else:
            raise ValueError(f"run needs an experiment NAME or --resume DIR; available: {available()}")

    if not isinstance(name, str) or name not in experiments.REGISTRY:
        raise ValueError(f"unknown experiment {name!r}; available: {available()} "
                         f"(see 'transformer-pde list')")
    exp = experiments.REGISTRY[name]
    opts = vars(_option_parser(exp).parse_args(rest))
    control = {k: opts.pop(k, None) for k in ("out", "no_progress", "config", "checkpoint_every",
                                             "resume", "compile_cache", "replace")}
    if control["resume"] is not None:
        resume_dir = control["resume"]

    try:
        if resume_dir is not None:
            given = sorted(k for k in ("config", "checkpoint_every") if control[k] is not None)
            given += ["replace"] if control["replace"] else []
            given += sorted(opts)
            if given:
                raise ValueError(f"--resume continues a run with its saved options; remove "
                                 f"{', '.join(option_flag(g) for g in given)}")
            if control["out"] is not None and Path(control["out"]) != Path(resume_dir):
                raise ValueError("--resume DIR writes into DIR; do not also pass --out")
            meta = read_metadata(resume_dir)
            if meta is None:
                raise ValueError(f"--resume {resume_dir}: no run there (metadata.json is missing)")
            if meta["experiment"] != exp.name:
                raise ValueError(f"--resume {resume_dir}: that directory holds a run of "
                                 f"{meta['experiment']!r}, not {exp.name!r}")
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
        raise ValueError(f"{exp.name}: {e}") from None

    enable_compile_cache(resolve_compile_cache(control["compile_cache"]))
    with stop_on_signals():
        try:
            out_info = run_experiment(exp, config, out, progress=not control["no_progress"],
                                      checkpoint_every=control["checkpoint_every"],
                                      resume=resume_dir is not None, replace=bool(control["replace"]))
        except InterruptedRun as e:
            print(f"interrupted ({signal.Signals(e.signum).name}); the output directory is consistent. "
                  f"Continue with: transformer-pde run --resume {e.run_dir}", file=sys.stderr)
            raise SystemExit(128 + e.signum) from None
        except (KeyboardInterrupt, SignalReceived) as e:
            signum = e.signum if isinstance(e, SignalReceived) else int(signal.SIGINT)
            print(f"interrupted ({signal.Signals(signum).name}) before the run started", file=sys.stderr)
            raise SystemExit(128 + signum) from None
        except FailedRun as e:
            if isinstance(e.cause, ValueError):  # a value the computation refused: name the experiment
                raise FailedRun(e.run_dir, ValueError(f"{exp.name}: {e.cause}")) from e.cause
            raise
        except ValueError as e:
            raise ValueError(f"{exp.name}: {e}") from e
        late = pending_signal()
    if late is not None:
        print(f"note: {signal.Signals(late).name} arrived as the run completed; the run is "
              f"complete", file=sys.stderr)
    print(f"data:     {out_info['data']}")
    if out_info.get("grids"):
        print(f"grids:    {out_info['grids']}")
    print(f"metadata: {out_info['metadata']}")
    for fig in out_info["figures"]:
        print(f"figure:   {fig}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()
