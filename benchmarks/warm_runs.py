"""What a run costs once its programs exist: the floor under any compile cache (issue 24, item 3).

    python benchmarks/warm_runs.py -- run phase-diagram --num-betas 4 --batch 256 --t1 30 --num-saves 61
    python benchmarks/warm_runs.py --repeats 3 -- run normalization --seeds 64 --t1 20 --betas 1,5,9

Runs one ``transformer-pde`` command ``1 + repeats`` times in one process, each into a fresh output
directory (``--out`` is set here), and times a fresh interpreter importing every module the runs
loaded (the package imports lazily, inside the first run). The first run traces and compiles; the
later ones find every program in JAX's in-memory caches and pay only running, figures and writing.
Import time plus a later run is about the fastest a second process could be, whatever it cached
(JAX's persistent cache skips XLA only; ``runs/programs.py`` skips tracing too, for the experiments
whose programs it keeps, and such a process imports fewer modules than these: none that only
tracing needs, so it can beat this floor). The persistent compile cache is off, so the first run
is a cold one. Prints one JSON object (seconds; the XLA compilations of each run, which
should be none after the first).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _import_seconds(modules: list[str]) -> float:
    """Wall time of a fresh interpreter importing ``modules`` in the order the runs loaded them
    (the package imports lazily: what a run needs is known only after it)."""
    code = ("import importlib, time\nt = time.perf_counter()\n"
            f"for m in {modules!r}:\n"
            "    try:\n        importlib.import_module(m)\n    except Exception:\n        pass\n"
            "print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="runs after the first (cold) one")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after '--': the transformer-pde arguments (run NAME [options]), no --out")
    args = p.parse_args(argv)
    command = [a for a in args.command if a != "--"]
    if len(command) < 2 or command[0] != "run":
        p.error("give the command after '--', e.g. -- run phase-diagram --batch 16")
    if "--out" in command:
        p.error("--out is set per run by this script")
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    os.environ["TRANSFORMER_PDE_COMPILE_CACHE"] = "off"
    loaded_before = set(sys.modules)

    import jax  # noqa: PLC0415

    from transformer_pde import cli  # noqa: PLC0415

    compiled = []  # XLA compilations, counted per run: a later run should have none

    def on_event(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(on_event)
    runs, compilations = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1 + args.repeats):
            compiled.clear()
            t = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):  # the run's paths; stdout is the report
                cli.main([*command, "--out", str(Path(tmp) / f"run{i}")])  # SystemExit on an error
            runs.append(time.perf_counter() - t)
            compilations.append(len(compiled))
    later = sorted(runs[1:])
    import_s = _import_seconds([m for m in sys.modules if m not in loaded_before])
    report = {"command": command, "import_s": import_s, "first_run_s": runs[0], "later_runs_s": runs[1:],
              "compilations_per_run": compilations,
              "median_later_s": later[len(later) // 2],
              "floor_s": import_s + later[len(later) // 2],
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
