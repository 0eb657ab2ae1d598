r"""Random multi-head attention and its diffusive (common-noise) limit
(docs: math/random_heads.md#the-common-noise-sde).

**Chain** (Koubbi–Geshkovski–Rigollet). With weights θ = (V, A) drawn i.i.d. per layer and head,

$$x_i^{\ell+1}=N\Big(x_i^\ell+\frac\eta H\sum_{h=1}^H B_{\theta_h^\ell}[\mu_{X^\ell}](x_i^\ell)\Big),\qquad
B_\theta[\mu](z)=\frac{\int e^{\beta\langle Az,y\rangle}Vy\,d\mu(y)}{\int e^{\beta\langle Az,y\rangle}d\mu(y)}.$$

**Gaussian case (G)**: V_ab ~ N(0, σ_V²) and A = W W'ᵀ with W, W' of shape (d, k) and entries
N(0, σ_A²). B is odd in V, so the mean field b = E_θ B_θ vanishes: the ballistic limit is
static and the dynamics is pure noise, with σ² = max E|P⊥ξ|² = σ_V²(d − 1).

**Diffusive limit** [derived]. Expanding N(x + y) = x + P⊥y − ⟨x,y⟩P⊥y − ½|P⊥y|²x + O(|y|³)
with y = (η/H)Σ_h B_h, one layer has mean −(η²/H)(E⟨x,ξ⟩P⊥ξ + ½E|P⊥ξ|²x) + O(η³) and
covariance (η²/H)E[P⊥ξ ⊗ P⊥ξ] (across all tokens: the noise is common). In case (G),
E_V[(xᵀVm)P⊥Vm] = σ_V²|m|²P⊥x = 0, so in the diffusive clock s = ℓη²σ²/H (the paper's αt with
α = ησ²/H) the chain converges weakly, with error O(η²σ²/H) = O(1/L) at fixed s, to the Itô SDE

$$dx_i=\frac{\sigma_V}{\sigma}P^\perp_{x_i}\,dW^V_s\,\bar m(x_i)
-\frac{\sigma_V^2(d-1)}{2\sigma^2}\,\mathbb E_A|m_A(x_i)|^2x_i\,ds,
\qquad m_A(z)=\frac{\int e^{\beta\langle Az,y\rangle}y\,d\mu}{\int e^{\beta\langle Az,y\rangle}d\mu},$$

where W^V is a d×d matrix of Brownian motions integrated against the white noise over A:
the V-integral of ∫ V m W(dθ, ds) is exact (a linear Gaussian field in m has the law of dW^V m),
the A-integral uses K quadrature nodes A_q ~ ρ*_A drawn once per path,
∫G W(dθ, ds) ≈ K^{-1/2} Σ_q P⊥ dW_q m_{A_q}. The drift is the Itô correction that keeps
|x_i| = 1 (docs: math/random_heads.md#the-common-noise-sde).

**Overlaps for small β** [derived]. At β = 0, m_A = x̄ and Itô's formula gives
dρ_ij = (|x̄|²/(d−1))(1 − ρ_ij)(d − 2 − ρ_ij) ds + martingale, so the mean overlap
m = |x̄|² = n^{-2}Σ⟨x_i, x_j⟩ of equiangular data follows the logistic ODE ṁ = m(1 − m) up to
O(1/d) (docs: math/random_heads.md#overlaps-and-the-logistic-law); β > 0 adds O(d²σ_A⁴β²).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_count, check_finite, check_scalar
from .base import AbstractCommonDiffusion, AbstractDynamics
from .sphere import unchecked_tangent_projection

__all__ = ["CommonNoiseSDE", "GaussianHeads", "RandomHeadsField", "RandomHeadsMeanField", "expected_head",
           "head_field"]


class GaussianHeads(eqx.Module):
    r"""The law ρ* of one head θ = (V, A = W W'ᵀ) (case (G); docs: math/random_heads.md#gaussian-heads).

    V = v_mean·I + σ_V Z with Z_ab ~ N(0, 1); W, W' of shape (d, k) with entries N(0, σ_A²).
    ``v_mean = 0`` is the Gaussian case (zero drift); ``v_mean != 0`` gives a non-zero
    mean field b (the ballistic part). Default σ_V = (d − 1)^{-1/2}, so σ² = σ_V²(d − 1) = 1.
    """

    d: int = eqx.field(static=True)
    k: int = eqx.field(static=True)
    beta: float
    sigma_V: float
    sigma_A: float
    v_mean: float

    def __init__(self, d: int, beta=1.0, *, k: int | None = None, sigma_V=None, sigma_A=1.0,
                 v_mean=0.0):
        self.d = check_count(d, "GaussianHeads d", minimum=2)
        self.k = self.d if k is None else check_count(k, "GaussianHeads k", minimum=1)
        beta = check_scalar(beta, "beta", nonnegative=True)
        sigma_V = (self.d - 1) ** -0.5 if sigma_V is None else sigma_V
        sigma_V = check_scalar(sigma_V, "sigma_V", positive=True)
        sigma_A = check_scalar(sigma_A, "sigma_A", nonnegative=True)
        v_mean = check_scalar(v_mean, "v_mean")
        self.beta, self.sigma_V, self.sigma_A, self.v_mean = (float(beta), float(sigma_V),
                                                               float(sigma_A), float(v_mean))

    @property
    def sigma2(self) -> float:
        """σ² = E|P⊥ξ|² per unit |m|² in case (G): σ_V²(d − 1)."""
        return self.sigma_V**2 * (self.d - 1)

    def sample(self, key, shape=(), dtype=None):
        """Draw heads: returns ``(V, W, Wp)`` with leading ``shape``."""
        dtype = dtype or jnp.result_type(float)
        kv, kw, kp = jax.random.split(key, 3)
        V = (self.v_mean * jnp.broadcast_to(jnp.eye(self.d, dtype=dtype), (*shape, self.d, self.d))
             + self.sigma_V * jax.random.normal(kv, (*shape, self.d, self.d), dtype))
        W = self.sigma_A * jax.random.normal(kw, (*shape, self.d, self.k), dtype)
        Wp = self.sigma_A * jax.random.normal(kp, (*shape, self.d, self.k), dtype)
        return V.astype(dtype), W.astype(dtype), Wp.astype(dtype)

    def mean_field(self, x, V, W, Wp):
        """``(1/H) Σ_h B_{θ_h}[μ_X](x_i)`` for heads stacked on a leading axis, shape (n, d)."""
        return jax.vmap(lambda v, w, wp: head_field(x, v, w, wp, self.beta))(V, W, Wp).mean(0)


def _attn_average(x, W, Wp, beta):
    """m_A(x_i) = Σ_j softmax_j(β⟨A x_i, x_j⟩) x_j with A = W W'ᵀ (never formed: (Wᵀx_j)·(W'ᵀx_i))."""
    logits = beta * (x @ Wp) @ (x @ W).T
    return jax.nn.softmax(logits, axis=-1) @ x


def head_field(x, V, W, Wp, beta):
    """``B_θ[μ_X](x_i)`` for one head θ = (V, W W'ᵀ), uniform weights; shape (n, d)."""
    return _attn_average(x, W, Wp, beta) @ V.T


def expected_head(key, heads: GaussianHeads, x, num_samples: int = 4096):
    """Monte Carlo mean field ``b(x_i) = E_θ B_θ[μ_X](x_i)`` and its standard error."""
    V, W, Wp = heads.sample(key, (num_samples,))
    B = jax.vmap(lambda v, w, wp: head_field(x, v, w, wp, heads.beta))(V, W, Wp)
    return B.mean(0), B.std(0) / np.sqrt(num_samples)




class RandomHeadsField(AbstractDynamics):
    r"""The random Transformer's layer field: fresh heads θ_h ~ ρ* at every layer
    (docs: math/random_heads.md#the-random-transformer-chain).

    At time t in layer l = (t − t0)/h the velocity is ``(1/H) Σ_h B_{θ_h}[μ](x_i)`` with the heads
    drawn from ``keys[l]``. ``tp.layers(tp.PostLN(field), x0, L, h)`` is the chain
    x ← N(x + (h/H) Σ_h B_{θ_h}(x)) (:func:`transformer_pde.solve.random_heads.chain`).
    Token weights are ignored (uniform measure).
    """

    heads: GaussianHeads
    keys: jax.Array
    step: jax.Array
    t0: jax.Array
    num_heads: int = eqx.field(static=True)

    @property
    def dim(self):
        return self.heads.d

    def vector_field(self, x, weights, t):
        layer = jnp.round((t - self.t0) / self.step).astype(jnp.int32)
        V, W, Wp = self.heads.sample(self.keys[layer], (self.num_heads,), x.dtype)
        return self.heads.mean_field(x, V, W, Wp)


class CommonNoiseSDE(AbstractCommonDiffusion):
    r"""The noise of the diffusive limit of the random Transformer (case (G),
    docs: math/random_heads.md#the-common-noise-sde), in the clock s:

    $$dx_i = -\tfrac{\sigma_V^2(d-1)}{2\sigma^2}\,\mathbb E_A|m_A(x_i)|^2\,x_i\,ds
    + P^\perp_{x_i}\,\frac{\sigma_V}{\sigma\sqrt K}\sum_q dB_q\,m_{A_q}(x_i),$$

    Itô, with K quadrature nodes A_q = W_q W_q'ᵀ drawn once per path from ρ*_A and a d×d matrix
    Brownian motion B_q per node: the noise is common to all tokens. Its :meth:`drift` is the
    first term; the ballistic field, zero in case (G), is :class:`RandomHeadsMeanField`.
    ``g = CommonNoiseSDE(heads, W, Wp); tp.solve(tp.PostLN(RandomHeadsMeanField(g)), x0,
    noise=tp.CommonNoise(g), key=key, solver=diffrax.Euler(), ...)`` is one path
    (:func:`transformer_pde.solvers.random_transformer.sde`).
    """

    heads: GaussianHeads
    W: jax.Array
    Wp: jax.Array

    def __init__(self, heads, W, Wp):
        if not isinstance(heads, GaussianHeads):
            raise ValueError(f"CommonNoiseSDE.heads must be a tp.GaussianHeads, got {type(heads).__name__}")
        W, Wp = (check_finite(as_float_array(a, f"CommonNoiseSDE.{m}"), f"CommonNoiseSDE.{m}")
                 for m, a in (("W", W), ("Wp", Wp)))
        for m, a in (("W", W), ("Wp", Wp)):
            if a.ndim != 3 or a.shape[1:] != (heads.d, heads.k) or a.shape != W.shape:
                raise ValueError(f"CommonNoiseSDE.{m} must have shape (K, {heads.d}, {heads.k}) (K nodes "
                                 f"A_q = W_q W'_qᵀ, d = {heads.d}, k = {heads.k}), the same for W and Wp; "
                                 f"got W {W.shape} and Wp {Wp.shape}")
            if a.shape[0] < 1:
                raise ValueError(f"CommonNoiseSDE.{m} must hold at least one node, got shape {a.shape}")
        self.heads, self.W, self.Wp = heads, W, Wp

    @property
    def num_nodes(self) -> int:
        return self.W.shape[0]

    def averages(self, x):  # (K, n, d)
        return jax.vmap(lambda w, wp: _attn_average(x, w, wp, self.heads.beta))(self.W, self.Wp)

    def brownian_shape(self, x):
        return jax.ShapeDtypeStruct((self.num_nodes, self.heads.d, self.heads.d), x.dtype)

    def drift(self, x, t):
        m = self.averages(x)
        h = self.heads
        # Itô correction: −(σ_V²(d−1)/(2σ²)) E_A|m_A|² x = −½ mean_q |m_q|² x
        return -0.5 * (h.sigma_V**2 * (h.d - 1) / h.sigma2) * jnp.mean(jnp.sum(m**2, -1), 0)[:, None] * x

    def diffusion(self, x, dW, t):  # dW: (K, d, d) -> (n, d)
        scale = self.heads.sigma_V / np.sqrt(self.heads.sigma2 * self.num_nodes)
        return unchecked_tangent_projection(x, scale * jnp.einsum("qab,qib->ia", dW, self.averages(x)))


class RandomHeadsMeanField(AbstractDynamics):
    r"""The ballistic field of the diffusive limit at the nodes A_q of a :class:`CommonNoiseSDE`: the
    heads' mean over V, b(x_i) = E_V B_θ = v_mean · (1/K) Σ_q m_{A_q}(x_i), zero in case (G)
    (v_mean = 0), where the dynamics is pure noise. Token weights are ignored."""

    nodes: CommonNoiseSDE

    def __check_init__(self):
        if not isinstance(self.nodes, CommonNoiseSDE):
            raise ValueError(f"RandomHeadsMeanField.nodes must be a tp.CommonNoiseSDE (its heads and nodes), got "
                             f"{type(self.nodes).__name__}")

    @property
    def dim(self):
        return self.nodes.heads.d

    def vector_field(self, x, weights, t):
        if self.nodes.heads.v_mean == 0:  # case (G): nothing to compute
            return jnp.zeros_like(x)
        return self.nodes.heads.v_mean * self.nodes.averages(x).mean(0)
