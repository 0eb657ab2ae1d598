"""Every experiment's tiny size run twice from the command line: the first with an empty compile
cache, the second with the cache the first filled (issue 36, item 5: the second at most half the
first).

    python benchmarks/tiny_runs.py --repeats 3 --out benchmarks/results/tiny-runs
    python benchmarks/tiny_runs.py --only clustering,phase-diagram --repeats 1 --out /tmp/tiny

Each repeat of an experiment takes a fresh cache directory (``--compile-cache DIR``: JAX's
persistent cache and the kept programs) and a fresh output directory; the config is the
experiment's ``tiny`` overrides, written as the TOML ``transformer-pde run NAME --config`` reads.
A run is a whole process (``python -m transformer_pde.cli run ...``), timed by wall clock around
it; medians over the repeats. Writes ``tiny_runs.json`` (every time) and ``tiny_runs.md`` (the
table) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _command(name: str, config: Path, out: Path, cache: Path) -> list[str]:
    return [sys.executable, "-m", "transformer_pde.cli", "run", name, "--config", str(config),
            "--out", str(out), "--compile-cache", str(cache), "--no-progress"]


REFUSED = "because it uses host callbacks"
"""What JAX logs (``JAX_EXPLAIN_CACHE_MISSES``) for a program its persistent cache does not keep."""


def _timed(command: list[str]) -> tuple[float, int]:
    """Wall seconds of the command, and how many programs JAX refused to cache (host callbacks)."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "JAX_EXPLAIN_CACHE_MISSES": "true"})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds, done.stderr.count(REFUSED)


def measure(names: list[str], repeats: int, work: Path, progress: Path | None = None,
            keep: Path | None = None) -> dict:
    """First and second runs of each experiment, ``repeats`` times, with the 1-minute load average
    before each run (a shared machine's other work shows there); ``progress`` gets the results so
    far after each experiment (JSON); ``keep`` the first repeat's saved arrays of both runs
    (``NAME-first.npz``, ``NAME-second.npz``: the run's ``data.npz``) to compare bitwise."""
    from transformer_pde.experiments import get

    results = {}
    for name in names:
        exp = get(name)
        config = work / f"{name}.toml"
        config.write_text(exp.config_toml(exp.make_config(**exp.tiny)))
        first, second, refused, load = [], [], 0, []
        for r in range(repeats):
            cache = work / f"cache-{name}-{r}"
            load.append(os.getloadavg()[0])
            seconds, refused = _timed(_command(name, config, work / f"{name}-{r}-first", cache))
            first.append(seconds)
            load.append(os.getloadavg()[0])
            second.append(_timed(_command(name, config, work / f"{name}-{r}-second", cache))[0])
            if keep is not None and r == 0:
                keep.mkdir(parents=True, exist_ok=True)
                for run in ("first", "second"):
                    shutil.copyfile(work / f"{name}-{r}-{run}" / "data.npz", keep / f"{name}-{run}.npz")
        results[name] = {"first": first, "second": second, "refused": refused, "load": load,
                         "utc": time.strftime("%H:%M", time.gmtime())}
        print(f"{name}: first {first}, second {second}, refused {refused}, load {load}", file=sys.stderr, flush=True)
        if progress is not None:
            progress.write_text(json.dumps(results, indent=1))
    return results


def table(results: dict) -> str:
    rows = ["| experiment | first run s (median) | second run s (median) | second / first | first runs | second runs "
            "| load average (1 min) before each run | programs the cache refused (host callbacks) |",
            "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        a, b = statistics.median(r["first"]), statistics.median(r["second"])
        rows.append(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f} | "
                    f"{', '.join(f'{v:.1f}' for v in r['first'])} | {', '.join(f'{v:.1f}' for v in r['second'])} "
                    f"| {', '.join(f'{v:.1f}' for v in r.get('load', []))} | {r['refused']} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default=None, help="comma-separated experiment names (default: all)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--keep", type=Path, default=None,
                   help="folder for each experiment's saved arrays of both runs (to compare them bitwise)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    from transformer_pde.experiments import REGISTRY

    names = sorted(REGISTRY) if args.only is None else args.only.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "tiny_runs.partial.json"  # the results so far, for a run stopped midway
    with tempfile.TemporaryDirectory(prefix="tiny-runs-") as work:
        results = measure(names, args.repeats, Path(work), partial, args.keep)
    meta = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "repeats": args.repeats,
            "command": "python -m transformer_pde.cli run NAME --config TINY.toml --out OUT "
                       "--compile-cache CACHE --no-progress"}
    (args.out / "tiny_runs.json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
    (args.out / "tiny_runs.md").write_text(table(results))
    partial.unlink(missing_ok=True)  # this run's own progress file: tiny_runs.json now holds all of it
    print(table(results))
    return results


if __name__ == "__main__":
    main()
