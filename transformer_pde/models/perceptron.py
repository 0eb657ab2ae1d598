r"""The perceptron (feed-forward) block on the sphere and its energy
(docs: math/sphere.md#perceptron-block-and-interpolation, Perc).

Attention (USA normalization) plus a one-hidden-layer perceptron in the gradient case
ω_j = ω_j a_j:

$$\dot x_i=s\,P^\perp_{x_i}\Big(\frac1n\sum_j e^{\beta\langle x_i,x_j\rangle}x_j
+\sum_{j=1}^J\omega_j\,\sigma(a_j\cdot x_i)\,a_j\Big),$$

which is s·∇(δE/δμ), the Wasserstein gradient flow (s = +1 ascent, the residual Transformer;
s = −1 descent, towards the global minimizer) of

$$E_{\beta,\vartheta}[\mu]=\frac1{2\beta}\iint e^{\beta\langle x,y\rangle}d\mu\,d\mu+\frac12\int v_\vartheta\,d\mu,
\qquad v_\vartheta(x)=\sum_j\omega_j\varphi(a_j\cdot x),\ \varphi'=2\sigma.$$

Indeed δE/δμ = β^{-1}∫e^{β⟨x,y⟩}dμ + ½v and ½∇v = Σ_j ω_j σ(a_j·x) a_j. Along the flow
dE/dt = s∫|velocity|² dμ (a test). Critical points satisfy
∫e^{β x·y}P⊥_x y dμ + P⊥_x Σ_j ω_j σ(a_j·x) a_j = 0 on supp μ. For σ = ReLU (φ(s) = s_+²,
not real-analytic) stationary measures are σ_d-null, and in d = 2 finitely atomic (Perc).

The activation σ is a value (:class:`ReLU`, :class:`Softplus`); one whose potential φ has a closed
form is an :class:`AbstractPotentialActivation`, and only then does the energy have one
(:func:`transformer_pde.diagnostics.perceptron_energy`).
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import as_float_array, check_real, check_scalar
from ..kernels import exp_kernel_sum
from ..kernels.exact import unchecked_log_weights
from ..params import scalar_param
from .base import AbstractManifoldDynamics
from .sphere import unchecked_normalize, unchecked_tangent_projection

__all__ = ["AbstractActivation", "AbstractPotentialActivation", "PerceptronBlock", "ReLU", "Softplus"]


class AbstractActivation(eqx.Module):
    """The hidden layer's activation σ, applied elementwise: ``activation(s)``."""

    @abc.abstractmethod
    def __call__(self, s):
        ...


class AbstractPotentialActivation(AbstractActivation):
    """An activation whose potential φ (φ' = 2σ, so ½∇v_ϑ is the perceptron's field) has a closed
    form: the capability the block's energy E_{β,ϑ} needs."""

    @abc.abstractmethod
    def potential(self, s):
        ...


class ReLU(AbstractPotentialActivation):
    """σ(s) = s_+, φ(s) = s_+² (not real-analytic: finitely atomic critical points in d = 2)."""

    def __call__(self, s):
        return jax.nn.relu(s)

    def potential(self, s):
        return jnp.maximum(s, 0.0) ** 2


class Softplus(AbstractActivation):
    """σ(s) = log(1 + e^s), real-analytic; its potential has no elementary closed form (no energy)."""

    def __call__(self, s):
        return jax.nn.softplus(s)


class PerceptronBlock(AbstractManifoldDynamics):
    r"""USA attention plus a perceptron block, on the sphere (tangent projection included).

    Args:
        beta: inverse temperature.
        a: hidden-layer directions, shape ``(J, d)``.
        omega: output weights, shape ``(J,)`` (gradient case: the output vectors are ω_j a_j).
        sign: +1 for the Transformer (gradient ascent of E), −1 for gradient descent.
        activation: σ, an :class:`AbstractActivation`: :class:`ReLU` (default; φ(s) = s_+²) or
            :class:`Softplus` (real-analytic; no closed-form energy).

    This is already a sphere dynamics: do not wrap it in ``tp.Sphere``; ``retract`` normalizes.
    """

    beta: jax.Array
    a: jax.Array
    omega: jax.Array
    sign: float = eqx.field(static=True)
    activation: AbstractActivation

    def __init__(self, beta, a, omega, *, sign: float = 1.0, activation=None):
        beta = check_scalar(beta, "PerceptronBlock.beta", nonnegative=True)
        a = check_real(jnp.asarray(as_float_array(a, "PerceptronBlock.a"), dtype=jnp.result_type(float)),
                       "PerceptronBlock.a")
        omega = check_real(jnp.asarray(as_float_array(omega, "PerceptronBlock.omega"), dtype=jnp.result_type(float)),
                           "PerceptronBlock.omega")
        if a.ndim != 2 or omega.shape != (a.shape[0],):
            raise ValueError(f"PerceptronBlock: a must be (J, d) and omega (J,), got a {a.shape} and "
                             f"omega {omega.shape}")
        if sign not in (1, -1, 1.0, -1.0):
            raise ValueError(f"sign must be +1 (ascent) or -1 (descent), got {sign!r}")
        activation = ReLU() if activation is None else activation
        if not isinstance(activation, AbstractActivation):
            raise ValueError(f"activation must be an AbstractActivation such as ReLU() or Softplus(), got "
                             f"{activation!r}")
        self.beta = scalar_param(beta)
        self.a, self.omega = a, omega
        self.sign = float(sign)
        self.activation = activation

    @property
    def dim(self):
        return int(self.a.shape[1])

    def retract(self, x):
        return unchecked_normalize(x)

    def raw_field(self, x, weights):
        """∫ e^{β⟨x_i,y⟩} y dμ + Σ_j ω_j σ(a_j·x_i) a_j (before projection)."""
        attn = exp_kernel_sum(self.beta * x, x, x, unchecked_log_weights(weights))
        mlp = (self.activation(x @ self.a.T) * self.omega[None, :]) @ self.a
        return attn + mlp

    def vector_field(self, x, weights, t):
        return self.sign * unchecked_tangent_projection(x, self.raw_field(x, weights))
