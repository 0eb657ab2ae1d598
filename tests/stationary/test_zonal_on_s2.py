"""Zonal stationary states on S² (d = 3) against the full S² solver (issue 40: "its stationary states
match the zonal solver"; the hysteresis of item 4 on S²).

The lift: for d = 3 the zonal basis is φ_l = √(2l+1) P_l(u) and SphereDensity's Y_l0 = p_l^0(u) with
∫(p_l^0)² du/2 = 1, i.e. also √(2l+1) P_l(u) (sphere_harmonics.py; no phase for m = 0), both with the
axis e = e_3 (u = x_3). So the zonal coefficients a_l are the S² coefficients c_l0, and c_lm = 0 for m ≠ 0.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.stationary import critical_coupling, zonal_branch

BETA, SIGMA = 4.0, 1.0


def lift(a, degree=None):
    """S² coefficients (L+1, L+1) of the zonal density with Legendre coefficients a (d = 3)."""
    L = len(a) - 1 if degree is None else degree
    c = np.zeros((L + 1, L + 1), complex)
    c[:, 0] = np.asarray(a)[: L + 1]
    return c


def usa(K):
    return tp.Sphere(tp.UnnormalizedAttention(jnp.eye(3), jnp.eye(3), K * jnp.eye(3), BETA))


def test_lift_convention_and_branch_state_is_stationary_on_s2():
    # the lift maps values to values (an independent check of the convention) ...
    z = tp.ZonalDensity(lambda u: np.exp(1.3 * u + 0.4 * u**2), 3, SIGMA, degree=10)
    s = tp.SphereDensity(lift(z.coeffs), SIGMA)
    np.testing.assert_allclose(np.asarray(s.grid_values(s.y[None], s))[0],
                               np.asarray(z.values(s.points[..., 2].ravel())).reshape(s.points.shape[:-1]),
                               atol=1e-12)
    # ... and a branch state (Newton to 1e-11 on the zonal Galerkin operator) is stationary for the S² one:
    # its S² right-hand side is the zonal one in the m = 0 column (both Galerkin, exact quadrature) and 0 elsewhere
    b = zonal_branch(tp.Sphere(tp.UnnormalizedAttention.identity(3, BETA)), SIGMA, degree=10, max_points=2, ds=0.15)
    a, K = b.coeffs[-1], b.K[-1]
    assert b.order[-1] > 0.05  # a clustered state, not the uniform law
    st = tp.SphereDensity(lift(a), SIGMA).prepare(usa(K))
    rhs = np.asarray(st.vector_field(usa(K), 0.0, st.y))
    zonal_rhs = np.asarray(tp.ZonalDensity.from_coefficients(a, 3, SIGMA).vector_field(usa(K), 0.0, jnp.asarray(a)))
    np.testing.assert_allclose(rhs[0, :, 0], zonal_rhs, atol=1e-12)
    assert np.max(np.abs(rhs[:, :, 1:])) < 1e-13 and np.max(np.abs(rhs[1])) < 1e-13
    lam = np.arange(1, 11) * np.arange(2, 12)
    assert np.max(np.abs(rhs[0, 1:, 0]) / lam) < 1e-9


@pytest.mark.slow
def test_branch_state_stays_put_under_solve_density_on_s2():
    b = zonal_branch(tp.Sphere(tp.UnnormalizedAttention.identity(3, BETA)), SIGMA, degree=16, max_points=6)
    a, K = b.coeffs[-1], b.K[-1]
    st = tp.SphereDensity(lift(a), SIGMA)
    sol = tp.solve_density(usa(K), st, t1=2.0, saveat=jnp.array([1.0, 2.0]))
    assert sol.resolved
    drift = np.max(np.abs(np.asarray(sol.solution.xs) - np.asarray(st.y)[None]))
    assert drift < 1e-9, drift
    np.testing.assert_allclose(np.asarray(sol.order_parameter), b.order[-1], atol=1e-10)


@pytest.mark.slow
def test_hysteresis_on_s2_at_the_middle_of_the_bistable_range():
    # at K = (K_c + K_#)/2 the full S² solver (non-zonal perturbations) from a perturbed uniform start
    # returns to the uniform law, from a perturbed clustered start to a cluster whose <cos theta> is the
    # zonal branch's stable upper state (the zonal time-stepper's limit, inside the branch's bracket)
    f = critical_coupling(tp.Sphere(tp.UnnormalizedAttention.identity(3, BETA)), SIGMA, degree=48)
    b, Km, L = f.branch, (f.K_c + f.K_sharp) / 2, 40
    upper = np.where(b.stable & (np.arange(len(b.K)) > np.argmin(b.K)))[0]
    j = upper[np.searchsorted(b.K[upper], Km)]  # the first stable upper point with K >= Km
    assert b.K[j - 1] <= Km <= b.K[j] and b.stable[j - 1]
    z = tp.ZonalDensity.from_coefficients(b.coeffs[j], 3, SIGMA)
    rz = lambda x: np.asarray(z.values(x[..., 2].ravel())).reshape(x.shape[:-1])  # noqa: E731
    ts = jnp.array([40.0, 60.0])
    ends = {}
    for name, fn in (("uniform", lambda x: 1 + 0.1 * x[..., 0] + 0.05 * x[..., 0] * x[..., 1]),
                     ("clustered", lambda x: rz(x) * (1 + 0.1 * x[..., 0]))):
        st = tp.SphereDensity(fn, SIGMA, degree=L)
        sol = tp.solve(usa(Km), st, t1=60.0, saveat=ts)
        ends[name] = np.asarray(st.order_parameter(sol.xs))
        assert name == "uniform" or np.max(np.abs(np.asarray(sol.xs[-1, :, :, 1:]))) > 1e-3  # tilted: not zonal
    assert ends["uniform"][-1] < 1e-4 and ends["uniform"][-1] < ends["uniform"][0]
    zs = tp.solve(usa(Km), z, t1=60.0, saveat=ts)
    m_zonal = float(z.order_parameter(zs.xs)[-1])
    assert b.order[j - 1] < m_zonal < b.order[j]
    np.testing.assert_allclose(ends["clustered"], m_zonal, atol=1e-6)


def s2_spectra(st, dynamics, chunk=128):
    """The eigenvalues of the S² solver's Jacobian (forward-mode, on the coefficients) at ``st``, by
    azimuthal order m (rotations about the axis commute with it): {m: eigenvalues, decreasing real part},
    on the real coordinates Re c_lm (l >= max(m, 1)) and Im c_lm (m >= 1) of real mean-zero perturbations."""
    F = lambda y: st.vector_field(dynamics, 0.0, y)  # noqa: E731
    n = st.y.size
    jvp = jax.jit(jax.vmap(lambda v: jax.jvp(F, (st.y,), (v.reshape(st.y.shape),))[1].reshape(-1)))
    eye = np.eye(n)
    cols = np.concatenate([np.asarray(jvp(jnp.asarray(np.pad(eye[k:k + chunk], ((0, max(0, k + chunk - n)), (0, 0))))))
                           for k in range(0, n, chunk)])[:n]  # cols[j] = J e_j
    L, out = st.degree, {}
    for m in range(L + 1):
        ls = np.arange(max(m, 1), L + 1)
        idx = [np.ravel_multi_index((p, l, m), st.y.shape) for p in ((0, 1) if m else (0,)) for l in ls]
        out[m] = np.sort_complex(np.linalg.eigvals(cols[np.ix_(idx, idx)].T))[::-1]
    return out


@pytest.mark.slow
def test_upper_branch_state_has_no_unstable_s2_mode_but_the_rotations():
    # the full S² linear spectrum (all m) of the stable clustered state at K just above (K_c + K_#)/2:
    # m = 0 is the zonal spectrum (tp.stationary.zonal_spectrum, another code path); m = 1 holds the two
    # rotation zero modes (tilting the axis), everything else decays
    f = critical_coupling(tp.Sphere(tp.UnnormalizedAttention.identity(3, BETA)), SIGMA, degree=48)
    b, Km, L = f.branch, (f.K_c + f.K_sharp) / 2, 40
    upper = np.where(b.stable & (np.arange(len(b.K)) > np.argmin(b.K)))[0]
    j = upper[np.searchsorted(b.K[upper], Km)]
    assert abs(b.coeffs[j, L]) < 2e-8  # the S² truncation at degree 40
    st = tp.SphereDensity(lift(b.coeffs[j], L), SIGMA).prepare(usa(b.K[j]))
    spec = s2_spectra(st, usa(b.K[j]))
    zonal = tp.stationary.zonal_spectrum(tp.Sphere(tp.UnnormalizedAttention.identity(3, BETA)),
                                         tp.ZonalDensity.from_coefficients(b.coeffs[j], 3, SIGMA), b.K[j])
    np.testing.assert_allclose(spec[0][:4].real, np.asarray(zonal)[:4].real, rtol=1e-6, atol=1e-8)
    assert np.all(np.abs(spec[1][:2]) < 1e-6) and spec[1][2].real < -0.5  # measured < 1e-10
    assert max(spec[m][0].real for m in range(2, L + 1)) < -0.5 and spec[0][0].real < -0.1


def test_published_s2_route_agrees_with_the_zonal_states():
    # docs/math/fold_table.md (benchmarks/fold_table.py): for every d = 3 row the full S² solver at a
    # K_m in (K_c, K_#) ends in two states: from the perturbed uniform start ⟨cos ϑ⟩ decays towards 0, from the
    # tilted (non-zonal) clustered start it ends on the zonal time-stepper's stable state (another solver), which
    # lies between the continuation's neighbouring branch points
    from pathlib import Path

    lines = (Path(__file__).parents[2] / "docs" / "math" / "fold_table.md").read_text().splitlines()
    main = [c for c in ([c.strip() for c in r.strip("|").split("|")] for r in lines if r.startswith("| 3 | "))
            if len(c) == 11]
    start = next(i for i, r in enumerate(lines) if r.startswith("| β | K_m (f) | L_S² |"))
    route = [[c.strip() for c in r.strip("|").split("|")] for r in lines[start + 2:] if r.startswith("| ")]
    route = route[: next((i for i, c in enumerate(route) if not c[0][0].isdigit()), len(route))]
    assert [c[0] for c in route] == [c[1] for c in main] and len(route) >= 5
    for r in route:
        K, frac = float(r[1].split()[0]), float(r[1].split("(")[1].rstrip(")"))
        row = next(c for c in main if c[1] == r[0])
        assert float(row[3]) < K < float(row[2]) and K == pytest.approx(
            float(row[3]) + frac * (float(row[2]) - float(row[3])), abs=1e-6), r
        before, after = (float(v) for v in r[4].split("→"))
        clustered, nonzonal = float(r[5].split(",")[0]), float(r[5].split(",")[3])
        zonal, bracket = float(r[6].split("[")[0]), [float(v) for v in r[6].split("[")[1].strip("]").split(",")]
        assert after < min(before, 1e-3), r
        assert nonzonal > 1e-3 and bracket[0] < zonal < bracket[1], r
        assert abs(clustered - zonal) < 1e-8 and float(r[7]) < 1e-8, r
