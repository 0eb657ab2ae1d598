"""Stationary branches on S¹ by Newton continuation (sphere.md §12): the bifurcation at K_#,
the branch slope, the fold for β > β_*, stability, a lost branch."""

import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.stationary import ContinuationError, branch_from_uniform
from transformer_pde.theory.noisy_sphere import NoisySA, NoisyUSA, critical_beta

MODES = 24


def usa(beta):
    return tp.Sphere(tp.UnnormalizedAttention.identity(2, beta))


def test_continuous_transition_usa():
    beta = 1.0
    th = NoisyUSA(beta=beta)
    assert beta < critical_beta(NoisyUSA, 2)
    b = branch_from_uniform(usa(beta), 1.0, modes=MODES, K_max=1.5 * th.critical_coupling())
    assert b.bifurcation == pytest.approx(th.critical_coupling(), rel=1e-10)
    assert b.folds == ()
    assert np.all(np.diff(b.K) > 0) and np.all(b.stable[1:])
    slope = (b.K[1] / b.bifurcation - 1) / b.order[1] ** 2
    assert slope == pytest.approx(th.landau(), rel=0.01)
    np.testing.assert_allclose(b.densities.mean(1), 1.0, atol=1e-12)


def test_discontinuous_transition_usa_has_a_fold_below_K_sharp():
    beta = 4.0
    th = NoisyUSA(beta=beta)
    assert beta > critical_beta(NoisyUSA, 2)
    b = branch_from_uniform(usa(beta), 1.0, modes=MODES, K_max=1.5 * th.critical_coupling())
    assert b.bifurcation == pytest.approx(th.critical_coupling(), rel=1e-10)
    assert len(b.folds) == 1 and b.folds[0] < th.critical_coupling()
    i = int(np.argmin(b.K))
    assert b.folds[0] == pytest.approx(b.K[i], rel=1e-3)
    # the part between K_# and the fold is unstable, the part beyond the fold stable
    assert not np.any(b.stable[1:i]) and np.all(b.stable[i + 2:])
    slope = (b.K[1] / b.bifurcation - 1) / b.order[1] ** 2
    assert slope == pytest.approx(th.landau(), rel=0.02)


@pytest.mark.slow
def test_sa_bifurcates_at_its_threshold():
    beta = 3.0
    th = NoisySA(beta=beta, sigma=0.8)
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(2, beta))
    b = branch_from_uniform(dyn, 0.8, modes=MODES, K_max=1.2 * th.critical_coupling(), max_points=6)
    assert b.bifurcation == pytest.approx(th.critical_coupling(), rel=1e-10)
    slope = (b.K[1] / b.bifurcation - 1) / b.order[1] ** 2
    assert slope == pytest.approx(th.landau(), rel=0.02)


def test_lost_branch_and_bad_input():
    with pytest.raises(ContinuationError, match="lost the branch"):
        branch_from_uniform(usa(1.0), 1.0, modes=MODES, K_max=2.0, tol=1e-300, ds_min=1e-2)
    J = np.array([[0.0, -1.0], [1.0, 0.0]])
    rot = tp.Sphere(tp.UnnormalizedAttention(np.eye(2), np.eye(2), np.eye(2) + 0.3 * J, 1.0))
    with pytest.raises(ValueError, match="rotation part"):
        branch_from_uniform(rot, 1.0, modes=MODES, K_max=2.0)
    with pytest.raises(ValueError, match="sigma"):
        branch_from_uniform(usa(1.0), 0.0, modes=MODES, K_max=2.0)


@pytest.mark.slow
def test_branch_states_are_stationary_under_the_time_stepper():
    beta = 1.0
    b = branch_from_uniform(usa(beta), 1.0, modes=MODES, K_max=1.3)
    j = len(b.K) // 2
    dyn = tp.Sphere(tp.UnnormalizedAttention(np.eye(2), np.eye(2), b.K[j] * np.eye(2), beta))
    sol = tp.solve(dyn, tp.CircleDensity(b.densities[j], 1.0), t1=5.0, saveat=jnp.array([5.0]))
    np.testing.assert_allclose(sol.xs[-1], b.densities[j], atol=1e-7)


@pytest.mark.package_errors
@pytest.mark.parametrize("kwargs, message", [
    (dict(ds=float("nan")), r"ds must be finite"),  # a NaN step halved forever before
    (dict(ds_min=0.0, tol=1e-300), r"ds_min must be > 0"),  # the step halved without bound
    (dict(tol=0.0), r"tol must be > 0"),  # reported as a lost branch before, tol unnamed
    (dict(ds_max=1e-9), r"ds_min <= ds <= ds_max.*ds_max=1e-09"),  # stopped at max_points silently
    (dict(ds=0.5), r"ds_min <= ds <= ds_max.*ds=0.5"),
    (dict(max_points=1), r"max_points must be >= 2"),
    (dict(order_max=0.0), r"order_max must lie in \(0, 1\]"),
    (dict(K_min=3.0), r"K_min must be < K_max"),
])
def test_continuation_controls_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        branch_from_uniform(usa(1.0), 1.0, **{"modes": MODES, "K_max": 2.0, **kwargs})


def test_lost_branch_names_the_tolerance():
    with pytest.raises(ContinuationError, match=r"tol = 1e-300"):
        branch_from_uniform(usa(1.0), 1.0, modes=MODES, K_max=2.0, tol=1e-300, ds_min=1e-2)


def test_a_branch_followed_until_the_density_is_near_zero_keeps_its_points():
    """SA at β = 4 to K_max = 30: the density of the last points is ~0 opposite the cluster, where
    the truncated cosine series dips below 0 by its truncation error (-5e-9; the resolution stop
    bounds it). The spectra are taken at these grid values; before, each point was made a
    tp.CircleDensity, whose positivity check refused -6.7e-12 after the whole continuation."""
    b = branch_from_uniform(tp.Sphere(tp.SoftmaxAttention.identity(2, 4.0)), 1.0, modes=MODES, K_max=30.0)
    assert b.stop == "resolution" and b.K[-1] > 8
    assert -1e-7 < b.densities.min() < 0
    assert np.all(np.isfinite(b.growth)) and np.all(b.stable[-5:])  # the clustered states beyond the fold
