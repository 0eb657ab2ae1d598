"""The velocity a user gets with no option set (issue 24, item 1).

    python benchmarks/default_velocity.py                 # n = 10^6 on S², float64, 3 calls
    python benchmarks/default_velocity.py --n 4096 --repeats 2 --sample 20   # seconds

``tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0)).velocity(x)`` with x uniform on S²: the wall
time of the first call (it compiles) and of the next ones, the kernel the automatic choice took
at this n and at n = 256, and the largest error over ``--sample`` rows against plain NumPy rows
(Γ(x_i) = P_{x_i} Σ_j softmax_j(β⟨x_i, x_j⟩) x_j). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import transformer_pde as tp  # noqa: E402


def numpy_rows(x: np.ndarray, rows: np.ndarray, beta: float) -> np.ndarray:
    out = []
    for i in rows:
        s = beta * (x @ x[i])
        a = np.exp(s - s.max())
        v = (a[:, None] * x).sum(0) / a.sum()
        out.append(v - (v @ x[i]) * x[i])
    return np.asarray(out)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10**6)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3, help="calls after the first (compiling) one")
    p.add_argument("--sample", type=int, default=300, help="rows checked against NumPy")
    args = p.parse_args(argv)

    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, args.beta))
    x = tp.uniform_sphere(jax.random.key(0), args.n, 3)
    times = []
    for _ in range(1 + args.repeats):
        t = time.perf_counter()
        v = dyn.velocity(x).block_until_ready()
        times.append(time.perf_counter() - t)
    rows = np.random.default_rng(0).choice(args.n, size=min(args.sample, args.n), replace=False)
    err = float(np.abs(np.asarray(v)[rows] - numpy_rows(np.asarray(x), rows, args.beta)).max())
    report = {
        "n": args.n, "beta": args.beta, "dtype": str(x.dtype),
        "fast_kernel": bool(dyn.dynamics.kernel_choice(args.n, args.n, x.dtype).fast),
        "fast_kernel_at_256": bool(dyn.dynamics.kernel_choice(256, 256, x.dtype).fast),
        "first_call_s": times[0], "later_calls_s": times[1:],
        "median_later_s": float(np.median(times[1:])) if times[1:] else None,
        "max_error_vs_numpy": err, "rows_checked": int(rows.size),
    }
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
