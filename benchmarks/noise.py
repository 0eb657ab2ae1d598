"""The cost of a noisy step against a deterministic one (issue 21 item 1: target <= 1.3x).

    python benchmarks/noise.py --out benchmarks/results/noise            # n = 10^5, d = 3
    python benchmarks/noise.py --tiny --out /tmp/bench_noise             # smoke, seconds
    python benchmarks/noise.py --n 20000 --steps 8 --out /tmp/noise_20k

Tokens uniform on S² (d = 3), ``tp.Sphere(SoftmaxAttention.identity(3, β))`` with the fast kernel
(``tp.kernels.Fast(tol)``, the n = 10^5 path; ``--exact`` uses the exact kernel instead), float64,
Euler with constant steps over ``--steps`` steps. Every case is compiled, then the cases are timed
in turns, ``--repeats`` rounds of one call each; a ratio is the median over rounds of a case's
time over the deterministic (for Heun: the deterministic Heun) call of the same round, so load
that moves between rounds (a shared machine) cancels:

* ``deterministic``: ``tp.solve(dyn, x0, t1=steps·h, dt0=h, solver=diffrax.Euler())``;
* ``noisy``: the same with ``noise=tp.Noise(σ), key=key``: the default path of a constant-step
  run, ``tp.BrownianGrid()`` (one normal draw per token and step, keyed by the step's index);
* ``noisy_tree``: ``tp.Noise(σ, path=tp.BrownianTree())`` (a ``VirtualBrownianTree`` over the
  run, tolerance h/2, the default before: ~2(log₂(T/tol) + 2) draws per step);
* ``noisy_increments``: ``tp.Noise(σ, path=tp.BrownianIncrements())`` (one draw per step keyed
  by the step's times, ``diffrax.UnsafeBrownianPath``);
* ``heun`` and ``noisy_heun``: Heun (two field evaluations per step) without and with noise
  (default path), the fast kernel planned for unit tokens (``tp.Sphere`` evaluates its attention
  at the retracted stages).

The ratio noisy/deterministic is the cost of the noise per step (one increment per token and
step, the projection P⊥_x, the path). Writes ``results.json`` to ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402

import transformer_pde as tp  # noqa: E402
from transformer_pde.kernels import Fast  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, float]:
    """(compile + first call seconds, median seconds of ``repeats`` further calls)."""
    t = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return first, float(np.median(times))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dt", type=float, default=0.05)
    ap.add_argument("--beta", type=float, default=4.0)
    ap.add_argument("--sigma", type=float, default=0.5)
    ap.add_argument("--tol", type=float, default=1e-8, help="the fast kernel's tolerance")
    ap.add_argument("--exact", action="store_true", help="the exact kernel instead of the fast one")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="n = 2000, 4 steps (smoke)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.tiny:
        args.n, args.steps, args.repeats = 2000, 4, 2

    backend = None if args.exact else Fast(tol=args.tol)
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, args.beta, backend=backend))
    x0 = tp.uniform_sphere(jax.random.key(0), args.n, 3)
    key = jax.random.key(1)
    t1 = args.steps * args.dt
    kw = dict(t1=t1, dt0=args.dt, event=None)
    noise = tp.Noise(args.sigma)
    cases = {
        "deterministic": lambda: tp.solve(dyn, x0, solver=diffrax.Euler(), **kw).xs,
        "noisy": lambda: tp.solve(dyn, x0, solver=diffrax.Euler(), noise=noise, key=key, **kw).xs,
        "noisy_tree": lambda: tp.solve(dyn, x0, solver=diffrax.Euler(), key=key, **kw,
                                       noise=tp.Noise(args.sigma, path=tp.BrownianTree())).xs,
        "noisy_increments": lambda: tp.solve(dyn, x0, solver=diffrax.Euler(), key=key, **kw,
                                             noise=tp.Noise(args.sigma, path=tp.BrownianIncrements())).xs,
        "heun": lambda: tp.solve(dyn, x0, solver=diffrax.Heun(), **kw).xs,
        "noisy_heun": lambda: tp.solve(dyn, x0, solver=diffrax.Heun(), noise=noise, key=key, **kw).xs,
    }
    # compile every case, then time them in turns (one call each per round): on a shared machine
    # the load moves between rounds, so each case is divided by the deterministic call of its round
    first = {}
    for name, fn in cases.items():
        t = time.perf_counter()
        jax.block_until_ready(fn())
        first[name] = time.perf_counter() - t
    times = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            t = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t)
    rows = {}
    for name in cases:
        median = float(np.median(times[name]))
        ref = "heun" if "heun" in name else "deterministic"
        paired = float(np.median(np.asarray(times[name]) / np.asarray(times[ref])))
        rows[name] = dict(first_call_s=first[name], median_s=median, per_step_s=median / args.steps,
                          times_s=times[name], paired_ratio=paired)
        print(f"{name:>16}: {median / args.steps * 1e3:9.2f} ms/step (median of {args.repeats}; first call "
              f"{first[name]:.1f} s); / {ref} in the same round: {paired:.3f}", flush=True)
    ratio, ratio_tree, ratio_inc, ratio_heun = (rows[c]["paired_ratio"] for c in (
        "noisy", "noisy_tree", "noisy_increments", "noisy_heun"))
    print(f"noisy / deterministic (Euler): {ratio:.3f} default (BrownianGrid), {ratio_tree:.3f} "
          f"BrownianTree, {ratio_inc:.3f} BrownianIncrements; Heun {ratio_heun:.3f}  (target <= 1.3)")
    result = dict(
        n=args.n, d=3, steps=args.steps, dt=args.dt, beta=args.beta, sigma=args.sigma,
        kernel="exact" if args.exact else f"Fast(tol={args.tol})", dtype="float64", rows=rows,
        ratio_noisy_over_deterministic=ratio, ratio_tree_over_deterministic=ratio_tree,
        ratio_increments_over_deterministic=ratio_inc, ratio_noisy_heun_over_heun=ratio_heun,
        machine=dict(platform=platform.platform(), cpus=os.cpu_count(), jax=jax.__version__,
                     device=str(jax.devices()[0]), load_average=os.getloadavg()),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
