"""The interaction energy's closed forms (theory.interaction_energy) against the energy computed
on the configurations themselves (diagnostics.interaction_energy) and the stationarity equation."""

import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.theory.interaction_energy import candidate_energies, four_particle_root, ngon_energy


@pytest.mark.parametrize("n, beta", [(3, 0.5), (5, 2.0), (8, 4.0)])
def test_ngon_energy_is_the_energy_of_the_ngon(n, beta):
    th = 2 * np.pi * np.arange(n) / n
    x = jnp.asarray(np.stack([np.cos(th), np.sin(th)], -1))
    np.testing.assert_allclose(ngon_energy(n, beta), float(tp.diagnostics.interaction_energy(x, beta)), rtol=1e-13)


def test_candidate_energies_are_the_energies_of_dirac_and_pair():
    D, beta = np.diag([-1.0, 0.5, 2.0]), 1.5
    e = candidate_energies(D, beta)
    dirac = jnp.asarray([[0.0, 0.0, 1.0]] * 2)
    pair = jnp.asarray([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    np.testing.assert_allclose(e["dirac_top"], float(tp.diagnostics.interaction_energy(dirac, beta, D=D)), rtol=1e-13)
    np.testing.assert_allclose(e["pair_bottom"], float(tp.diagnostics.interaction_energy(pair, beta, D=D)), rtol=1e-13)


@pytest.mark.parametrize("d1, d2, beta", [(1.0, 2.0, 1.0), (0.5, 3.0, 2.0)])
def test_four_particle_root_is_stationary(d1, d2, beta):
    s = four_particle_root(d1, d2, beta)
    assert 0 < s < 1
    assert abs(d1 * np.tanh(beta * d1 * s) - d2 * np.tanh(beta * d2 * (1 - s))) < 1e-12
    # the configuration (±x1, ±x2) does not move under the descent with Q^T K = V = D
    r = np.sqrt([s, 1 - s])
    x = jnp.asarray([[r[0], r[1]], [-r[0], r[1]], [r[0], -r[1]], [-r[0], -r[1]]])
    D = jnp.diag(jnp.asarray([d1, d2]))
    dyn = tp.Sphere(tp.SoftmaxAttention(D, jnp.eye(2), -D, beta))
    assert float(jnp.max(jnp.abs(dyn.velocity(x)))) < 1e-12


@pytest.mark.package_errors
def test_a_zero_tolerance_is_refused_not_an_endless_bisection():
    with pytest.raises(ValueError, match="tol must be > 0"):
        four_particle_root(1.0, 2.0, 1.0, tol=0.0)
