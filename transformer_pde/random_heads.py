r"""Random multi-head attention and its diffusive (common-noise) limit (sphere.md §5).

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
|x_i| = 1 (sphere.md §5: "The Itô correction keeps |x_i| = 1").

**Overlaps for small β** [derived]. At β = 0, m_A = x̄ and Itô's formula gives
dρ_ij = (|x̄|²/(d−1))(1 − ρ_ij)(d − 2 − ρ_ij) ds + martingale, so the mean overlap
m = |x̄|² = n^{-2}Σ⟨x_i, x_j⟩ of equiangular data follows the logistic ODE ṁ = m(1 − m) up to
O(1/d) (sphere.md §5, "Trade-offs"); β > 0 adds O(d²σ_A⁴β²).
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import check_scalar
from .solve import _Retracted
from .spaces import normalize, tangent_projection

__all__ = [
    "GaussianHeads",
    "chain",
    "diffusive_chain",
    "expected_head",
    "head_field",
    "logistic",
    "mean_overlap",
    "sde",
]


class GaussianHeads(eqx.Module):
    r"""The law ρ* of one head θ = (V, A = W W'ᵀ) (sphere.md §5, case (G)).

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
        if int(d) < 2:
            raise ValueError(f"GaussianHeads needs d >= 2, got d={d}")
        self.d = int(d)
        self.k = self.d if k is None else int(k)
        if self.k < 1:
            raise ValueError(f"GaussianHeads needs k >= 1, got k={k}")
        check_scalar(beta, "beta", nonnegative=True)
        sigma_V = (self.d - 1) ** -0.5 if sigma_V is None else sigma_V
        check_scalar(sigma_V, "sigma_V", positive=True)
        check_scalar(sigma_A, "sigma_A", nonnegative=True)
        check_scalar(v_mean, "v_mean")
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
        V = (self.v_mean * jnp.eye(self.d, dtype=dtype)
             + self.sigma_V * jax.random.normal(kv, (*shape, self.d, self.d), dtype))
        W = self.sigma_A * jax.random.normal(kw, (*shape, self.d, self.k), dtype)
        Wp = self.sigma_A * jax.random.normal(kp, (*shape, self.d, self.k), dtype)
        return V.astype(dtype), W.astype(dtype), Wp.astype(dtype)


def _attn_average(x, W, Wp, beta):
    """m_A(x_i) = Σ_j softmax_j(β⟨A x_i, x_j⟩) x_j with A = W W'ᵀ (never formed: (Wᵀx_j)·(W'ᵀx_i))."""
    logits = beta * (x @ Wp) @ (x @ W).T
    return jax.nn.softmax(logits, axis=-1) @ x


def head_field(x, V, W, Wp, beta):
    """B_θ[μ_X](x_i) for one head θ = (V, W W'ᵀ), uniform weights; shape (n, d)."""
    return _attn_average(x, W, Wp, beta) @ V.T


def expected_head(key, heads: GaussianHeads, x, num_samples: int = 4096):
    """Monte Carlo mean field b(x_i) = E_θ B_θ[μ_X](x_i) and its standard error."""
    V, W, Wp = heads.sample(key, (num_samples,))
    B = jax.vmap(lambda v, w, wp: head_field(x, v, w, wp, heads.beta))(V, W, Wp)
    return B.mean(0), B.std(0) / np.sqrt(num_samples)


def chain(key, heads: GaussianHeads, x0, num_layers: int, eta, num_heads: int = 1,
          save_every: int | None = None):
    r"""The random Transformer x ← N(x + (η/H) Σ_h B_{θ_h}(x)), fresh θ_h each layer.

    Returns the states after every ``save_every`` layers (default: only the last), with the
    input first, shape ``(num_saves, n, d)``.
    """
    num_layers, num_heads = int(num_layers), int(num_heads)
    save_every = num_layers if save_every is None else int(save_every)
    if num_layers < 1 or num_heads < 1 or num_layers % save_every:
        raise ValueError(f"need num_layers >= 1, num_heads >= 1 and save_every | num_layers; got "
                         f"{num_layers}, {num_heads}, {save_every}")
    return _chain(key, heads, jnp.asarray(x0), num_layers, jnp.asarray(eta, x0.dtype), num_heads,
                  save_every)


@eqx.filter_jit
def _chain(key, heads, x0, num_layers, eta, num_heads, save_every):
    def layer(x, k):
        V, W, Wp = heads.sample(k, (num_heads,), x.dtype)
        B = jax.vmap(lambda v, w, wp: head_field(x, v, w, wp, heads.beta))(V, W, Wp)
        return normalize(x + eta * B.mean(0)), None

    def block(x, ks):
        x, _ = jax.lax.scan(layer, x, ks)
        return x, x

    keys = jax.random.split(key, num_layers).reshape(num_layers // save_every, save_every)
    _, xs = jax.lax.scan(block, x0, keys)
    return jnp.concatenate([x0[None], xs.astype(x0.dtype)], 0)


def diffusive_chain(key, heads: GaussianHeads, x0, s1, num_layers: int, num_heads: int = 1,
                    save_every: int | None = None):
    """The chain in the diffusive clock: η = √(s1·H/(L σ²)), so L layers span s ∈ [0, s1]."""
    eta = float(np.sqrt(float(s1) * num_heads / (int(num_layers) * heads.sigma2)))
    return chain(key, heads, x0, num_layers, eta, num_heads, save_every)


class _UnitSphere(eqx.Module):
    """The retraction x ← x/|x| (for :class:`~transformer_pde.solve._Retracted`)."""

    def retract(self, y):
        return normalize(y)


def sde(key, heads: GaussianHeads, x0, s1, dt, *, num_nodes: int = 32, saveat=None):
    r"""One path of the diffusive limit (case (G)) with diffrax and a VirtualBrownianTree.

    Itô SDE in the diffusive clock s (module docstring), Euler–Maruyama with retraction onto
    the sphere after each step. The noise is common to all tokens: one d×d matrix Brownian
    motion per quadrature node A_q (``num_nodes`` nodes, drawn once per path from ρ*_A).
    ``saveat``: times in [0, s1] (default ``[s1]``). Returns states ``(T, n, d)``.
    """
    if heads.v_mean != 0:
        raise ValueError(f"the diffusive SDE is implemented for the Gaussian case v_mean = 0 (zero "
                         f"drift), got v_mean={heads.v_mean}")
    check_scalar(s1, "s1", positive=True)
    check_scalar(dt, "dt", positive=True)
    ts = jnp.asarray([s1] if saveat is None else saveat, dtype=jnp.asarray(x0).dtype)
    return _sde(key, heads, jnp.asarray(x0), jnp.asarray(s1, ts.dtype), jnp.asarray(dt, ts.dtype),
                int(num_nodes), ts, int(np.ceil(float(s1) / float(dt))) + 1)


@eqx.filter_jit
def _sde(key, heads, x0, s1, dt, num_nodes, ts, max_steps):
    kn, kb = jax.random.split(key)
    _, W, Wp = heads.sample(kn, (num_nodes,), x0.dtype)
    d = heads.d
    scale = heads.sigma_V / np.sqrt(heads.sigma2 * num_nodes)

    def averages(x):  # (K, n, d)
        return jax.vmap(lambda w, wp: _attn_average(x, w, wp, heads.beta))(W, Wp)

    def drift(s, x, args):
        m = averages(x)
        # Itô correction: −(σ_V²(d−1)/(2σ²)) E_A|m_A|² x = −½ mean_q |m_q|² x
        return -0.5 * (heads.sigma_V**2 * (d - 1) / heads.sigma2) * jnp.mean(
            jnp.sum(m**2, -1), 0)[:, None] * x

    def diffusion(s, x, args):
        m = averages(x)

        def apply(dW):  # dW: (K, d, d) -> (n, d)
            return tangent_projection(x, scale * jnp.einsum("qab,qib->ia", dW, m))

        struct = jax.ShapeDtypeStruct((num_nodes, d, d), x.dtype)
        import lineax as lx

        return lx.FunctionLinearOperator(apply, struct)

    bm = diffrax.VirtualBrownianTree(0.0, s1, tol=dt / 2, shape=(num_nodes, d, d), key=kb)
    terms = diffrax.MultiTerm(diffrax.ODETerm(drift), diffrax.ControlTerm(diffusion, bm))
    sol = diffrax.diffeqsolve(terms, _Retracted(diffrax.Euler(), _UnitSphere()), 0.0, s1, dt, x0,
                              saveat=diffrax.SaveAt(ts=ts, fn=lambda s, y, args: normalize(y)),
                              max_steps=max_steps)
    return sol.ys


def mean_overlap(x):
    """m = |x̄|² = n^{-2} Σ_{ij} ⟨x_i, x_j⟩ (last two axes are tokens × dimension)."""
    return jnp.sum(jnp.mean(x, axis=-2) ** 2, axis=-1)


def logistic(u0, s):
    """Solution of u' = u(1 − u), u(0) = u0: u0 e^s/(1 − u0 + u0 e^s)."""
    s = np.asarray(s, dtype=float)
    return u0 * np.exp(s) / (1 - u0 + u0 * np.exp(s))
