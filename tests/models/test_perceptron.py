"""The perceptron block on the sphere: energy, dissipation, atomic critical points (sphere.md §7)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _runs import tiny_run

import transformer_pde as tp
from transformer_pde.diagnostics import perceptron_energy, stationarity_residual
from transformer_pde.models import PerceptronBlock


def _block(sign=1.0, beta=1.5, d=3):
    a = np.asarray(tp.uniform_sphere(jax.random.key(7), 3, d))
    return PerceptronBlock(beta, a, np.array([1.0, -2.0, 0.5]), sign=sign)


def test_velocity_is_gradient_of_first_variation():
    # P⊥∇_x(β^{-1}∫e^{β x·y}dμ + ½ v(x)) by finite differences of a NumPy first variation
    blk = _block()
    x = np.asarray(tp.uniform_sphere(jax.random.key(1), 5, 3))
    a, om, beta = np.asarray(blk.a), np.asarray(blk.omega), float(blk.beta)

    def first_variation(z):
        return np.mean(np.exp(beta * x @ z)) / beta + 0.5 * om @ np.maximum(a @ z, 0) ** 2

    v = np.asarray(blk.velocity(x))
    for i in range(5):
        g = np.array([(first_variation(x[i] + 1e-6 * e) - first_variation(x[i] - 1e-6 * e)) / 2e-6
                      for e in np.eye(3)])
        np.testing.assert_allclose(v[i], g - (g @ x[i]) * x[i], rtol=1e-6, atol=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_energy_dissipation_identity(sign):
    # dE/dt = sign·∫|velocity|² dμ along the particle flow (Wasserstein gradient flow)
    blk = _block(sign)
    x0 = tp.uniform_sphere(jax.random.key(2), 12, 3)
    h = 1e-3
    ts = jnp.array([0.1 - h, 0.1, 0.1 + h])
    sol = tp.solve(blk, x0, t1=0.1 + h, dt0=h / 4, saveat=ts, solver=diffrax.Tsit5())
    E = [float(perceptron_energy(blk, x)) for x in sol.xs]
    dEdt = (E[2] - E[0]) / (2 * h)
    v = blk.velocity(sol.xs[1])
    np.testing.assert_allclose(dEdt, sign * float(jnp.mean(jnp.sum(v**2, -1))), rtol=1e-5)


def test_stationarity_residual_and_validation():
    blk = _block(d=2)
    # a single atom at a critical point of v restricted to the circle is stationary: find one
    th = np.linspace(0, 2 * np.pi, 61)
    z = np.stack([np.cos(th), np.sin(th)], 1)
    res = np.array([stationarity_residual(blk, zz[None], [1.0]) for zz in z])
    # |P⊥_z Σ ω_j σ(a_j·z) a_j| for a single atom (self-attraction is radial)
    a, om = np.asarray(blk.a), np.asarray(blk.omega)
    f = (np.maximum(z @ a.T, 0) * om) @ a
    ref = np.linalg.norm(f - np.sum(f * z, 1, keepdims=True) * z, axis=1)
    np.testing.assert_allclose(res, ref, rtol=1e-10, atol=1e-12)
    assert res.min() < 0.2 and res.max() > 0.5
    with pytest.raises(ValueError, match="sign"):
        PerceptronBlock(1.0, np.eye(2), np.ones(2), sign=2)
    with pytest.raises(ValueError, match="omega"):
        PerceptronBlock(1.0, np.eye(2), np.ones(3))
    # the activation is a value: a name is refused, and one without a closed-form potential has no energy
    with pytest.raises(ValueError, match="AbstractActivation"):
        PerceptronBlock(1.0, np.eye(2), np.ones(2), activation="relu")
    with pytest.raises(ValueError, match="no closed-form energy"):
        perceptron_energy(PerceptronBlock(1.0, np.eye(2), np.ones(2), activation=tp.Softplus()), np.eye(2))


def test_softplus_field_matches_numpy():
    a = np.asarray(tp.uniform_sphere(jax.random.key(7), 3, 3))
    om, beta = np.array([1.0, -2.0, 0.5]), 1.5
    blk = PerceptronBlock(beta, a, om, activation=tp.Softplus())
    x = np.asarray(tp.uniform_sphere(jax.random.key(1), 5, 3))
    raw = np.mean(np.exp(beta * x @ x.T)[:, :, None] * x[None, :, :], axis=1)
    raw += (np.log1p(np.exp(x @ a.T)) * om) @ a
    ref = raw - np.sum(raw * x, axis=1, keepdims=True) * x
    np.testing.assert_allclose(blk.velocity(x), ref, rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_experiment_perceptron_tiny(tmp_path_factory):
    res, cfg, _ = tiny_run("perceptron", tmp_path_factory)
    n1, n2 = (int(n) for n in res["ns"])
    for mode in ("descent", "ascent"):
        k1, k2 = int(res[f"{mode}_n{n1}_num_atoms"]), int(res[f"{mode}_n{n2}_num_atoms"])
        # finitely many atoms, the same for both n, at the same places
        assert k1 == k2 and k1 < n1 / 4
        np.testing.assert_allclose(np.sort(res[f"{mode}_n{n1}_atoms"]), np.sort(res[f"{mode}_n{n2}_atoms"]),
                                   atol=2e-2)
        # the atomic measure solves the stationarity equation
        assert float(res[f"{mode}_n{n1}_residual"]) < 1e-3 and float(res[f"{mode}_n{n2}_residual"]) < 1e-3
        E = res[f"{mode}_n{n1}_energy"]
        sgn = -1 if mode == "descent" else 1
        assert np.all(sgn * np.diff(E) > -1e-8 * np.abs(E).max())
    # the global minimizer (descent) is atomic though the interaction alone would spread it
    assert int(res[f"descent_n{n2}_num_atoms"]) >= 2
