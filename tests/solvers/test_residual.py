"""The residual layer as a step rule of tp.solve (solvers/residual.py): tp.layers is tp.solve with
solver=tp.ResidualLayer(), the same map as diffrax's Euler with the dynamics' retraction."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp


def _setup():
    x0 = tp.uniform_sphere(jax.random.key(0), 16, 3)
    return tp.PostLN(tp.SoftmaxAttention.identity(3, 2.0)), x0


def test_the_rule_is_layers_and_euler_with_the_retraction():
    dyn, x0 = _setup()
    ts = jnp.arange(0, 13) * 0.05  # 12 layers of h = 0.05, saved every layer
    rule = tp.solve(dyn, x0, t1=0.6, dt0=0.05, solver=tp.ResidualLayer(), saveat=ts)
    lay = tp.layers(dyn, x0, 12, 0.05)
    np.testing.assert_array_equal(rule.xs, lay.xs)
    np.testing.assert_array_equal(rule.ts, lay.ts)
    # diffrax's Euler through Retracted: the same layers, its times accumulated step by step
    euler = tp.solve(dyn, x0, t1=0.6, dt0=0.05, solver=diffrax.Euler(), saveat=ts)
    np.testing.assert_allclose(rule.xs, euler.xs, atol=1e-13)
    # a NumPy layer map written plainly: x <- (x + h V softmax(beta <x, y>) y) / |.|
    x = np.asarray(x0)
    for _ in range(12):
        logits = 2.0 * x @ x.T
        p = np.exp(logits - logits.max(1, keepdims=True))
        x = x + 0.05 * (p / p.sum(1, keepdims=True)) @ x
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_allclose(rule.xs[-1], x, atol=1e-13)


def test_the_rule_saves_every_s_layers_with_statistics():
    dyn, x0 = _setup()
    ts = jnp.arange(0, 13, 4) * 0.05
    mean = lambda t, x, args: jnp.mean(x, 0)  # noqa: E731
    rule = tp.solve(dyn, x0, t1=0.6, dt0=0.05, solver=tp.ResidualLayer(), saveat=diffrax.SaveAt(ts=ts, fn=mean))
    np.testing.assert_allclose(rule.stats, jnp.mean(tp.layers(dyn, x0, 12, 0.05).xs[::4], 1), atol=1e-15)


@pytest.mark.parametrize("kwargs, message", [
    (dict(t1=0.62), "must be a whole number of layers of dt0"),
    (dict(saveat=jnp.asarray([0.0, 0.1, 0.25])), "saves every s layers from t0 to t1"),
    (dict(stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-3)), "stepsize_controller does not apply"),
    (dict(saveat=diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=jnp.asarray([0.6]))])), "takes one save"),
])
def test_the_rule_refuses_what_a_scan_of_layers_cannot_do(kwargs, message):
    dyn, x0 = _setup()
    with pytest.raises(ValueError, match=message):
        tp.solve(dyn, x0, **{"t1": 0.6, "dt0": 0.05, "solver": tp.ResidualLayer(), **kwargs})
    with pytest.raises(ValueError, match="layers moves tokens"):
        tp.solve(tp.SoftmaxAttention.identity(2, 1.0), tp.Gaussian(jnp.zeros(2), jnp.eye(2)), t1=0.6, dt0=0.05,
                 solver=tp.ResidualLayer())
