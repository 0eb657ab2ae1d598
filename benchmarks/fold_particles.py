"""Noisy particles on S² against the zonal fold K_c (issue 40 item 4, the particle route).

USA on S² (d = 3), β = 4 by default, σ = 1, V = K·I: n particles swept in K up then down over
r·K_#^{(3)} (each K starts from the previous K's final state; |(1/n)Σ X_i| averaged over the
second half of each K's run and over seeds). The attention's sums are the fast kernel
(``tp.kernels.Fast``: the NUFFT Gaussian sum on the score space R³, planned to ``--tol`` of the
total mass) or, with ``--exact``, the exact one. Euler–Maruyama with the sphere's retraction is of
weak order 1, so the step error of a stationary average is removed by Richardson extrapolation in
dt: m ≈ 2 m(dt/2) − m(dt) (the error bar: 2 standard errors of the extrapolated value over seeds
and over 5 consecutive blocks of each K's second half, which treats the blocks as independent: an
underestimate where the dynamics is slow, near K_c and K_#; the two runs use independent noise, so
it carries both runs' sampling errors). The zonal
continuation gives the stable branch ⟨cos ϑ⟩(K) and K_c: the down sweep must stay on the branch
for K > K_c and fall to the uniform law's O(n^{−1/2}) below it, the up sweep must stay uniform to
about K_# (below it the uniform law is stable: n·E m² = 1/(1 − K/K_#)).

    python benchmarks/fold_particles.py [--n 10000] [--seeds 2] [--run-time 20] [--dt 0.04] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import transformer_pde as tp  # noqa: E402

RATIOS = (0.70, 0.74, 0.77, 0.80, 0.83, 0.87, 0.92, 0.97, 1.02, 1.10, 1.20)


BLOCKS = 5


def steps_per_K(run_time, dt):
    """Euler–Maruyama steps of one K's run (at least 4); its second half holds steps // 2 + 1 saves."""
    return max(4, round(run_time / dt))


def sweep(n, beta, Ks, dt, run_time, seeds, key, backend):
    """|(1/n)Σ X_i| along the K path ``Ks`` ``(P,)``: ``(seeds, P, BLOCKS)``, the means of BLOCKS
    consecutive blocks of each K's second half (their spread gives the sampling error of one seed)."""
    d = 3
    steps = steps_per_K(run_time, dt)
    h = run_time / steps
    ts = jnp.asarray(h * np.arange(steps - steps // 2, steps + 1))  # the second half, on the step grid
    noise = tp.Noise(1.0, path=tp.BrownianIncrements())
    eye = jnp.eye(d)
    # the order parameter on the second half, the states at t1 only (n = 10⁵: no (T, n, 3) array kept)
    save = diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts, fn=lambda t, x, args: jnp.linalg.norm(jnp.mean(x, axis=0))),
                                diffrax.SubSaveAt(t1=True)])

    def one(k, x0):
        def at_K(x, Kk):
            K, kk = Kk
            dyn = tp.Sphere(tp.UnnormalizedAttention(eye, eye, K * eye, beta, backend=backend))
            sol = tp.solve(dyn, x, t1=run_time, dt0=h, saveat=save, solver=diffrax.Euler(), noise=noise, key=kk,
                           event=None)
            m, final = sol.stats
            b = m.shape[0] // BLOCKS
            return final[-1], jnp.mean(m[m.shape[0] - b * BLOCKS:].reshape(BLOCKS, b), axis=1)
        return jax.lax.scan(at_K, x0, (jnp.asarray(Ks), jax.random.split(k, len(Ks))))[1]

    k0, k1 = jax.random.split(key)
    x0 = tp.uniform_sphere(k0, n * seeds, d).reshape(seeds, n, d)
    return np.asarray(jax.jit(jax.vmap(one))(jax.random.split(k1, seeds), x0))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--run-time", type=float, default=20.0)
    p.add_argument("--dt", type=float, default=0.04)
    p.add_argument("--beta", type=float, default=4.0)
    p.add_argument("--ratios", type=float, nargs="+", default=RATIOS, help="K/K_# of the up sweep (down: reversed)")
    p.add_argument("--path", type=float, nargs="+", default=None,
                   help="K/K_# in the order run, instead of --ratios up then down (e.g. 1.5 1.5 0.88 0.8 0.72: "
                        "cluster from the uniform start, then the down sweep alone)")
    p.add_argument("--tol", type=float, default=1e-6, help="the fast kernel's planned error")
    p.add_argument("--exact", action="store_true", help="the exact kernel instead of the fast one")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    d, beta = 3, a.beta
    if steps_per_K(a.run_time, a.dt) // 2 + 1 < BLOCKS:  # the smaller dt has twice the saves
        p.error(f"--run-time {a.run_time:g} / --dt {a.dt:g} leaves fewer than {BLOCKS} saves in the second half of "
                f"a K's run (the {BLOCKS} blocks of the error bar): lengthen the run or shorten the step")
    f = tp.stationary.critical_coupling(tp.Sphere(tp.UnnormalizedAttention.identity(d, beta)), 1.0, degree=96,
                                        K_max=1.6 * float(tp.theory.noisy_sphere.critical_coupling(beta, d)))
    b = f.branch
    r = np.array(a.ratios)
    path = np.concatenate([r, r[::-1]]) if a.path is None else np.array(a.path)
    Ks = f.K_sharp * path
    # the window (beta, beta): the attention is built inside the jitted sweep, where beta is traced
    backend = tp.kernels.Exact() if a.exact else tp.kernels.Fast(tol=a.tol, beta=(beta, beta))
    ms, seconds = {}, {}
    for dt in (a.dt, a.dt / 2):
        t = time.perf_counter()
        ms[dt] = sweep(a.n, beta, Ks, dt, a.run_time, a.seeds, jax.random.key(7 if dt == a.dt else 8), backend)
        seconds[dt] = time.perf_counter() - t
        print(f"dt = {dt}: {seconds[dt]:.0f} s", flush=True)
    # per seed and block; the two runs' noises are independent, so the spread holds both sampling errors
    rich = (2 * ms[a.dt / 2] - ms[a.dt]).transpose(1, 0, 2).reshape(len(path), -1)  # (P, seeds·BLOCKS)
    mean, err = rich.mean(1), 2 * rich.std(1, ddof=1) / np.sqrt(rich.shape[1])
    # the PDE: the stable clustered branch at each K (interpolated along its stable part beyond the fold)
    st = b.stable & (np.arange(len(b.K)) > np.argmin(b.K))
    order_pde = np.interp(Ks, b.K[st], b.order[st], left=np.nan, right=np.nan)
    rows = []
    for j, (K, x) in enumerate(zip(Ks, path)):
        # the start and each step up are the up sweep; a step down or a repeat (the turn) the down sweep
        way = "up" if j == 0 or x > path[j - 1] else "down"
        rows.append(dict(way=way, K_ratio=float(x), K=float(K), m_dt=float(ms[a.dt][:, j].mean()),
                         m_dt2=float(ms[a.dt / 2][:, j].mean()), m_richardson=float(mean[j]), err=float(err[j]),
                         branch=float(order_pde[j])))
    kernel = "exact kernel" if a.exact else f"fast kernel (NUFFT, tol {a.tol:g})"
    lines = [f"n = {a.n}, {a.seeds} seeds, β = {beta:g}, run {a.run_time:g} per K, dt = {a.dt:g} and {a.dt / 2:g}, "
             f"{kernel}; zonal K_c = {f.K_c:.6f} = {f.K_c / f.K_sharp:.4f} K_#, K_# = {f.K_sharp:.6f}, ⟨cos ϑ⟩ at "
             f"K_c = {f.order:.5f}; {sum(seconds.values()):.0f} s on {platform.machine()} "
             f"({jax.devices()[0].platform}, {jax.device_count()} device)", "",
             f"| sweep | K/K_# | m(dt) | m(dt/2) | Richardson 2m(dt/2) − m(dt) ± 2 SE "
             f"({a.seeds} seeds × {BLOCKS} blocks) | PDE stable branch ⟨cos ϑ⟩ |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        br = f"{row['branch']:.4f}" if np.isfinite(row["branch"]) else "—"
        lines.append(f"| {row['way']} | {row['K_ratio']:g} | {row['m_dt']:.4f} | {row['m_dt2']:.4f} | "
                     f"{row['m_richardson']:.4f} ± {row['err']:.4f} | {br} |")
    md = "\n".join(lines)
    print(md)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "fold_particles.md").write_text(md + "\n")
        (a.out / "fold_particles.json").write_text(json.dumps({
            "rows": rows, "K_c": f.K_c, "K_sharp": f.K_sharp, "seconds": seconds and {str(k): v for k, v in
                                                                                     seconds.items()},
            "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))


if __name__ == "__main__":
    main()
