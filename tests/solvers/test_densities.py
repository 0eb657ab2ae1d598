"""Densities along characteristics (issue 22 item 4; sphere.md §13): ``tp.WithLogDensity``.

Oracles: the trace of the autodiff Jacobian (and, on the sphere, of P⊥ J P⊥ in a tangent basis)
for the closed-form divergences; the Gaussian closure's exact density N(mean_t, cov_t) at tracers
moved by it; and the change of variables log ρ_t(Φ z) = log ρ_0(z) − log|det DΦ(z)| with DΦ from
central finite differences of the flow map (tangent bases on the sphere, surface measure).
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import multivariate_normal

import transformer_pde as tp
from transformer_pde.models.base import AbstractFieldDynamics

KEYS = jax.random.split(jax.random.key(7), 8)


def _attention(d=2, beta=0.4, cls=tp.SoftmaxAttention):
    Q, K, V = (jnp.eye(d) + 0.3 * jax.random.normal(k, (d, d)) for k in KEYS[:3])
    return cls(Q, K, V, beta=beta)


def _jac_traces(field, q):
    """tr Df at every row of q (jitted: eager autodiff is slow on a shared machine)."""
    return jax.jit(jax.vmap(lambda z: jnp.trace(jax.jacfwd(field)(z))))(q)


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3])
def test_softmax_divergence_closed_form_matches_autodiff_trace(d):
    att = _attention(d, beta=0.7)
    x = 1.5 * jax.random.normal(KEYS[3], (30, d)) + 2.0  # off-centre keys: the centring matters
    w = jax.random.dirichlet(KEYS[4], jnp.ones(30))
    q = jax.random.normal(KEYS[5], (6, d))
    got = eqx.filter_jit(att.divergence)(q, x, w, 0.0)
    ref = _jac_traces(lambda z: att.query_field(z[None], x, w, 0.0)[0], q)
    np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-11)
    # beta tr(V Cov_p(y) K^T Q), written out with NumPy
    Q, K, V = (np.asarray(m) for m in (att.Q, att.K, att.V))
    for qi, g in zip(np.asarray(q), np.asarray(got)):
        logits = 0.7 * (np.asarray(x) @ K.T) @ (Q @ qi) + np.log(np.asarray(w))
        p = np.exp(logits - logits.max())
        p /= p.sum()
        ybar = p @ np.asarray(x)
        cov = (np.asarray(x) - ybar).T @ ((np.asarray(x) - ybar) * p[:, None])
        assert abs(0.7 * np.trace(V @ cov @ K.T @ Q) - g) < 1e-11


def test_mlp_divergence_and_default_autodiff():
    d, m = 2, 5
    W1, b1, W2 = (jax.random.normal(k, s) for k, s in zip(KEYS[:3], [(m, d), (m,), (d, m)]))
    for act in (jax.nn.relu, jnp.tanh):
        mlp = tp.MLP(W1, b1, W2, jnp.zeros(d), activation=act)
        q = jax.random.normal(KEYS[4], (7, d))
        ref = _jac_traces(lambda z: mlp.query_field(z[None], q, None, 0.0)[0], q)
        np.testing.assert_allclose(eqx.filter_jit(mlp.divergence)(q, q, None, 0.0), ref, atol=1e-12)
        # the class default (autodiff) agrees with the override
        default = jax.jit(lambda q: AbstractFieldDynamics.divergence(mlp, q, q, None, 0.0))
        np.testing.assert_allclose(default(q), ref, atol=1e-12)


def test_sphere_surface_divergence_matches_tangent_trace():
    d = 3
    dyn = tp.Sphere(_attention(d, beta=1.3))
    x = tp.normalize(jax.random.normal(KEYS[3], (25, d)))
    w = jnp.full(25, 1 / 25)
    q = tp.normalize(jax.random.normal(KEYS[4], (5, d)))
    got = eqx.filter_jit(dyn.divergence)(q, x, w, 0.0)

    def tangent_trace(z):
        J = jax.jacfwd(lambda z: dyn.query_field(z[None], x, w, 0.0)[0])(z)
        P = jnp.eye(d) - jnp.outer(z, z)
        return jnp.trace(P @ J @ P)

    np.testing.assert_allclose(got, jax.jit(jax.vmap(tangent_trace))(q), atol=1e-12)


@pytest.mark.slow
def test_density_on_tracers_matches_gaussian_closure():
    """Tracers moved by the Gaussian closure's field carry exactly log N(mean_t, cov_t)."""
    att = _attention(2, beta=0.2)
    m0, c0 = jnp.array([0.3, -0.2]), jnp.array([[0.5, 0.15], [0.15, 0.3]])
    g = tp.Gaussian(m0, c0)
    z = g.sample(KEYS[5], 40)
    lr0 = jnp.asarray(multivariate_normal(m0, c0).logpdf(np.asarray(z)))
    ts = jnp.linspace(0.0, 1.0, 3)
    sol = tp.solve(att, tp.WithLogDensity(tp.Tracers(g, z), lr0), t1=1.0, dt0=0.05, saveat=ts)
    (_, zs), log_rho = sol.xs
    gs = tp.solve(att, g, t1=1.0, dt0=0.05, saveat=ts)
    assert float(jnp.linalg.norm(gs.covs[-1] - c0)) > 0.1  # the law moved
    for i in range(3):
        ref = multivariate_normal(np.asarray(gs.means[i]), np.asarray(gs.covs[i])).logpdf(np.asarray(zs[i]))
        np.testing.assert_allclose(log_rho[i], ref, atol=1e-8)


def _fd_log_det(flow, z0, h=1e-5, tangent=False):
    """log|det DΦ(z0)| per point by central differences of ``flow`` (all points in one call);
    on the sphere DΦ restricted to tangent bases at z0 and Φ(z0)."""
    m, d = z0.shape
    eye = np.eye(d)
    if tangent:
        bases0 = np.stack([np.linalg.svd(np.eye(d) - np.outer(p, p))[0][:, :d - 1] for p in np.asarray(z0)])
    else:
        bases0 = np.broadcast_to(eye, (m, d, d))
    k = bases0.shape[2]
    plus = z0[:, None, :] + h * np.swapaxes(bases0, 1, 2)
    minus = z0[:, None, :] - h * np.swapaxes(bases0, 1, 2)
    pts = np.concatenate([np.asarray(z0), plus.reshape(-1, d), minus.reshape(-1, d)])
    if tangent:
        pts = pts / np.linalg.norm(pts, axis=1, keepdims=True)
    out = np.asarray(flow(jnp.asarray(pts)))
    end, fp, fm = out[:m], out[m:m + m * k].reshape(m, k, d), out[m + m * k:].reshape(m, k, d)
    cols = np.swapaxes((fp - fm) / (2 * h), 1, 2)  # (m, d, k): DΦ applied to the basis
    if tangent:
        bases1 = np.stack([np.linalg.svd(np.eye(d) - np.outer(p, p))[0][:, :d - 1] for p in end])
        cols = np.einsum("mdk,mdj->mkj", bases1, cols)
    return end, np.linalg.slogdet(cols)[1]


CASES = {
    "softmax R^2 (closed form)": (lambda: _attention(2, beta=0.8), False),
    "l2 R^2 (autodiff)": (lambda: _attention(2, beta=0.5, cls=tp.L2Attention), False),
    "sphere S^2": (lambda: tp.Sphere(_attention(3, beta=2.0)), True),
}
# fast: the sphere (surface measure); the R^2 closed form is also checked against the Gaussian
# closure, the autodiff default directly (MLP)
SLOW = {"l2 R^2 (autodiff)", "softmax R^2 (closed form)"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in sorted(CASES)])
def test_density_matches_change_of_variables_of_the_flow_map(case):
    make, sphere = CASES[case]
    dyn = make()
    d = 3 if sphere else 2
    x = jax.random.normal(KEYS[6], (24, d))
    z0 = jax.random.normal(KEYS[7], (5, d))
    if sphere:
        x, z0 = tp.normalize(x), tp.normalize(z0)
    carrier = tp.Particles(x)
    kw = dict(t1=1.0, dt0=0.02, solver=diffrax.Tsit5())

    def flow(z):
        return tp.solve(dyn, tp.Tracers(carrier, z), **kw).final[1]

    end, logdet = _fd_log_det(flow, np.asarray(z0), tangent=sphere)
    sol = tp.solve(dyn, tp.WithLogDensity(tp.Tracers(carrier, z0), jnp.zeros(5)), **kw)
    (_, zt), log_rho = sol.final
    np.testing.assert_allclose(zt, end, atol=1e-12)
    assert np.max(np.abs(logdet)) > 0.05  # the map is not volume preserving
    np.testing.assert_allclose(log_rho, -logdet, atol=1e-7)


@pytest.mark.slow
def test_perceptron_particles_density_by_change_of_variables():
    """Token-wise perceptron v = w σ(aᵀx + b) (one piece of the normalizing-flow field; σ
    smoothed to softplus: with ReLU a token crossing the kink aᵀx + b = 0 mid-step makes the
    integrated divergence first order in dt); particles do not interact, so each token's path
    is the flow map."""
    d = 2
    a, b, w = (jax.random.normal(k, s) for k, s in zip(KEYS[:3], [(1, d), (1,), (d, 1)]))
    mlp = tp.MLP(a, b, w, jnp.zeros(d), activation=jax.nn.softplus)
    z0 = jax.random.normal(KEYS[3], (6, d))
    kw = dict(t1=1.0, dt0=1 / 30, solver=diffrax.Tsit5())
    end, logdet = _fd_log_det(lambda z: tp.solve(mlp, z, **kw).final, np.asarray(z0))
    sol = tp.solve(mlp, tp.WithLogDensity(z0, jnp.zeros(6)), **kw)
    xt, log_rho = sol.final
    np.testing.assert_allclose(xt, end, atol=1e-12)
    assert np.max(np.abs(logdet)) > 0.05
    np.testing.assert_allclose(log_rho, -logdet, atol=1e-8)
    assert sol.weights.shape == (6,)


def test_with_log_density_errors():
    att = _attention(2)
    x = jax.random.normal(KEYS[0], (4, 2))
    with pytest.raises(ValueError, match=r"log_rho0 must have shape \(4,\)"):
        tp.solve(att, tp.WithLogDensity(x, jnp.zeros(3)), t1=0.1, dt0=0.05)
    with pytest.raises(ValueError, match=r"log_rho0\[1\] = -inf"):
        tp.solve(att, tp.WithLogDensity(x, jnp.array([0.0, -jnp.inf, 0.0, 0.0])), t1=0.1, dt0=0.05)
    causal = tp.Causal(tp.SoftmaxAttention(jnp.eye(2), jnp.eye(2), jnp.eye(2)))
    with pytest.raises(ValueError, match="no field with a divergence"):
        tp.solve(causal, tp.WithLogDensity(x, jnp.zeros(4)), t1=0.1, dt0=0.05)
    xs = tp.normalize(x)
    with pytest.raises(ValueError, match="no field with a divergence"):
        tp.solve(tp.PostLN(att), tp.WithLogDensity(xs, jnp.zeros(4)), t1=0.1, dt0=0.05)
    with pytest.raises(ValueError, match="Particles or tp.Tracers"):
        tp.WithLogDensity(tp.Gaussian(jnp.zeros(2), jnp.eye(2)), jnp.zeros(2))
