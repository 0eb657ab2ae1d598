"""Propagation of chaos on S² against the spectral PDE (issue 40 item 5): ‖μ^n_t − ρ_t‖_{H^{−2}} vs n.

Tokens start i.i.d. from the smooth law ρ0 ∝ exp(a·x₃ + b·x₁) (against the uniform probability)
and move by noiseless SA (``tp.Sphere(tp.SoftmaxAttention.identity(3, β))``, Tsit5, dt 0.05:
its step error is far below the sampling error); the reference ρ_t is ``tp.SphereDensity`` at
degree ``--degree``, checked by ``tp.solve_density`` (spatial + time-step error reported). The
distance is the H^{−2} norm from the Y_lm coefficients ((1/n)Σ conj Y_lm(x_i) for the tokens,
``sphere_harmonics.negative_sobolev``), truncated at the PDE's degree; the left-out tail,
(1/n)Σ_{l>L}(2l+1)(1 + l(l+1))^{−2}, is reported relative to the mean square. For each time the
slope of log distance against log n is fitted with a bootstrap interval over the seeds
(``tp.statistics.fit_rate``); the prediction is −1/2.

    python benchmarks/sphere_chaos.py [--log2-n-min 8] [--log2-n-max 12] [--seeds 16] [--beta 1]
                                      [--degree 28] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import diffrax
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import transformer_pde as tp  # noqa: E402
from transformer_pde.solvers import sphere_harmonics as sh  # noqa: E402

A, B = 1.0, 0.5  # ρ0 ∝ exp(A x₃ + B x₁)


def rho0(x):
    return np.exp(A * x[..., 2] + B * x[..., 0])


def sample(rng, n):
    """n i.i.d. points of ρ0 by rejection from the uniform law (acceptance ρ0 / max ρ0)."""
    top = np.exp(np.hypot(A, B))
    out = []
    while sum(len(o) for o in out) < n:
        x = rng.normal(size=(2 * n, 3))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out.append(x[rng.random(2 * n) < rho0(x) / top])
    return np.concatenate(out)[:n]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2-n-min", type=int, default=8)
    p.add_argument("--log2-n-max", type=int, default=12)
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--degree", type=int, default=28)
    p.add_argument("--s", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    ts = np.array([0.5, 1.0])
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, a.beta))
    t0 = time.perf_counter()
    ref = tp.solve_density(dyn, tp.SphereDensity(rho0, 0.0, degree=a.degree), t1=float(ts[-1]), saveat=ts, tol=1e-8,
                           stepsize_controller=diffrax.PIDController(rtol=1e-11, atol=1e-13), throw=False)
    pde_s = time.perf_counter() - t0
    ref_c = jax.lax.complex(ref.solution.xs[:, 0], ref.solution.xs[:, 1])  # (T, L+1, L+1)
    ns = 2 ** np.arange(a.log2_n_min, a.log2_n_max + 1)
    dist = np.zeros((len(ts), len(ns), a.seeds))
    t0 = time.perf_counter()
    for i, n in enumerate(ns):
        for k in range(a.seeds):
            x0 = jnp.asarray(sample(np.random.default_rng([int(n), k]), int(n)))
            xs = tp.solve(dyn, x0, t1=float(ts[-1]), dt0=0.05, saveat=jnp.asarray(ts)).xs
            for j in range(len(ts)):
                c = sh.empirical_coefficients(xs[j], a.degree)
                dist[j, i, k] = float(sh.negative_sobolev(c, ref_c[j], a.s))
    particle_s = time.perf_counter() - t0
    ls = np.arange(a.degree + 1, 20 * a.degree)
    tail = np.sum((2 * ls + 1) * (1 + ls * (ls + 1.0)) ** -a.s)
    rows = []
    for j, t in enumerate(ts):
        fit = tp.statistics.fit_rate(ns, dist[j], level=0.95, num_bootstrap=4000)
        rows.append({"t": float(t), "slope": fit.slope, "slope_ci95": list(fit.slope_ci),
                     "covers_-1/2": bool(fit.slope_ci[0] <= -0.5 <= fit.slope_ci[1]),
                     "mean_distance": dist[j].mean(1).tolist(),
                     "tail_over_mean_square": (tail / ns / np.mean(dist[j] ** 2, 1)).tolist()})
    out = {"ns": ns.tolist(), "seeds": a.seeds, "beta": a.beta, "degree": a.degree, "s": a.s, "times": rows,
           "pde_resolved_to_1e-8": ref.resolved, "pde_resolution_error": ref.resolution_error,
           "pde_spatial_error": ref.spatial_error,
           "pde_time_error": ref.time_error, "pde_mass_error": ref.mass_error, "pde_s": pde_s,
           "particles_s": particle_s, "devices": str(jax.devices())}
    print(json.dumps(out, indent=1))
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "sphere_chaos.json").write_text(json.dumps(out, indent=1))
        np.save(a.out / "distances.npy", dist)


if __name__ == "__main__":
    main()
