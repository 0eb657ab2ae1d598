"""tp.Sphere evaluates its attention at the retracted stage x/|x|: the stages of a noisy Heun step
leave the sphere by O(σ²h) (Gaussian tails), and a fast kernel planned for unit tokens
(Fast(radius=1)) used to raise there. Checked against the exact kernel and the unretracted field."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp
from transformer_pde.kernels import Exact, Fast


def test_fast_radius_one_holds_at_noisy_heun_stages():
    x0 = tp.uniform_sphere(jax.random.key(0), 600, 3)
    kw = dict(t1=0.2, dt0=0.05, solver=diffrax.Heun(), noise=tp.Noise(0.8), key=jax.random.key(1), event=None)
    exact = tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(3, 2.0, backend=Exact())), x0, **kw).xs[-1]
    fast = tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(3, 2.0, backend=Fast(tol=1e-10, radius=1.0))),
                    x0, **kw).xs[-1]
    np.testing.assert_allclose(fast, exact, atol=1e-8)


def test_field_off_the_sphere_is_the_field_at_the_retraction():
    """F(x) = P⊥_u Γ(u; μ_u), u = x/|x|, against the plain formula (softmax average of the unit
    tokens, projected) at points pushed off the sphere: the field is 0-homogeneous and tangent."""
    x = tp.uniform_sphere(jax.random.key(2), 7, 3) * jnp.linspace(0.8, 1.3, 7)[:, None]
    w = jnp.full(7, 1 / 7)
    f = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.5, backend=Exact())).vector_field(x, w, 0.0)
    u = np.asarray(x) / np.linalg.norm(x, axis=-1, keepdims=True)
    logits = 1.5 * u @ u.T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = p @ u
    expect = g - np.sum(u * g, axis=-1, keepdims=True) * u
    np.testing.assert_allclose(f, expect, atol=1e-13)
