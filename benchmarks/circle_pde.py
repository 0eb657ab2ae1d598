"""The S¹ Fokker–Planck PDE with 1024 Fourier modes to t = 100 in float64 (issue 21: target < 10 s).

Noisy USA (sphere.md §12) at β = 2, σ = 1, K = 1.2 K_#, from a perturbed uniform law: the density
leaves the uniform law and settles on the clustered stationary state. Default solver of
``tp.CircleDensity`` (IMEX KenCarp4, the diffusion solved exactly, PID rtol 1e-8). Reports the
compile time and the median of the run time over ``--repeats`` runs (compiled program reused).

    python benchmarks/circle_pde.py [--modes 1024] [--t1 100] [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import transformer_pde as tp  # noqa: E402
from transformer_pde.theory.noisy_sphere import NoisyUSA  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", type=int, default=1024)
    p.add_argument("--t1", type=float, default=100.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    beta, sigma = 2.0, 1.0
    K = 1.2 * NoisyUSA(beta=beta, sigma=sigma).critical_coupling()
    eye = jnp.eye(2)
    dyn = tp.Sphere(tp.UnnormalizedAttention(eye, eye, K * eye, beta))
    rho0 = tp.CircleDensity(lambda th: 1 + 0.05 * np.cos(th) + 0.02 * np.sin(3 * th), sigma, modes=a.modes)
    ts = jnp.linspace(0.0, a.t1, 11)

    def run():
        t0 = time.perf_counter()
        sol = tp.solve(dyn, rho0, t1=a.t1, saveat=ts)
        jax.block_until_ready(sol.xs)
        return time.perf_counter() - t0, sol

    first, sol = run()
    times = [run()[0] for _ in range(a.repeats)]
    order = np.asarray(tp.solvers.circle.order_parameter(sol.xs))
    out = {"modes": a.modes, "grid": 2 * a.modes, "t1": a.t1, "first_call_s": first,
           "median_s": float(np.median(times)), "runs_s": times, "steps": int(sol.num_steps),
           "order_parameter": order.tolist(), "mass_error": float(jnp.max(jnp.abs(sol.xs.mean(-1) - 1))),
           "min_density": float(sol.xs.min()), "devices": str(jax.devices())}
    print(json.dumps(out, indent=1))
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "circle_pde.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
