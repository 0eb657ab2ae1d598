"""The fold K_c(β, d) of the noisy USA on S^{d−1} and the order parameter there (issue 40 item 4).

Zonal continuation (``tp.stationary.critical_coupling``, σ = 1, the K-scaled USA of Mun–Rosenzweig)
for d = 3, 4, 8 and β on a grid above β_*^{(d)}. Each entry is computed at degree L (the smallest of
48, 96, 192, 384 that reaches the fold) and again at 2L; the table states both differences. The
continuation may step up to ``ds_max = 1`` in (a_1..a_L, K) with up to 2000 points: the default
0.2 × 400 covers too short an arclength for d = 8, β >= 6 (|a| reaches ~20 on the way to the fold).

For d = 3 each β also gets the full S² route (``tp.SphereDensity``): at K_m = (K_c + K_#)/2 (or
K_c + f(K_# − K_c), f = 1/4 or 1/10, where the middle's clustered state needs an S² degree above 64) a
perturbed uniform start (1 + 0.1x₁ + 0.05x₁x₂, non-zonal) and the zonal upper state tilted off its
axis (ρ(1 + 0.1x₁)) are run to t₁ (long enough for the uniform law's slowest mode, rate 1 − K/K_#,
to decay by e^{−10}); their end states' ⟨cos ϑ⟩ = |∫xρ| are set against the zonal time-stepper's
stable state at K_m (from the branch's nearest stable upper point, the same t₁).

Writes a Markdown table (and JSON) to ``--out``; docs/math/fold_table.md holds its output.

    python benchmarks/fold_table.py [--out DIR] [--tiny] [--dims 3 4 8] [--betas ...] [--no-s2]

With ``--out`` each finished row is kept in DIR/rows/ and a rerun with the same DIR reuses it.
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
from transformer_pde.theory.noisy_sphere import NoisyUSA, critical_beta, critical_coupling  # noqa: E402

GRID = {3: (2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0), 4: (2.0, 2.5, 3.0, 4.0, 5.0, 6.0),
        8: (1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0)}
TINY = {3: (4.0,)}
CONTROLS = dict(ds_max=1.0, max_points=2000)
S2_DEGREES = (24, 32, 40, 48, 64)  # above 64 an S² run takes tens of minutes on this machine
S2_FRACTIONS = (0.5, 0.25, 0.1)  # K_m = K_c + f·(K_# − K_c): the middle, or nearer the fold (a less sharp cluster)
S2_T_MIN, S2_T_MAX = 60.0, 3000.0


def fold(d, beta, degree):
    # the branch is followed to 1.05 K_#: past the fold it only sharpens (the S² route needs K < K_#), and at
    # degree 192 the rest of it to the default 1.5 K_# costs more than the fold
    return tp.stationary.critical_coupling(tp.Sphere(tp.UnnormalizedAttention.identity(d, beta)), 1.0, degree=degree,
                                           K_max=1.05 * float(critical_coupling(beta, d)), **CONTROLS)


def usa(beta, K, d=3):
    return tp.Sphere(tp.UnnormalizedAttention(jnp.eye(d), jnp.eye(d), K * jnp.eye(d), beta))


def _s2_start(folds):
    """(branch, K_m, j, L): the first K_m = K_c + f·(K_# − K_c) (f in S2_FRACTIONS) and branch (degree L, 2L)
    with a stable upper point j at K >= K_m that an S² degree L <= S2_DEGREES[-1] resolves (|c_l0| < 1e-8
    beyond L; d = 3: the zonal a_l are the S² c_l0)."""
    for frac in S2_FRACTIONS:
        for f in folds:
            b, Km = f.branch, f.K_c + frac * (f.K_sharp - f.K_c)
            upper = np.flatnonzero(b.stable & (np.arange(len(b.K)) > np.argmin(b.K)))
            if not (len(upper) and b.K[upper[-1]] >= Km):
                continue  # the branch stopped (resolution) before K_m
            j = upper[np.searchsorted(b.K[upper], Km)]  # the first stable upper point with K >= K_m
            L = next((L for L in S2_DEGREES if np.abs(b.coeffs[j, L + 1:]).max(initial=0.0) < 1e-8), None)
            if L is not None:
                return b, Km, j, L
    raise tp.solvers.UnderResolvedError(
        f"no stable upper state at K_c + f(K_# − K_c), f in {S2_FRACTIONS}, is resolved by the zonal branches of "
        f"degree {[f.branch.degree for f in folds]} and an S² degree <= {S2_DEGREES[-1]}")


def s2_route(beta, *folds):
    """The full S² solver at K_m in (K_c, K_#) from a uniform and from a tilted clustered start; the
    zonal state from the first of ``folds`` (degree L, 2L) whose branch resolves one there."""
    sigma = 1.0
    b, Km, j, L = _s2_start(folds)
    f = folds[0]
    t1 = float(np.clip(10 / (1 - Km / f.K_sharp), S2_T_MIN, S2_T_MAX))  # l = 1 at the uniform law: rate 1 − K/K_#
    ts = jnp.array([0.8 * t1, t1])
    z = tp.ZonalDensity.from_coefficients(b.coeffs[j], 3, sigma)
    m_zonal = np.asarray(z.order_parameter(tp.solve(usa(beta, Km), z, t1=t1, saveat=ts).xs))
    rz = lambda x: np.asarray(z.values(x[..., 2].ravel())).reshape(x.shape[:-1])  # noqa: E731
    out = dict(K=Km, K_frac=(Km - f.K_c) / (f.K_sharp - f.K_c), degree=L, t1=t1, zonal=float(m_zonal[-1]),
               zonal_bracket=(float(b.order[j - 1]), float(b.order[j])))
    t0 = time.perf_counter()
    for name, fn in (("uniform", lambda x: 1 + 0.1 * x[..., 0] + 0.05 * x[..., 0] * x[..., 1]),
                     ("clustered", lambda x: rz(x) * (1 + 0.1 * x[..., 0]))):
        st = tp.SphereDensity(fn, sigma, degree=L)
        sol = tp.solve(usa(beta, Km), st, t1=t1, saveat=ts)
        m = np.asarray(st.order_parameter(sol.xs))
        c = np.asarray(sol.xs[-1])
        out[name], out[name + "_before"] = float(m[-1]), float(m[0])  # at t₁ and 0.8 t₁
        out[name + "_tail"] = float(np.abs(c[:, L - 1:]).max())  # |c_lm|, l >= L − 1: the truncation
        out[name + "_nonzonal"] = float(np.abs(c[:, :, 1:]).max())  # m != 0: the start was not zonal
    out["seconds"] = time.perf_counter() - t0
    return out


def entry(d, beta, degrees=(48, 96, 192, 384), s2=True):
    for L in degrees:
        try:
            f = fold(d, beta, L)
        except tp.solvers.UnderResolvedError:
            continue
        f2 = fold(d, beta, 2 * L)
        row = dict(d=d, beta=beta, K_sharp=f.K_sharp, K_sharp_closed=float(critical_coupling(beta, d)), K_c=f.K_c,
                   order=f.order, width=f.width, ratio=f.K_c / f.K_sharp, degree=L, dK=abs(f.K_c - f2.K_c),
                   dorder=abs(f.order - f2.order))
        if d == 3 and s2:
            try:
                row["s2"] = s2_route(beta, f, f2)
            except tp.solvers.UnderResolvedError as e:
                row["s2_skipped"] = str(e)
        return row
    raise tp.solvers.UnderResolvedError(f"d = {d}, beta = {beta}: no degree up to {degrees[-1]} reaches the fold")


def markdown(rows, stars):
    out = ["| d | β | K_# | K_c | K_c/K_# | K_# − K_c | ⟨cos ϑ⟩ at K_c | L | \\|K_c(L) − K_c(2L)\\| | "
           "\\|⟨cos ϑ⟩(L) − ⟨cos ϑ⟩(2L)\\| | S² at K_m (below): ⟨cos ϑ⟩ from uniform / clustered (zonal) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s2 = r.get("s2")
        s2 = f"{s2['uniform']:.1e} / {s2['clustered']:.6f} ({s2['zonal']:.6f})" if s2 else (
            "not run (S² degree > 64)" if "s2_skipped" in r else "—")
        out.append(f"| {r['d']} | {r['beta']:g} | {r['K_sharp']:.8f} | {r['K_c']:.8f} | {r['ratio']:.6f} | "
                   f"{r['width']:.3e} | {r['order']:.6f} | {r['degree']} | {r['dK']:.1e} | {r['dorder']:.1e} | {s2} |")
    out.append("")
    out.append("β_*^{(d)}: " + ", ".join(f"d = {d}: {b:.6f}" for d, b in stars.items()))
    s2 = [r for r in rows if r.get("s2")]
    if s2:
        out += ["", "The S² route (d = 3): `tp.SphereDensity` at degree L_S², run to t₁ at K_m = K_c + f(K_# − K_c) "
                "(f = 1/2, or 1/4, 1/10 where the middle needs an S² degree above 64); "
                "⟨cos ϑ⟩ at 0.8 t₁ → t₁ (the uniform start decays); drift: \\|⟨cos ϑ⟩(t₁) − ⟨cos ϑ⟩(0.8 t₁)\\|; "
                "tail: max \\|c_lm\\| over l >= L_S² − 1 at t₁; zonal: the zonal "
                "time-stepper's state at t₁ from the branch's nearest stable upper point (the branch's ⟨cos ϑ⟩ at its "
                "neighbours in brackets).", "",
                "| β | K_m (f) | L_S² | t₁ | uniform start: ⟨cos ϑ⟩ at 0.8 t₁ → t₁ | clustered start: ⟨cos ϑ⟩(t₁), "
                "drift, tail, max \\|c_lm\\| (m ≠ 0) | zonal ⟨cos ϑ⟩ [bracket] | \\|S² − zonal\\| | s |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in s2:
            q = r["s2"]
            lo, hi = q["zonal_bracket"]
            out.append(f"| {r['beta']:g} | {q['K']:.6f} ({q.get('K_frac', 0.5):.2g}) | {q['degree']} | "
                       f"{q['t1']:.0f} | {q['uniform_before']:.1e} → "
                       f"{q['uniform']:.1e} | {q['clustered']:.8f}, {abs(q['clustered'] - q['clustered_before']):.0e}, "
                       f"{q['clustered_tail']:.0e}, {q['clustered_nonzonal']:.2f} | {q['zonal']:.8f} [{lo:.5f}, "
                       f"{hi:.5f}] | {abs(q['clustered'] - q['zonal']):.1e} | {q['seconds']:.0f} |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tiny", action="store_true", help="d = 3, beta = 4 only")
    p.add_argument("--dims", type=int, nargs="+", default=None, help="only these d of the grid")
    p.add_argument("--betas", type=float, nargs="+", default=None, help="only these beta of the grid")
    p.add_argument("--no-s2", action="store_true", help="skip the S² route (d = 3)")
    a = p.parse_args(argv)
    grid = TINY if a.tiny else GRID
    grid = {d: tuple(b for b in bs if a.betas is None or b in a.betas) for d, bs in grid.items()
            if a.dims is None or d in a.dims}
    stars = {d: critical_beta(NoisyUSA, d) for d in grid}
    rows, t0 = [], time.perf_counter()
    for d, betas in grid.items():
        for beta in betas:
            assert beta > stars[d], (d, beta)
            done = a.out / "rows" / f"{d}_{beta:g}.json" if a.out else None
            if done is not None and done.exists() and not a.no_s2:  # a row of an interrupted run
                rows.append(json.loads(done.read_text()))
                continue
            rows.append(entry(d, beta, s2=not a.no_s2))
            print(rows[-1], f"{time.perf_counter() - t0:.0f} s", flush=True)
            if done is not None and not a.no_s2:
                done.parent.mkdir(parents=True, exist_ok=True)
                done.write_text(json.dumps(rows[-1]))
    md = markdown(rows, stars)
    print(md)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "fold_table.md").write_text(md + "\n")
        (a.out / "fold_table.json").write_text(json.dumps({"rows": rows, "beta_star": stars}, indent=1))


if __name__ == "__main__":
    main()
