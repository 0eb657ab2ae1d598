"""Spectral selection in symmetric attention (docs: math/sphere.md#spectral-selection): the closed-form
stability of pure modes against the autodiff Jacobian of the particle field, and particles against
the criteria."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.theory import spectral_selection as ss


def _rotation(d, seed):
    R, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return R


def _tangent_jacobian_growth(V, beta, x):
    """The largest real part of the eigenvalues of the sphere field's Jacobian on the tangent spaces."""
    n, d = x.shape
    sphere = tp.Sphere(ss.symmetric_attention(V, beta))
    # jit: one compile instead of op-by-op (15 s to 3 s here)
    J = np.asarray(jax.jit(jax.jacfwd(lambda y: sphere.velocity(y.reshape(n, d)).ravel()))(jnp.asarray(x).ravel()))
    T = np.zeros((n * d, n * (d - 1)))
    for i in range(n):
        basis = np.linalg.svd(np.eye(d) - np.outer(x[i], x[i]))[0][:, : d - 1]  # orthonormal ⊥ x_i
        T[i * d:(i + 1) * d, i * (d - 1):(i + 1) * (d - 1)] = basis
    return np.linalg.eigvals(T.T @ J @ T).real.max()


@pytest.mark.parametrize("ev,k,plus,minus,beta", [
    pytest.param((1.0, 0.4, -0.7), 0, 5, 0, 1.3, marks=pytest.mark.slow),  # homogeneous, dominant: stable
    pytest.param((1.0, 0.4, -0.7), 1, 4, 0, 1.3, marks=pytest.mark.slow),  # along a smaller eigenvalue
    pytest.param((-1.0, -0.3, -0.6), 0, 3, 3, 2.0, marks=pytest.mark.slow),  # balanced split, V < 0
    pytest.param((-1.0, 0.5, -0.6), 0, 3, 3, 0.4, marks=pytest.mark.slow),  # 0.5 above tanh(β): unstable
    ((-1.0, 0.5, -0.6), 0, 3, 3, 2.0),       # below it: stable
    pytest.param((1.0, 0.4, -0.7), 0, 2, 2, 1.3, marks=pytest.mark.slow),  # split along the dominant one
    pytest.param((-0.8, -0.3, 0.2, -0.5), 0, 1, 4, 1.1, marks=pytest.mark.slow),  # unbalanced split
])
def test_pure_mode_growth_matches_the_jacobian_of_the_particle_field(ev, k, plus, minus, beta):
    d = len(ev)
    R = _rotation(d, plus + 7 * minus)
    V = R @ np.diag(ev) @ R.T
    V = (V + V.T) / 2
    x = np.array([R[:, k]] * plus + [-R[:, k]] * minus)
    np.testing.assert_allclose(ss.pure_mode_growth(ev, k, plus, minus, beta),
                               _tangent_jacobian_growth(V, beta, x), atol=1e-10)


def test_closed_form_predicates_agree_with_the_growth_rate():
    rng = np.random.default_rng(0)
    for _ in range(60):
        ev = rng.normal(size=3)
        beta = rng.uniform(0.1, 3.0)
        for k in range(3):
            assert ss.homogeneous_mode_stable(ev, k) == (ss.pure_mode_growth(ev, k, 6, 0, beta) < 0)
            assert ss.balanced_split_stable(ev, k, beta) == (ss.pure_mode_growth(ev, k, 3, 3, beta) < 0)


def _solve(V, beta, x0, t1):
    return tp.solve(tp.Sphere(ss.symmetric_attention(V, beta)), x0, t1=t1, dt0=0.05,
                    saveat=diffrax.SaveAt(t1=True),
                    stepsize_controller=diffrax.PIDController(rtol=1e-7, atol=1e-9)).xs[-1]


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.3, 1.5])
def test_the_balanced_split_holds_exactly_when_the_criterion_says(beta):
    # V = diag(1/2, −1) on the circle: the split along e_2 is stable iff 1/2 < tanh(β)
    ev = np.array([0.5, -1.0])
    stable = ss.balanced_split_stable(ev, 1, beta)
    assert stable == (beta > np.arctanh(0.5))
    # both groups pushed the same way along e_1 (the mode that grows when 1/2 > tanh(β))
    offsets = np.array([1.0, 2.0, 3.0]) * 0.03
    angles = np.concatenate([np.pi / 2 + offsets, 3 * np.pi / 2 - offsets])
    x0 = jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=1)
    x = np.asarray(_solve(np.diag(ev), beta, x0, 80.0))
    if stable:
        assert np.all(np.abs(x[:, 1]) > 1 - 1e-6) and np.sum(x[:, 1] > 0) == 3
    else:
        assert np.all(np.abs(x[:, 1]) < 0.1)  # it left the split (for e_1, the other stable mode)


@pytest.mark.slow
@pytest.mark.parametrize("ev,beta", [((1.0, 0.6, -0.8), 0.5), ((-0.3, -0.5, -1.0), 2.0)])
def test_random_starts_select_the_predicted_mode(ev, beta):
    # β = 0.5 keeps the split along e_1 unstable (0.6 > tanh(0.5)): alignment is then the only
    # stable pure mode along e_1
    d, n = 3, 8
    R = _rotation(d, 3)
    V = R @ np.diag(ev) @ R.T
    k, split = ss.predicted_mode(ev)
    x0 = tp.uniform_sphere(jax.random.key(4), n=n, d=d)
    y = np.asarray(_solve((V + V.T) / 2, beta, x0, 200.0)) @ R[:, k]
    assert np.all(np.abs(y) > 1 - 1e-6)
    plus = int(np.sum(y > 0))
    assert (0 < plus < n) == split
    assert ss.pure_mode_growth(ev, k, plus, n - plus, beta) < 0


def test_predicted_mode_and_bad_input():
    assert ss.predicted_mode([0.5, 1.0, -0.9]) == (1, False)
    assert ss.predicted_mode([-0.5, -1.0, -0.9]) == (1, True)
    assert ss.predicted_mode([0.5, -1.0]) is None
    with pytest.raises(ValueError, match="symmetric"):
        ss.symmetric_attention(np.array([[1.0, 2.0], [0.0, 1.0]]), 1.0)
    with pytest.raises(ValueError, match="plus \\+ minus"):
        ss.pure_mode_growth([1.0, 0.5], 0, 0, 0, 1.0)
    with pytest.raises(ValueError, match="k must be <= 1"):
        ss.homogeneous_mode_stable([1.0, 0.5], 2)
