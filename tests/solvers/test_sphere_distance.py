"""The H^{−s} distance of benchmarks/sphere_chaos.py (issue 40 item 5) on what can go wrong there: the
tokens' coefficients and the PDE's in one convention (an exact quadrature measure is the density),
and the expected square for i.i.d. tokens of a non-uniform law against its closed form."""

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
    chaos = _chaos_script()
    a = argparse.Namespace(out=tmp_path, first_seed=0, seeds=16, beta=1.0, sigma=0.5, degree=6, s=2.0, dt=0.125,
                           dt_noise=0.05, times="1", log2_fast=10, log2_pad=9, fast_tol=1e-10, seed_batch=0)
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
    # --figure-from draws that fit; FILE@T leaves out the times above T (a reference not resolved there)
    fit = tmp_path / "fit_n32-256.json"
    (name, drawn_ns, rows), = chaos.figure_panels([str(fit)])
    assert name == "sa" and np.array_equal(drawn_ns, ns) and [r["t"] for r in rows["times"]] == [1.0]
    assert chaos.figure_panels([f"{fit}@0.5"])[0][2]["times"] == []
    chaos.figure([str(fit)], tmp_path / "fit.png")
    assert (tmp_path / "fit.png").read_bytes().startswith(b"\x89PNG")
    a.degree = 7
    with pytest.raises(ValueError, match="sa_n32.json was run with"):
        chaos.fit_from(a, np.array([1.0]), ns, 0.0, ["sa"], tmp_path)


def test_one_particle_count_is_refused_before_any_run():
    # a fit needs two n: --log2-n-min 8 --log2-n-max 8 is refused at once, not after the run of that n
    chaos = _chaos_script()
    with pytest.raises(ValueError, match=r"two particle counts \(got 8 \.\. 8\)"):
        chaos.main(["--log2-n-min", "8", "--log2-n-max", "8", "--cases", "sa"])


def test_seed_batches_give_the_all_at_once_rows():
    # sphere_chaos.batched: 5 seeds 2 at a time (the last batch short) give the rows of one call
    chaos = _chaos_script()
    x, w = jnp.arange(5 * 4 * 3.0).reshape(5, 4, 3), jnp.arange(5 * 4.0).reshape(5, 4)
    solve = lambda x, w: x * w[..., None] + x.sum(1, keepdims=True)  # noqa: E731
    assert np.array_equal(chaos.batched(solve, 2, x, w), solve(x, w))
    assert np.array_equal(chaos.batched(solve, 0, x, w), solve(x, w))


def _tiny_flags(**changes):
    # sphere_chaos's flags at a tiny size: n = 16 (padded to 16), degree 4, one save at t = 0.5, two steps
    flags = dict(out=None, first_seed=0, seeds=4, beta=1.0, sigma=0.5, degree=4, s=2.0, dt=0.25, dt_noise=0.25,
                 times="0.5", log2_fast=10, log2_pad=4, fast_tol=1e-10, seed_batch=0)
    return argparse.Namespace(**{**flags, **changes})


def _one_n_of_seed_ranges(chaos, sigma, seed_batch):
    # seeds 0..3 in one run and seeds 2, 3 in a --first-seed 2 run: (the 4-seed run's rows, the 2-seed run's)
    ref = chaos.rho0_coefficients(4)[None]  # any fixed reference: the rows are compared with each other
    exact = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0, backend=tp.kernels.Exact()))
    ts = np.array([0.5])
    with jax.numpy_rank_promotion("allow"):  # the script broadcasts (T, L+1, L+1) against (S, T, L+1, L+1)
        return [chaos.one_n(_tiny_flags(seed_batch=seed_batch, **r), ts, 16, sigma, exact, None, ref, ref, False, False)
                for r in (dict(seeds=4), dict(first_seed=2, seeds=2))]


def test_a_seed_range_draws_the_seeds_of_a_run_from_seed_0():
    # seed k's starts and Brownian key are the same in every run holding it (--first-seed F --seeds S), and
    # the keys of seeds 0..S-1 are the split(key(n), S) that the committed runs used (the noisy results keep
    # their numbers); with the default partitionable threefry, split(key, A)[:B] is split(key, B)
    chaos = _chaos_script()
    key = jax.random.key(16)
    for big, small in [(4, 2), (64, 16), (17, 16)]:
        assert np.array_equal(jax.random.key_data(jax.random.split(key, big)[:small]),
                              jax.random.key_data(jax.random.split(key, small)))
    keys = jax.random.key_data(chaos.seed_keys(16, range(4)))
    assert np.array_equal(keys, jax.random.key_data(jax.random.split(key, 4)))
    assert np.array_equal(jax.random.key_data(chaos.seed_keys(16, range(2, 4))), keys[2:])
    x4, w4 = chaos.starts(16, range(4), 32)
    x2, w2 = chaos.starts(16, range(2, 4), 32)
    assert np.array_equal(x2, x4[2:]) and np.array_equal(w2, w4[2:]) and not np.array_equal(x4[0], x4[2])


@pytest.mark.parametrize("sigma", [0.0, pytest.param(0.5, marks=pytest.mark.slow)])
def test_a_seed_range_reproduces_a_run_bit_for_bit(sigma):
    # --first-seed 2 --seeds 2 gives seeds 2, 3 of a --seeds 4 run: the same distances at t = 0.5 and 0, bit
    # for bit, noiseless and noisy (Euler–Maruyama at h and h/2, Richardson; slow: two more compilations)
    chaos = _chaos_script()
    four, two = _one_n_of_seed_ranges(chaos, sigma, seed_batch=0)
    for row in ("dist", "plain", "dist0"):
        assert np.array_equal(np.asarray(two[row]), np.asarray(four[row])[..., 2:]), row
    assert not np.array_equal(np.asarray(four["dist"])[..., :2], np.asarray(four["dist"])[..., 2:])


@pytest.mark.slow
def test_a_seed_range_reproduces_the_committed_noisy_run():
    # seeds 14, 15 of benchmarks/results/sphere_chaos_large/usa-noisy at n = 256 (16 seeds in one call, degree
    # 28, σ = 0.5), rerun as --first-seed 14 --seeds 2 under the kept file's own flags: bit for bit (2 seeds
    # are padded to 8 rows; unpadded they differed from the 16-seed call by 1e-17)
    from pathlib import Path

    chaos = _chaos_script()
    kept = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "sphere_chaos_large"
                       / "usa-noisy" / "per_n" / "usa-noisy_n256.json").read_text())
    flags = {k: v for k, v in kept["flags"].items() if k not in ("case", "n")}
    a = argparse.Namespace(**{**flags, "first_seed": 14, "seeds": 2, "seed_batch": 0, "out": None})
    ts = np.array([float(t) for t in a.times.split(",")])
    attention = tp.UnnormalizedAttention
    with jax.numpy_rank_promotion("allow"):
        _, ref_c = chaos.references(attention, a.sigma, a, ts)
        exact = tp.Sphere(attention.identity(3, a.beta, backend=tp.kernels.Exact()))
        got = chaos.one_n(a, ts, 256, a.sigma, exact, None, ref_c, chaos.rho0_coefficients(a.degree)[None],
                          False, False)
    for row in ("dist", "plain", "dist0"):
        assert np.array_equal(np.asarray(got[row]), np.asarray(kept[row])[..., 14:16]), row


def test_padded_calls_have_a_multiple_of_8_rows():
    # sphere_chaos.padded: 2, 5 or 12 rows are solved as 8, 8, 16 (the last row repeated) and cut back; 16
    # rows and a single row go as they are; the rows that come back are the call's own
    chaos = _chaos_script()
    seen = []

    def solve(x, w):
        seen.append(x.shape[0])
        return x * w[:, None] + 1.0

    for rows, call in [(2, 8), (5, 8), (12, 16), (16, 16), (1, 1)]:
        x, w = jnp.arange(rows * 3.0).reshape(rows, 3), jnp.arange(1.0, rows + 1)
        assert np.array_equal(chaos.padded(solve, x, w), x * w[:, None] + 1.0) and seen[-1] == call


def _keep(chaos, run, a, n, dist, dist0, name="sa"):
    # one kept n as one_n writes it (the rows fit_from reads)
    path = chaos._kept_path(run, name, n, a)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"flags": chaos._flags(a, name, n), "dist": dist.tolist(), "dist0": dist0.tolist()}))
    return path


def test_fit_from_pools_seed_ranges_into_the_fit_of_one_run(tmp_path):
    # seeds 0, 1 kept by one run and 2, 3 by a --first-seed 2 run fit exactly as the 4 seeds kept by one run
    # (the bootstrap's generator has a fixed seed): every number of the fit equal; the pooled fit is named by
    # its seeds and lists its files; --seeds 2 alone refits the first run under its old name
    chaos = _chaos_script()
    ns = 2 ** np.arange(4, 7)
    rng = np.random.default_rng(1)
    dist0 = ns[:, None] ** -0.5 * np.exp(rng.normal(0.0, 0.3, size=(3, 4)))
    dist = np.stack([dist0 * np.exp(rng.normal(0.1, 0.1, size=(3, 4))) for _ in range(2)])  # (T, N, S)
    ts = np.array([0.5, 1.0])
    one, pooled = tmp_path / "one", tmp_path / "pooled"
    for i, n in enumerate(ns):
        _keep(chaos, one, _tiny_flags(times="0.5,1"), n, dist[:, i], dist0[i])
        for first in (0, 2):
            a = _tiny_flags(times="0.5,1", first_seed=first, seeds=2)
            _keep(chaos, pooled, a, n, dist[:, i, first:first + 2], dist0[i, first:first + 2])
    assert (pooled / "per_n" / "sa_n16_seeds2-3.json").exists() and (pooled / "per_n" / "sa_n16.json").exists()
    chaos.fit_from(_tiny_flags(times="0.5,1"), ts, ns, 1e-3, ["sa"], one)
    chaos.fit_from(_tiny_flags(times="0.5,1"), ts, ns, 1e-3, ["sa"], pooled)
    want = json.loads((one / "fit_n16-64.json").read_text())
    got = json.loads((pooled / "fit_n16-64_seeds0-3.json").read_text())
    assert got["cases"]["sa"].pop("files") == [[f"sa_n{n}.json", f"sa_n{n}_seeds2-3.json"] for n in ns]
    assert want["cases"]["sa"].pop("files") == [[f"sa_n{n}.json"] for n in ns]
    assert got == want and got["cases"]["sa"]["seeds_per_n"] == [4, 4, 4]
    assert want["cases"]["sa"]["times"][0]["slope"] == tp.statistics.fit_rate(ns, dist[0]).slope
    chaos.fit_from(_tiny_flags(times="0.5,1", seeds=2), ts, ns, 1e-3, ["sa"], pooled)
    first = json.loads((pooled / "fit_n16-64.json").read_text())["cases"]["sa"]
    assert first["times"][0]["slope"] == tp.statistics.fit_rate(ns, dist[0, :, :2]).slope


def test_fit_from_refuses_seed_ranges_that_overlap_leave_gaps_or_differ(tmp_path):
    chaos = _chaos_script()
    ns, ts = np.array([16, 32]), np.array([0.5])
    d = np.full((1, 2), 0.1)

    def keep(run, n, **flags):
        return _keep(chaos, tmp_path / run, _tiny_flags(**{"seeds": 2, **flags}), n, d, d[0])

    for n in ns:  # seeds 0, 1 and 1, 2 (overlap); 0, 1 and 4, 5 (gap at 2, 3)
        keep("overlap", n), keep("overlap", n, first_seed=1), keep("gap", n), keep("gap", n, first_seed=4)
    keep("other", 16), keep("other", 32), keep("other", 16, first_seed=2), keep("other", 32, first_seed=2, dt=0.5)
    overlap = r"sa_n16.json \(seeds 0..1\) and .*sa_n16_seeds1-2.json \(seeds 1..2\) overlap"
    with pytest.raises(ValueError, match=overlap):
        chaos.fit_from(_tiny_flags(seeds=3), ts, ns, 0.0, ["sa"], tmp_path / "overlap")
    with pytest.raises(ValueError, match="seeds 2..3 of sa n=16 are kept in no file"):
        chaos.fit_from(_tiny_flags(seeds=6), ts, ns, 0.0, ["sa"], tmp_path / "gap")
    with pytest.raises(ValueError, match="seeds 2..2 of sa n=16 are kept in no file"):
        chaos.fit_from(_tiny_flags(seeds=3), ts, ns, 0.0, ["sa"], tmp_path / "gap")
    with pytest.raises(ValueError, match=r"sa_n16.json holds seeds 0..1, across an end of the fit's seeds 1..2"):
        chaos.fit_from(_tiny_flags(first_seed=1, seeds=2), ts, ns, 0.0, ["sa"], tmp_path / "gap")
    with pytest.raises(ValueError, match="sa_n32_seeds2-3.json was run with"):  # dt differs at n = 32
        chaos.fit_from(_tiny_flags(seeds=4), ts, ns, 0.0, ["sa"], tmp_path / "other")
    chaos.fit_from(_tiny_flags(seeds=2), ts, ns, 0.0, ["sa"], tmp_path / "gap")  # seeds 0, 1 alone: kept whole
    chaos.fit_from(_tiny_flags(first_seed=4, seeds=2), ts, ns, 0.0, ["sa"], tmp_path / "gap")  # the added seeds alone
    assert (tmp_path / "gap" / "fit_n16-32.json").exists() and (tmp_path / "gap" / "fit_n16-32_seeds4-5.json").exists()


def test_a_kept_n_from_before_seed_ranges_holds_seeds_from_0(tmp_path):
    # a per-n file written before --first-seed existed (no first_seed in its flags) resumes and refits as
    # seeds 0..S-1, under its old name; a --first-seed run keeps its n's beside it, named by their seeds
    chaos = _chaos_script()
    a = _tiny_flags(seeds=2)
    old = chaos._flags(a, "sa", 16)
    del old["first_seed"]
    path = chaos._kept_path(tmp_path, "sa", 16, a)
    path.parent.mkdir()
    path.write_text(json.dumps({"flags": old, "dist": [[0.1, 0.2]], "dist0": [0.1, 0.1]}))
    assert path.name == "sa_n16.json" and chaos._read_kept(path, a, "sa", 16)["dist"] == [[0.1, 0.2]]
    assert [p.name for _, p, _ in chaos._pooled_seeds(tmp_path, a, "sa", 16)] == ["sa_n16.json"]
    assert chaos._kept_path(tmp_path, "sa", 16, _tiny_flags(first_seed=2, seeds=14)).name == "sa_n16_seeds2-15.json"
    with pytest.raises(ValueError, match="sa_n16.json was run with"):
        chaos._read_kept(path, _tiny_flags(first_seed=2, seeds=2), "sa", 16)
