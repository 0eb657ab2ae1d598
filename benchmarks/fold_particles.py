"""Noisy particles on S² against the zonal fold K_c (issue 40 item 4, the particle route).

USA on S² (d = 3), β = 4, σ = 1, V = K·I: n particles swept in K up then down over
r·K_#^{(3)} (``noisy-transition``'s ``particle_sweeps``: each K starts from the previous K's final
state, Euler–Maruyama with the sphere's retraction, |(1/n)Σ X_i| averaged over the second half of
each K's run and over seeds). The step error is removed by Richardson extrapolation in dt
(Euler–Maruyama is weak order 1: m ≈ 2 m(dt/2) − m(dt)); the error bar is 2 standard errors over
seeds of the extrapolated value. The zonal continuation gives the stable branch ⟨cos ϑ⟩(K) and
K_c = 0.7916 K_#: the down sweep must stay on the branch for K > K_c and fall to the uniform law's
O(n^{−1/2}) below it.

    python benchmarks/fold_particles.py [--n 2000] [--seeds 4] [--run-time 20] [--dt 0.02] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import transformer_pde as tp  # noqa: E402
from transformer_pde.experiments import get  # noqa: E402
from transformer_pde.experiments import noisy_transition as nt  # noqa: E402

RATIOS = (0.70, 0.74, 0.77, 0.80, 0.83, 0.87, 0.92, 0.97, 1.02, 1.10, 1.20)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--run-time", type=float, default=20.0)
    p.add_argument("--dt", type=float, default=0.02)
    p.add_argument("--beta", type=float, default=4.0)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    d, beta = 3, a.beta
    f = tp.stationary.critical_coupling(tp.Sphere(tp.UnnormalizedAttention.identity(d, beta)), 1.0, degree=96,
                                        K_max=1.3 * float(tp.theory.noisy_sphere.critical_coupling(beta, d)))
    b = f.branch
    r = np.array(RATIOS)
    path = np.concatenate([r, r[::-1]])
    Ks = f.K_sharp * path
    base = get("noisy-transition").make_config(n=a.n, seeds=a.seeds, run_time=a.run_time, dt=a.dt, dims=(3,))
    ms, t0 = {}, time.perf_counter()
    for dt in (a.dt, a.dt / 2):
        cfg = dataclasses.replace(base, dt=dt)
        ms[dt] = nt.particle_sweeps(cfg, d, (beta,), Ks[None], jax.random.key(7))[0]  # (seeds, P)
        print(f"dt = {dt}: {time.perf_counter() - t0:.0f} s", flush=True)
    rich = 2 * ms[a.dt / 2] - ms[a.dt]  # per seed: the same keys are not shared across dt, seeds independent
    mean, err = rich.mean(0), 2 * rich.std(0, ddof=1) / np.sqrt(a.seeds)
    # the PDE: the stable clustered branch at each K (interpolated along its stable part) and the uniform law
    st = b.stable & (b.order > f.order - 1e-12)
    order_pde = np.interp(Ks, b.K[st], b.order[st], left=np.nan, right=np.nan)
    rows = []
    P = len(r)
    for j, (K, x) in enumerate(zip(Ks, path)):
        rows.append(dict(way="up" if j < P else "down", K_ratio=float(x), K=float(K), m_dt=float(ms[a.dt][:, j].mean()),
                         m_dt2=float(ms[a.dt / 2][:, j].mean()), m_richardson=float(mean[j]), err=float(err[j]),
                         branch=float(order_pde[j])))
    lines = [f"n = {a.n}, {a.seeds} seeds, run {a.run_time} per K, dt = {a.dt} and {a.dt / 2}; zonal K_c = {f.K_c:.6f} "
             f"= {f.K_c / f.K_sharp:.4f} K_#, K_# = {f.K_sharp:.6f}, <cos> at K_c = {f.order:.5f}", "",
             "| sweep | K/K_# | m(dt) | m(dt/2) | Richardson 2m(dt/2) − m(dt) ± 2 SE | PDE stable branch ⟨cos ϑ⟩ |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        br = f"{row['branch']:.4f}" if np.isfinite(row["branch"]) else "—"
        lines.append(f"| {row['way']} | {row['K_ratio']:.2f} | {row['m_dt']:.4f} | {row['m_dt2']:.4f} | "
                     f"{row['m_richardson']:.4f} ± {row['err']:.4f} | {br} |")
    md = "\n".join(lines)
    print(md)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "fold_particles.md").write_text(md + "\n")
        (a.out / "fold_particles.json").write_text(json.dumps({"rows": rows, "K_c": f.K_c, "K_sharp": f.K_sharp,
                                                               "args": {k: str(v) for k, v in vars(a).items()}},
                                                              indent=1))


if __name__ == "__main__":
    main()
