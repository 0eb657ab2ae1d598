"""The H^{−s} distance of benchmarks/sphere_chaos.py (issue 40 item 5) on what can go wrong there: the
tokens' coefficients and the PDE's in one convention (an exact quadrature measure is the density),
and the expected square for i.i.d. tokens of a non-uniform law against its closed form."""

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp
from transformer_pde.solvers import sphere_harmonics as sh
from transformer_pde.theory.noisy_sphere import funk_hecke


def test_quadrature_measure_is_the_density():
    # Σ_j w_j ρ(x_j) δ_{x_j} on the 3/2 grid of degree L (Gauss weights) has the same coefficients up
    # to L as tp.SphereDensity(ρ, degree=L), every m (ρ not zonal): distance at round-off, while the
    # same measure with the longitudes turned by one grid cell is far
    L = 8
    f = lambda x: np.exp(0.7 * x[..., 0] - 0.4 * x[..., 1] + 0.9 * x[..., 2])  # noqa: E731
    rho = tp.SphereDensity(f, degree=L).coefficients  # (2, L+1, L+1): Re, Im
    rho = jax.lax.complex(rho[0], rho[1])
    nlat, nlon = sh.grid_shape(L)
    pts = sh.grid_points(nlat, nlon)
    u, gw = np.polynomial.legendre.leggauss(nlat)
    w = (gw[:, None] / 2 / nlon) * f(pts)
    w = (w / w.sum()).reshape(-1)
    c = sh.empirical_coefficients(jnp.asarray(pts.reshape(-1, 3)), L, jnp.asarray(w))
    assert float(sh.negative_sobolev(c, rho, 2.0)) < 1e-14
    turned = sh.empirical_coefficients(jnp.asarray(np.roll(pts, 1, axis=1).reshape(-1, 3)), L, jnp.asarray(w))
    assert float(sh.negative_sobolev(turned, rho, 2.0)) > 1e-3


def test_expected_square_of_a_sample_of_a_non_uniform_law():
    # X_i i.i.d. with density ∝ e^{κ⟨x, e₃⟩}: E‖μ^n − ρ‖²_{H^{−s}} = (1/n) Σ_{1<=l<=L} (1 + l(l+1))^{−s}
    # [(2l+1) − Σ_m |ρ̂_lm|²] (Σ_m |Y_lm|² = 2l+1), with ρ̂_l0 = sqrt(2l+1) c_l(κ)/c_0(κ) by Funk–Hecke;
    # R samples of n tokens by exact inversion in u = cos ϑ; the mean within 4 standard errors, and
    # the uniform law's (1/n)Σ(2l+1)(1 + l(l+1))^{−s} (a missed ρ̂ term) rejected
    L, s, kappa, n, R = 6, 2.0, 2.0, 40, 2000
    l = np.arange(1, L + 1)
    rho_l0 = np.sqrt(2 * l + 1) * funk_hecke(l, kappa, 3) / funk_hecke(0, kappa, 3)
    weight = (1 + l * (l + 1.0)) ** -s
    closed = np.sum(weight * ((2 * l + 1) - rho_l0**2)) / n
    uniform = np.sum(weight * (2 * l + 1)) / n
    ref = np.zeros((L + 1, L + 1), complex)
    ref[0, 0], ref[1:, 0] = 1.0, rho_l0
    k1, k2 = jax.random.split(jax.random.key(0))
    U = jax.random.uniform(k1, (R, n))
    uu = 1 + jnp.log1p(-U * (1 - np.exp(-2 * kappa))) / kappa
    phi = 2 * np.pi * jax.random.uniform(k2, (R, n))
    r = jnp.sqrt(jnp.clip(1 - uu**2, 0.0))
    x = jnp.stack([r * jnp.cos(phi), r * jnp.sin(phi), uu], -1)
    d2 = np.asarray(jax.vmap(lambda p: sh.negative_sobolev(sh.empirical_coefficients(p, L), ref, s))(x)) ** 2
    se = d2.std() / np.sqrt(R)
    assert abs(d2.mean() - closed) < 4 * se, (d2.mean(), closed, se)
    assert abs(d2.mean() - uniform) > 8 * se, (d2.mean(), uniform, se)


def test_paired_slope_is_the_difference_of_the_slopes_and_pairs_the_seeds():
    # benchmarks/sphere_chaos.py's paired rows: the slope is exactly fit_rate's slope at t minus its slope
    # at t = 0 (both fitted to mean logs), and with every seed's d_t = 2 d_0 n^{−0.1} (the seeds vary,
    # the ratio does not) the paired interval is the point −0.1, where the two slopes' own intervals are wide
    chaos = _chaos_script()
    ns = 2 ** np.arange(5, 9)
    rng = np.random.default_rng(0)
    dist0 = ns[None, :, None] ** -0.5 * np.exp(rng.normal(0.0, 0.3, size=(1, 4, 16)))
    dist = np.stack([2 * dist0[0] * ns[:, None] ** -0.1, dist0[0] * np.exp(rng.normal(0.0, 0.3, size=(4, 16)))])
    rows = chaos.paired_rows(ns, dist, dist0, [0.5, 1.0])
    for j, row in enumerate(rows):
        want = tp.statistics.fit_rate(ns, dist[j]).slope - tp.statistics.fit_rate(ns, dist0[0]).slope
        assert abs(row["slope_minus_t0"] - want) < 1e-12
    assert np.allclose(rows[0]["ci95"], [-0.1, -0.1], atol=1e-12) and not rows[0]["covers_0"]
    lo, hi = tp.statistics.fit_rate(ns, dist0[0]).slope_ci
    assert hi - lo > 0.05


def _chaos_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "sphere_chaos.py"
    spec = importlib.util.spec_from_file_location("sphere_chaos", path)
    chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    return chaos


def test_kept_n_refit_and_refused_under_other_flags(tmp_path):
    # benchmarks/sphere_chaos.py keeps each finished n in OUT/per_n; --fit-from refits them without
    # rerunning: its slope is fit_rate's on the same distances, its paired shift the planted −0.1 of
    # d_t = 2 d_0 n^{−0.1}, its mean log ratio ln 2 − 0.1 ln n; a kept n of other flags is refused
    import argparse
    import json

    import pytest

    chaos = _chaos_script()
    a = argparse.Namespace(out=tmp_path, seeds=16, beta=1.0, sigma=0.5, degree=6, s=2.0, dt=0.125, dt_noise=0.05,
                           times="1", log2_fast=10, log2_pad=9, fast_tol=1e-10, seed_batch=0)
    ns = 2 ** np.arange(5, 9)
    rng = np.random.default_rng(0)
    dist0 = ns[:, None] ** -0.5 * np.exp(rng.normal(0.0, 0.3, size=(4, 16)))
    dist = 2 * dist0 * ns[:, None] ** -0.1
    (tmp_path / "per_n").mkdir()
    for i, n in enumerate(ns):
        (tmp_path / "per_n" / f"sa_n{n}.json").write_text(json.dumps(
            {"flags": chaos._flags(a, "sa", n), "dist": dist[i][None].tolist(), "dist0": dist0[i].tolist()}))
    chaos.fit_from(a, np.array([1.0]), ns, 0.0, ["sa"], tmp_path)
    row = json.loads((tmp_path / "fit_n32-256.json").read_text())["cases"]["sa"]
    assert abs(row["times"][0]["slope"] - tp.statistics.fit_rate(ns, dist).slope) < 1e-12
    assert np.allclose(row["minus_t0"][0]["ci95"], [-0.1, -0.1], atol=1e-12)
    assert np.allclose(row["mean_log_ratio"][0], np.log(2) - 0.1 * np.log(ns), atol=1e-12)
    a.degree = 7
    with pytest.raises(ValueError, match="sa_n32.json was run with"):
        chaos.fit_from(a, np.array([1.0]), ns, 0.0, ["sa"], tmp_path)


def test_seed_batches_give_the_all_at_once_rows():
    # sphere_chaos.batched: 5 seeds 2 at a time (the last batch short) give the rows of one call
    chaos = _chaos_script()
    x, w = jnp.arange(5 * 4 * 3.0).reshape(5, 4, 3), jnp.arange(5 * 4.0).reshape(5, 4)
    solve = lambda x, w: x * w[..., None] + x.sum(1, keepdims=True)  # noqa: E731
    assert np.array_equal(chaos.batched(solve, 2, x, w), solve(x, w))
    assert np.array_equal(chaos.batched(solve, 0, x, w), solve(x, w))
