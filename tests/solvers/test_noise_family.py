"""Noise is a family (solvers/noise.py): a new kind is one class outside the package, common noise
moves all tokens at once, and a state that takes no noise is refused by type.

The new kind here is multiplicative (geometric) noise, dX^k = σ X^k ∘ dB^k coordinate by coordinate,
whose Stratonovich solution with no drift is X_t = X_0 exp(σ B_t): the test rebuilds the run's
Brownian path and checks Heun's strong error against that closed form and its order (1 for this
commutative noise); tp.layers with the same noise is the Euler–Maruyama map against NumPy.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_noise import Still

import transformer_pde as tp
from transformer_pde.solvers.brownian import AbstractBrownian


class GeometricNoise(tp.AbstractNoise):
    """dX_i^k = σ X_i^k dB_i^k: every coordinate its own Brownian motion, scaled by itself."""

    sigma: jax.Array
    path: AbstractBrownian | None

    def __init__(self, sigma, path=None):
        self.sigma = jnp.asarray(sigma)
        self.path = path

    def check_state(self, state, dynamics):
        if not isinstance(state, tp.Particles):
            raise ValueError(f"{type(state).__name__} cannot take geometric noise")

    def brownian_shape(self, state, dynamics):
        return jax.ShapeDtypeStruct(state.x.shape, state.x.dtype)

    def additive(self, state, dynamics):
        return False

    def unit_increment(self, state, dynamics, t, y, dW):
        return y * dW


def _path_at_end(key, shape, t1, tol):
    """B_{t1} of the run's path: the tree tp.solve builds for BrownianTree(tol) over [0, t1]."""
    path = tp.BrownianTree(tol=tol).path(jnp.asarray(0.0), jnp.asarray(t1), None, False, shape, key,
                                         diffrax.BrownianIncrement)
    return path.evaluate(0.0, t1)


def test_a_new_noise_kind_is_one_class_outside_the_package():
    x0 = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, (6, 2)))
    sigma, t1, tol, key = 0.7, 1.0, 2.0**-12, jax.random.key(3)
    noise = GeometricNoise(sigma, path=tp.BrownianTree(tol=tol))
    exact = np.asarray(x0) * np.exp(sigma * np.asarray(_path_at_end(key, jax.ShapeDtypeStruct(x0.shape, x0.dtype),
                                                                    t1, tol)))
    hs = [2.0**-4, 2.0**-5, 2.0**-6, 2.0**-7]
    errs = []
    for h in hs:
        xs = tp.solve(Still(2), x0, t1=t1, dt0=h, solver=diffrax.Heun(), noise=noise, key=key).xs[-1]
        errs.append(float(np.max(np.abs(np.asarray(xs) - exact))))
    assert errs[-1] < 1e-2 * np.abs(exact).max()
    assert 0.8 < float(np.polyfit(np.log(hs), np.log(errs), 1)[0]) < 1.5  # strong order 1
    with pytest.raises(ValueError, match="Gaussian cannot take geometric noise"):
        tp.solve(tp.SoftmaxAttention.identity(2, 1.0), tp.Gaussian(jnp.zeros(2), jnp.eye(2)), t1=1.0, dt0=0.1,
                 noise=noise, key=key)


def test_layers_take_the_new_noise_with_the_solve_increment():
    x0 = np.random.default_rng(1).uniform(0.5, 1.5, (5, 3))
    sigma, h, L, key = 0.4, 0.05, 6, jax.random.key(7)
    out = np.asarray(tp.layers(Still(3), jnp.asarray(x0), L, h, noise=GeometricNoise(sigma), key=key).xs[-1])
    x = x0.copy()
    for l in range(L):
        xi = np.asarray(jax.random.normal(jax.random.fold_in(key, l), x.shape, jnp.float64))
        x = x + sigma * np.sqrt(h) * x * xi
    np.testing.assert_allclose(out, x, rtol=1e-13)


def _common(num_nodes=3, d=3, beta=1.0, sigma_A=1.0):
    heads = tp.GaussianHeads(d, beta=beta, sigma_A=sigma_A)
    _, W, Wp = heads.sample(jax.random.key(11), (num_nodes,))
    return heads, W, Wp


def test_common_noise_moves_equal_tokens_together_and_independent_noise_separates_them():
    heads, W, Wp = _common()
    x0 = jnp.tile(tp.uniform_sphere(jax.random.key(0), 1, 3), (4, 1))
    dyn = tp.PostLN(tp.RandomHeadsMeanField(tp.CommonNoiseSDE(heads, W, Wp)))
    common = tp.solve(dyn, x0, t1=0.5, dt0=0.05, solver=diffrax.Euler(), key=jax.random.key(1),
                      noise=tp.CommonNoise(tp.CommonNoiseSDE(heads, W, Wp))).xs[-1]
    assert float(jnp.max(jnp.abs(common - common[:1]))) == 0.0
    assert float(jnp.max(jnp.abs(common[0] - x0[0]))) > 1e-2  # it moved
    np.testing.assert_allclose(jnp.linalg.norm(common, axis=-1), 1.0, atol=1e-14)
    independent = tp.solve(dyn, x0, t1=0.5, dt0=0.05, solver=diffrax.Euler(), key=jax.random.key(1),
                           noise=tp.Noise(1.0)).xs[-1]
    assert float(jnp.max(jnp.abs(independent - independent[:1]))) > 1e-2


def test_common_noise_step_is_euler_maruyama_of_its_coefficients():
    # one Euler step from x0 over [0, h] with the grid path: N(x0 + h a(x0) + σ g(x0) ΔW), ΔW = √h Z
    heads, W, Wp = _common(num_nodes=2, beta=0.7)
    x0 = tp.uniform_sphere(jax.random.key(2), 5, 3)
    h, sigma, key = 0.1, 0.6, jax.random.key(9)
    g = tp.CommonNoiseSDE(heads, W, Wp)
    out = tp.solve(tp.PostLN(tp.RandomHeadsMeanField(g)), x0, t1=h, dt0=h, solver=diffrax.Euler(),
                   noise=tp.CommonNoise(g, sigma, path=tp.BrownianGrid()), key=key).xs[-1]
    # NumPy: the attention averages m_q(x_i), the Itô drift and the projected increment
    x, Wn, Wpn = (np.asarray(a) for a in (x0, W, Wp))
    dW = np.asarray(tp.BrownianGrid().path(jnp.asarray(0.0), jnp.asarray(h), jnp.asarray(h), False,
                                           jax.ShapeDtypeStruct((2, 3, 3), x0.dtype), key,
                                           diffrax.BrownianIncrement).evaluate(0.0, h))
    m = []
    for q in range(2):
        logits = 0.7 * (x @ Wpn[q]) @ (x @ Wn[q]).T
        p = np.exp(logits - logits.max(1, keepdims=True))
        m.append((p / p.sum(1, keepdims=True)) @ x)
    m = np.stack(m)
    drift = -0.5 * np.mean(np.sum(m**2, -1), 0)[:, None] * x
    inc = np.einsum("qab,qib->ia", dW, m) * heads.sigma_V / np.sqrt(heads.sigma2 * 2)
    inc = inc - np.sum(inc * x, 1, keepdims=True) * x
    y = x + h * drift + sigma * inc
    np.testing.assert_allclose(np.asarray(out), y / np.linalg.norm(y, axis=1, keepdims=True), rtol=1e-12)


def test_common_noise_refuses_states_and_solvers_it_cannot_serve():
    heads, W, Wp = _common()
    noise = tp.CommonNoise(tp.CommonNoiseSDE(heads, W, Wp))
    dyn = tp.PostLN(tp.RandomHeadsMeanField(tp.CommonNoiseSDE(heads, W, Wp)))
    x0 = tp.uniform_sphere(jax.random.key(0), 4, 3)
    with pytest.raises(ValueError, match="Gaussian cannot take common noise"):
        tp.solve(tp.SoftmaxAttention.identity(3, 1.0), tp.Gaussian(jnp.zeros(3), jnp.eye(3)), t1=1.0, dt0=0.1,
                 noise=noise, key=jax.random.key(0))
    with pytest.raises(ValueError, match="ShARK is for additive noise only"):
        tp.solve(dyn, x0, t1=1.0, dt0=0.1, noise=noise, key=jax.random.key(0), solver=diffrax.ShARK())


@pytest.mark.package_errors
def test_common_noise_names_a_diffusion_of_the_wrong_type_and_layers_a_bad_key():
    with pytest.raises(ValueError, match="CommonNoise.diffusion must be a tp.AbstractCommonDiffusion"):
        tp.CommonNoise(tp.Noise(0.1))
    with pytest.raises(ValueError, match="key must be a JAX PRNG key"):
        tp.layers(tp.SoftmaxAttention.identity(2, 1.0), jnp.ones((3, 2)), 3, 0.1, noise=tp.Noise(0.1), key=7)


def test_a_state_that_takes_no_noise_is_refused_by_type():
    attn = tp.SoftmaxAttention.identity(2, 1.0)
    x0 = jnp.asarray(np.random.default_rng(0).normal(size=(4, 2)))
    with pytest.raises(ValueError, match="WithLogDensity cannot take noise"):
        tp.solve(attn, tp.WithLogDensity(x0, jnp.zeros(4)), t1=1.0, dt0=0.1, noise=tp.Noise(0.1),
                 key=jax.random.key(0))
    with pytest.raises(ValueError, match="Coupled part 1 \\(WithLogDensity\\) cannot take noise"):
        tp.solve(attn, tp.Coupled(tp.Particles(x0), tp.WithLogDensity(x0, jnp.zeros(4))), t1=1.0, dt0=0.1,
                 noise=tp.Noise(0.1), key=jax.random.key(0))


@pytest.mark.parametrize("sigma, message", [
    (lambda: 1.0, "Noise.sigma must be a function of the time alone"),
    (lambda t, u: 1.0, "Noise.sigma must be a function of the time alone"),
    (lambda t: 1j + t, "Noise.sigma\\(t\\) must be a real scalar"),
    (lambda t: "a", "Noise.sigma\\(t\\) must be a real scalar"),
    (lambda t: 1.0 if float(t) < 1 else 2.0, "Noise.sigma\\(t\\) must be traceable"),
])
def test_a_bad_sigma_function_is_named(sigma, message):
    attn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0))
    x0 = tp.uniform_sphere(jax.random.key(0), 4, 3)
    with pytest.raises(ValueError, match=message):
        tp.solve(attn, x0, t1=0.2, dt0=0.1, noise=tp.Noise(sigma), key=jax.random.key(0))
    with pytest.raises(ValueError, match=message):
        tp.layers(attn, x0, 2, 0.1, noise=tp.Noise(sigma), key=jax.random.key(0))


def test_a_tree_finer_than_the_dtype_resolves_is_refused():
    # float32 times on [0, 0.2] resolve ~1e-7: a tree of tol 1e-30 drew increments of 2.7e8
    attn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0))
    x0 = tp.uniform_sphere(jax.random.key(0), 4, 3, dtype=jnp.float32)
    with pytest.raises(ValueError, match="BrownianTree.tol=1e-30 is below what float32 times resolve"):
        tp.solve(attn, x0, t1=0.2, dt0=0.1, noise=tp.Noise(0.5, path=tp.BrownianTree(tol=1e-30)),
                 key=jax.random.key(0))
    x64 = x0.astype(jnp.float64)  # float64 resolves it (the tree is merely deep)
    sol = tp.solve(attn, x64, t1=0.2, dt0=0.1, noise=tp.Noise(0.5, path=tp.BrownianTree(tol=1e-12)),
                   key=jax.random.key(0))
    assert bool(jnp.all(jnp.isfinite(sol.xs)))


def test_the_nonfinite_report_of_a_noisy_run_names_the_noise():
    attn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0))
    x0 = tp.uniform_sphere(jax.random.key(0), 4, 3)
    with pytest.raises(tp.NonFiniteStateError, match="the noise σ"):
        tp.solve(attn, x0, t1=0.2, dt0=0.1, noise=tp.Noise(1e300), key=jax.random.key(0))
