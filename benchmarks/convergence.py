"""Benchmark: mean-field convergence rate of the particle system, n = 2^6 .. 2^16.

Runs :func:`transformer_pde.convergence.convergence_study` for the softmax model of the
``convergence`` experiment (Gaussian data, Gaussian-closure reference), one particle count at a
time, and reports per n the wall time (first call: includes compilation) and the errors, then
the fitted rates against the Monte Carlo n^{-1/2} and empirical-W_2 n^{-1/d} rates.

    python benchmarks/convergence.py                      # 2^6 .. 2^16, 4 seeds (GPU-sized)
    python benchmarks/convergence.py --log2-max 12 --out runs/bench_convergence

Above ~2^14 particles the attention switches to the streaming kernel (O(n · block) memory);
n = 2^16 takes minutes per seed on a CPU and seconds on a GPU. Writes ``timings.csv``,
``rates.csv`` and ``results.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log2-min", type=int, default=6)
    p.add_argument("--log2-max", type=int, default=16)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--t1", type=float, default=1.0)
    p.add_argument("--dt", type=float, default=0.05)
    p.add_argument("--log2-w2-max", type=int, default=12)
    p.add_argument("--x64", action="store_true", help="float64 (default float32)")
    p.add_argument("--out", type=Path, default=Path("runs/bench_convergence"))
    args = p.parse_args(argv)
    if args.x64:
        jax.config.update("jax_enable_x64", True)

    from transformer_pde import convergence as cv
    from transformer_pde.experiments.convergence import ConvergenceConfig, setup

    cfg = ConvergenceConfig(d=args.d, t1=args.t1, dt=args.dt, seeds=args.seeds)
    dyn, law = setup(cfg)
    ts = [0.0, args.t1 / 2, args.t1]
    ns = cv.geometric_ns(args.log2_min, args.log2_max)
    print(f"device: {jax.devices()[0]}, d={args.d}, seeds={args.seeds}, t1={args.t1}, dt={args.dt}")
    print(f"{'n':>8} {'wall_s':>9} {'bw(t1)':>10} {'coupling':>10} {'w2(t1)':>10}")
    rows, errors = [], {k: [] for k in cv.METRICS}
    for n in ns:
        start = time.perf_counter()
        res = cv.convergence_study(dyn, law, [int(n)], t1=args.t1, dt0=args.dt, ts=ts,
                                   seeds=range(args.seeds), w2_max_n=2**args.log2_w2_max)
        wall = time.perf_counter() - start
        for k in cv.METRICS:
            errors[k].append(res.errors[k][0])
        row = {"n": int(n), "wall_s": wall,
               **{k: float(np.mean(res.errors[k][0, :, -1])) for k in cv.METRICS}}
        rows.append(row)
        print(f"{n:>8} {wall:>9.2f} {row['bw']:>10.4g} {row['coupling']:>10.4g} {row['w2']:>10.4g}",
              flush=True)
    full = cv.ConvergenceResult(ns=ns, seeds=np.arange(args.seeds), ts=np.asarray(ts),
                                errors={k: np.stack(v) for k, v in errors.items()}, dim=args.d,
                                reference=res.reference)
    args.out.mkdir(parents=True, exist_ok=True)
    rate_rows = [r for t_i in range(len(ts)) for r in cv.rate_table(full, time_index=t_i)]
    print(f"\n{'metric':>9} {'t':>5} {'slope':>7} {'95% interval':>18}   (n^-1/2: -0.5, n^-1/d: "
          f"{-1 / max(args.d, 2):.3f})")
    for r in rate_rows:
        print(f"{r['metric']:>9} {r['t']:>5.2g} {r['slope']:>7.3f} [{r['slope_low']:>7.3f}, "
              f"{r['slope_high']:>7.3f}]")
    with open(args.out / "timings.csv", "w") as f:
        f.write("n,wall_s," + ",".join(cv.METRICS) + "\n")
        for r in rows:
            f.write(f"{r['n']},{r['wall_s']:.4f}," + ",".join(f"{r[k]:.6e}" for k in cv.METRICS) + "\n")
    with open(args.out / "rates.csv", "w") as f:
        f.write("metric,t,slope,low,high,monte_carlo,empirical_w2\n")
        for r in rate_rows:
            f.write(f"{r['metric']},{r['t']},{r['slope']:.4f},{r['slope_low']:.4f},"
                    f"{r['slope_high']:.4f},{r['monte_carlo']},{r['empirical_w2']:.4f}\n")
    with open(args.out / "results.json", "w") as f:
        json.dump({"device": str(jax.devices()[0]), "args": {k: str(v) for k, v in vars(args).items()},
                   "timings": rows, "rates": rate_rows}, f, indent=2)
    print(f"\nwrote {args.out}/timings.csv, rates.csv, results.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
