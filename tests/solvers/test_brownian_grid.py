"""tp.BrownianGrid: Brownian motion drawn cell by cell with bridges inside a cell (the default path
for constant steps). Checked against the Brownian covariance min(s, t), Chen's relation, one path
for a run and its chunks and for runs on a common grid, and gradients through a solve."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.solvers.noise import BrownianGrid


def _path(key, cell=0.25, shape=(3,)):
    return BrownianGrid(dt=cell).path(jnp.asarray(0.0), jnp.asarray(1.0), None, False,
                                      jax.ShapeDtypeStruct(shape, jnp.float64), key,
                                      diffrax.BrownianIncrement)


def test_covariance_is_min_s_t():
    """W at grid and off-grid times (inside cells, on cell ends): Cov(W_s, W_t) = min(s, t)."""
    ts = jnp.asarray([0.1, 0.25, 0.4, 0.6, 0.9])
    keys = jax.random.split(jax.random.key(0), 4000)
    w = jax.vmap(lambda k: jax.vmap(lambda t: _path(k).evaluate(t))(ts))(keys)  # (keys, t, 3)
    samples = np.asarray(w).transpose(0, 2, 1).reshape(-1, len(ts))  # components are independent
    cov = np.cov(samples.T)
    expect = np.minimum(ts[:, None], ts[None, :])
    # standard error of a covariance estimate with m samples: ~ sqrt((s t + min²)/m) <= 1.3/sqrt(m)
    np.testing.assert_allclose(cov, expect, atol=4 * 1.3 / np.sqrt(samples.shape[0]))
    np.testing.assert_allclose(samples.mean(axis=0), 0.0, atol=4 * 1.0 / np.sqrt(samples.shape[0]))


def test_chen_relation_and_value():
    """W(s, u) = W(s, t) + W(t, u) for times on and off the grid (one path, not fresh draws)."""
    p = _path(jax.random.key(3))
    inc = jax.jit(lambda s, t: p.evaluate(s, t))
    val = jax.jit(lambda t: p.evaluate(t))
    for s, t, u in [(0.1, 0.3, 0.95), (0.0, 0.25, 0.5), (0.3, 0.7, 0.7001), (0.25, 0.26, 0.74)]:
        s, t, u = (jnp.asarray(v) for v in (s, t, u))
        np.testing.assert_allclose(inc(s, u), inc(s, t) + inc(t, u), atol=1e-13)
        np.testing.assert_allclose(inc(s, u), val(u) - val(s), atol=1e-13)


@pytest.mark.slow
def test_one_path_for_chunks_and_common_grid():
    """The default path of a constant-step run is the grid of dt0: a run equals the same run cut in
    two (one Brownian interval), and a run with step 2h on BrownianGrid(dt=h) ends at the same
    point as Euler–Maruyama on that path would in the limit: strong error halves with h."""
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0, backend=tp.kernels.Exact()))
    x0 = tp.uniform_sphere(jax.random.key(1), 16, 3)
    key = jax.random.key(2)
    noise = tp.Noise(0.7)
    whole = tp.solve(dyn, x0, t1=1.0, dt0=0.125, noise=noise, key=key, event=None).xs[-1]
    first = tp.solve(dyn, x0, t1=0.5, dt0=0.125, noise=noise, key=key, brownian_interval=(0.0, 1.0),
                     event=None).xs[-1]
    second = tp.solve(dyn, first, t0=0.5, t1=1.0, dt0=0.125, noise=noise, key=key,
                      brownian_interval=(0.0, 1.0), event=None).xs[-1]
    np.testing.assert_allclose(second, whole, atol=1e-12)
    # one path on the grid 2^-9 seen by Heun at steps 2^-4 .. 2^-7 against the step 2^-9: the
    # strong error falls at order 1/2 (the projected noise σP⊥_x dB does not commute); a fresh
    # path per step size would not converge at all
    fine = tp.Noise(0.7, path=BrownianGrid(dt=2.0**-9))
    run = lambda h: tp.solve(dyn, x0, t1=0.5, dt0=h, solver=diffrax.Heun(), noise=fine, key=key,  # noqa: E731
                             event=None).xs[-1]
    ref = run(2.0**-9)
    ks = np.arange(4, 8)
    errs = np.asarray([float(jnp.mean(jnp.linalg.norm(run(2.0**-k) - ref, axis=-1))) for k in ks])
    slope = -np.polyfit(ks, np.log2(errs), 1)[0]
    assert 0.3 < slope < 1.3 and errs[-1] < errs[0] / 2, (errs, slope)


@pytest.mark.slow
def test_gradient_through_the_grid_path():
    """jax.grad of a noisy run in σ (default path, default adjoint) matches a central difference."""
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0, backend=tp.kernels.Exact()))
    x0 = tp.uniform_sphere(jax.random.key(4), 8, 3)
    key = jax.random.key(5)
    f = lambda s: jnp.sum(tp.solve(dyn, x0, t1=0.5, dt0=0.1, noise=tp.Noise(s), key=key,  # noqa: E731
                                   event=None).xs[-1][:, 0])
    g = jax.grad(f)(0.6)
    fd = (f(0.6 + 1e-5) - f(0.6 - 1e-5)) / 2e-5
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_default_path_and_bad_input():
    noise = tp.Noise(0.5)
    assert isinstance(noise.path_for(False, diffrax.BrownianIncrement), BrownianGrid)
    assert isinstance(noise.path_for(True, diffrax.BrownianIncrement), tp.BrownianTree)
    assert isinstance(noise.path_for(False, diffrax.SpaceTimeLevyArea), tp.BrownianTree)
    with pytest.raises(ValueError, match="BrownianGrid.dt must be > 0"):
        BrownianGrid(dt=-0.1)
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0, backend=tp.kernels.Exact()))
    x0 = tp.uniform_sphere(jax.random.key(1), 4, 3)
    with pytest.raises(ValueError, match="Lévy area"):
        tp.solve(dyn, x0, t1=0.2, dt0=0.1, solver=diffrax.SPaRK(), key=jax.random.key(0),
                 noise=tp.Noise(0.5, path=BrownianGrid()))
