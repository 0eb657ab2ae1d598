r"""Normalization schemes of real Transformers, as dynamics (docs: math/sphere.md#normalization-schemes).

Every scheme is one residual layer written as **an Euler step of an ambient field F followed by a
retraction R**, exactly (to rounding):

$$x_{l+1} = R\big(x_l + h\,F(t_l, x_l)\big),\qquad t_l = t_0 + l h,$$

so ``tp.layers(scheme, x0, L, h)`` *is* the architecture, and the continuous-time limit is the
ODE ẋ = G(t, x) with G = dR_x[F]: G = F when R = id, G = P⊥_x F when R = N (x on the unit
sphere; dN_x[v] = P⊥_x v / |x|). ``tp.solve(scheme, x0, ...)`` integrates that limit with any
diffrax solver (schemes with R = N are retracted after every step, :class:`tp.Retracted`).

| scheme | layer | F(t, x) | R | limit (x = rθ) |
|---|---|---|---|---|
| :class:`~transformer_pde.PostLN` | x ← N(x + hA(x)) | A(x) | N | θ̇ = P⊥_θ A(θ), r ≡ 1 (GLPR) |
| :class:`PreLN` | x ← x + hA(N(x)) | A(N x) | id | ṙ = ⟨θ, A(θ)⟩, θ̇ = P⊥_θ A(θ)/r |
| :class:`PeriLN` | x ← x + hN(A(N(x))) | Â(θ) = N(A(θ)) | id | ṙ = ⟨θ, Â⟩, θ̇ = P⊥_θ Â / r |
| :class:`MixLN` | Post-LN (l < ⌊αL⌋), then Pre-LN | \|x\|A(θ), then A(N x) | N, then id | Post-LN, then Pre-LN |
| :class:`NGPT` | x ← N(x + αh(N(A(x)) − x)) | α(\|x\|Â(θ) − x) | N | θ̇ = α P⊥_θ Â(θ), r ≡ 1 |
| :class:`LNScaling` | x ← x + hA(N(x)/√ℓ), ℓ = l + 1 | A(c(t)N x), c = (1 + t/h0)^{-1/2} | id | none at fixed t |

Here A is any R^d dynamics (an attention, multi-head included, an :class:`~transformer_pde.MLP`,
...), **evaluated on the configuration it is given**: A(N(x)) normalizes the queries *and* the
keys and values. The limits of Pre-LN, Peri-LN and nGPT (docs: math/sphere.md#normalization-schemes) were derived
from the layer maps and checked: each (F, R) pair
reproduces its layer to ≤ 4e-15, the polar ODEs agree with the ambient ones to 1e-13, and the
layers converge to the limits with order 1.00 ± 0.02 (three test cases, h = 2^-3 … 2^-9).
The speeds |θ̇| = |P⊥A|/r (Pre-LN), |P⊥Â|/r (Peri-LN), α|P⊥Â| (nGPT) are the "speed regulation"
of Karagodin–Ge–Polyanskiy–Rigollet (arXiv 2510.22026).

**Normalization, scale and gains** (:class:`Norm`). N(x) = s·g⊙x/|x|, default s = 1 and no gain
(the unit sphere of the sphere papers and of Karagodin et al.). Real models use RMSNorm
γ⊙x/rms(x) = γ⊙√d·x/|x| (LLaMA, and the Pre-LN, Peri-LN, Mix-LN and LN-scaling codes, which
are LLaMA-based) or LayerNorm (GPT-2; with mean subtraction, not modelled), both with a learnable
gain; nGPT's ``justnorm`` is x/|x| with no gain (its learnable scalings are the eigen learning
rates α and s_qk instead). For a bilinear-score attention the scale and an *input* gain are not
new parameters (docs: math/sphere.md#normalization-schemes, checked to 4e-16): A_{β,V}(sθ) = s·A_{βs²,V}(θ) and
A_{Q,K,V}(g⊙θ) = A_{QG,KG,VG}(θ), G = diag(g), so in units of s a scheme with scale s is the s = 1
scheme with β → s²β (β = 1/√d_k with s = √d is the unit-sphere β = d/√d_k). The only gain that is
not absorbed is Peri-LN's outer one.

**Which step.** tp.layers(scheme, x0, L, h): one layer per step h; the layer index is
l = (t − t0)/h. The limit is integrated by ``tp.solve`` (any solver, adaptive steps included).
Post-LN's field is the 1-homogeneous extension |x|A(x/|x|), so ``tp.solve`` of ``PostLN`` with any
solver integrates its limit, the projected flow of :class:`~transformer_pde.Sphere`, to the
solver's order.

Mix-LN switches the retraction at the switch time τ: the retraction of a step depends on the
step (:class:`~transformer_pde.AbstractRetractedDynamics`), and :class:`MixLN` is one dynamics
(:class:`~transformer_pde.Switched` composes any two).
"""

from __future__ import annotations

import math
from fractions import Fraction

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import (as_float_array, check_count, check_finite, check_points, check_scalar, cover_finiteness,
                       has_unit_rows, is_concrete, is_covered, mark_unit_rows, runtime_check)
from .._types import Points
from ..params import scalar_param
from .base import AbstractDynamics, AbstractManifoldDynamics, AbstractRetractedDynamics
from .sphere import PostLN, check_unit_points, normalize, unchecked_normalize, unchecked_tangent_projection
from .switched import AbstractSwitched, check_switch_time

__all__ = ["LNScaling", "MixLN", "NGPT", "AbstractNormalizationScheme", "Norm", "PeriLN", "PreLN",
           "num_post_layers", "polar", "polar_velocity"]


class Norm(eqx.Module):
    r"""The normalization N(x) = s · g ⊙ x/|x|, row by row.

    Args:
        scale: s > 0 (default 1: the unit sphere). RMSNorm is s = √d: :meth:`rms`.
        gain: optional per-coordinate gain g, shape ``(d,)`` (RMSNorm's γ); None means g = 1.

    A zero token has no direction: N(0) is NaN (the schemes' ``check_state`` rejects zero tokens).
    """

    scale: jax.Array
    gain: Float[Array, " d"] | None

    def __init__(self, scale=1.0, gain=None):
        scale = check_scalar(scale, "Norm.scale", positive=True)
        self.scale = scalar_param(scale)
        if gain is not None:
            gain = check_finite(as_float_array(gain, "Norm.gain"), "Norm.gain")
            if gain.ndim != 1:
                raise ValueError(f"Norm.gain must have shape (d,), got shape {gain.shape}")
        self.gain = gain

    @classmethod
    def rms(cls, d, gain=None) -> Norm:
        """RMSNorm without mean subtraction: x/rms(x) = √d · x/|x| (times ``gain``)."""
        if int(d) < 1:
            raise ValueError(f"Norm.rms needs d >= 1, got d={d}")
        return cls(math.sqrt(int(d)), gain)

    @property
    def dim(self) -> int | None:
        return None if self.gain is None else int(self.gain.shape[0])

    def __call__(self, x: Points) -> Points:
        y = self.scale * unchecked_normalize(x)
        return y if self.gain is None else y * _rowwise(self.gain, x)


def _rowwise(v, x):
    """A scalar or a per-coordinate vector ``(d,)`` shaped to multiply the rows of ``x``."""
    v = v.astype(x.dtype)
    return v if v.ndim == 0 else v.reshape((1,) * (x.ndim - 1) + v.shape)


def _check_norm(norm, owner: str, field: str, dim) -> Norm:
    norm = Norm() if norm is None else norm
    if not isinstance(norm, Norm):
        raise ValueError(f"{owner}.{field} must be a tp.Norm, got {type(norm).__name__}")
    if dim is not None and norm.dim is not None and norm.dim != dim:
        raise ValueError(f"{owner}.{field}.gain has shape ({norm.dim},) but the dynamics act on d={dim}")
    return norm


def check_nonzero_points(x, name: str, dim):
    """Tokens ``(n, d)`` with no zero row (their direction x/|x| must exist); any radius. The norm
    is the one the schemes divide by (|x| in the tokens' dtype: a row so small that its squares
    underflow is zero too). ValueError naming the row, ``eqx.error_if`` under jit unless the
    tokens are a normalization's output (``mark_unit_rows``: nonzero by construction)."""
    unit = has_unit_rows(x)
    x = check_points(x, name, dim)
    if unit and not is_concrete(x):
        return mark_unit_rows(x)
    norms = jnp.linalg.norm(x, axis=-1)
    why = "a normalization scheme needs its direction x/|x|"
    if is_concrete(x):
        norms = np.asarray(norms)
        if (norms == 0).any():
            i = int(np.argmin(norms))
            raise ValueError(f"{name}[{i}] is the zero vector (|x| = 0 in {x.dtype}): {why}")
        return x
    out = runtime_check(x, jnp.any(norms == 0), f"{name} holds a zero vector (|x| = 0 in {x.dtype}): {why}")
    if is_covered(x):  # the same values: their finiteness is still reported
        cover_finiteness([out])
    return out


class AbstractNormalizationScheme(AbstractDynamics):
    """A residual layer with a normalization, wrapping an R^d dynamics (attention, MLP, ...).

    Subclasses are the layers (docs: math/sphere.md#normalization-schemes) as (F, R) pairs (module docstring).
    Schemes whose tokens live on the unit sphere (R = N) are also :class:`AbstractManifoldDynamics`; the others
    keep the residual stream x ∈ R^d \\ {0}, whose radius |x| evolves (:func:`polar`).
    """

    dynamics: eqx.AbstractVar[AbstractDynamics]

    def __check_init__(self):
        name = type(self).__name__
        if not isinstance(self.dynamics, AbstractDynamics):
            raise ValueError(f"{name} wraps an R^d dynamics such as SoftmaxAttention, "
                             f"MultiHeadAttention or MLP, got {type(self.dynamics).__name__}")
        if isinstance(self.dynamics, (AbstractRetractedDynamics, AbstractNormalizationScheme)):
            raise ValueError(f"{name} wraps an R^d dynamics such as SoftmaxAttention, got "
                             f"{type(self.dynamics).__name__}, which already normalizes its tokens")

    @property
    def dim(self):
        return self.dynamics.dim

    def check_state(self, x, name: str = "x"):
        if isinstance(self, AbstractManifoldDynamics):
            return check_unit_points(x, name, self.dim)
        return check_nonzero_points(x, name, self.dim)


class PreLN(AbstractNormalizationScheme):
    r"""Pre-LN (GPT-2, LLaMA): x ← x + h A(N(x)) (docs: math/sphere.md#normalization-schemes).

    (F, R) = (A(N x), id): the layer *is* explicit Euler of ẋ = A(N(x)), so ``tp.layers`` with
    step h is the architecture and ``tp.solve`` integrates its limit. In polar form x = rθ
    (exact identities, no limit needed; derived for the library and checked):

    $$\dot r=\langle\theta,A(\theta)\rangle,\qquad \dot\theta=P^\perp_\theta A(\theta)/r,$$

    and one layer is exactly θ⁺ = N(θ + (h/r)A(θ)), r⁺ = r|θ + (h/r)A(θ)|: in θ, a Post-LN layer
    with the per-token step h/r. Tokens leave the sphere; with softmax attention and V = I,
    ⟨θ, A⟩ → 1 in a cluster, so r grows like t and θ moves on the clock log t ("curse of depth").
    The state is x (any nonzero tokens); :func:`polar` gives (r, θ). (The public simuformer code
    updates r with a coordinate sum Σ_k (rA)_k instead of ⟨θ, A⟩: not this model.)

    Args:
        dynamics: any R^d dynamics (attention, multi-head, MLP).
        norm: the input normalization (:class:`Norm`, default x/|x|).
    """

    dynamics: AbstractDynamics
    norm: Norm

    def __init__(self, dynamics, *, norm=None):
        self.dynamics = dynamics
        dim = dynamics.dim if isinstance(dynamics, AbstractDynamics) else None
        self.norm = _check_norm(norm, "PreLN", "norm", dim)

    def vector_field(self, x, weights, t):
        return self.dynamics.vector_field(self.norm(x), weights, t)


class PeriLN(AbstractNormalizationScheme):
    r"""Peri-LN (Kim et al., arXiv 2502.02732; Gemma's "sandwich" norm): x ← x + h N(A(N(x))).

    (F, R) = (N_out(A(N_in x)), id), so the layer is explicit Euler of ẋ = Â(θ), Â = N(A(θ)). In
    polar form (derived for the library and checked; docs: math/sphere.md#normalization-schemes):

    $$\dot r=\langle\theta,\hat A\rangle,\qquad \dot\theta=P^\perp_\theta\hat A/r,$$

    so |ṙ| ≤ 1 and |θ̇| ≤ 1/r (with unit norms). The field is singular where A(θ)_i = 0 (e.g. an
    antipodal pair at β = 0 with V = I).

    Args:
        dynamics: any R^d dynamics.
        norm: the input normalization (default x/|x|).
        out_norm: the output normalization (default x/|x|); its gain is the only normalization gain
            that cannot be absorbed into Q, K, V (module docstring).
    """

    dynamics: AbstractDynamics
    norm: Norm
    out_norm: Norm

    def __init__(self, dynamics, *, norm=None,
                 out_norm=None):
        self.dynamics = dynamics
        dim = dynamics.dim if isinstance(dynamics, AbstractDynamics) else None
        self.norm = _check_norm(norm, "PeriLN", "norm", dim)
        self.out_norm = _check_norm(out_norm, "PeriLN", "out_norm", dim)

    def vector_field(self, x, weights, t):
        return self.out_norm(self.dynamics.vector_field(self.norm(x), weights, t))


def _check_positive(value, name: str):
    """A positive scalar, or a positive vector; stored as a JAX array."""
    if jnp.ndim(value) == 0:
        value = check_scalar(value, name, positive=True)
        return scalar_param(value)
    arr = check_finite(as_float_array(value, name), name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a scalar or a vector of shape (d,), got shape {arr.shape}")
    if is_concrete(arr) and (np.asarray(arr) <= 0).any():
        i = int(np.argmax(np.asarray(arr) <= 0))
        raise ValueError(f"{name} must be > 0, but {name}[{i}] = {float(arr[i])}")
    return arr


class NGPT(AbstractNormalizationScheme, AbstractManifoldDynamics):
    r"""nGPT (Loshchilov et al., arXiv 2410.01131): x ← N(x + α_h (N(A(x)) − x)), α_h = αh.

    Tokens stay on the unit sphere (nGPT's ``justnorm``: x/|x|, no scale, no gain). The layer of
    the NVIDIA/ngpt code is ``h ← N(h + |α_A| ⊙ (N(h_A) − h))`` with a learned per-coordinate
    α_A (initial effective value 0.05); Karagodin et al. use a scalar α. Both are accepted. The
    attention there is cosine attention with the scaling s_qk: pass such an attention as
    ``dynamics`` if wanted (not modelled separately here).

    (F, R) = (α(|x| Â(θ) − x), N), θ = x/|x|, Â = N(A(θ)). On the sphere F = α(Â − x), so Euler
    + N is the layer exactly; off the sphere F is the 1-homogeneous extension |x|·F(θ), for which
    the direction of the ODE ẋ = F follows the limit exactly, θ̇ = P⊥_θ F(θ). Hence ``tp.solve``
    with any solver (and the retraction) integrates the limit (derived for the library and checked;
    docs: math/sphere.md#normalization-schemes):

    $$\dot\theta=\alpha\,P^\perp_\theta\hat A(\theta)\qquad(\text{per-coordinate }\alpha:\ 
    \dot\theta=P^\perp_\theta\big(\alpha\odot(\hat A-\theta)\big)),$$

    speed α sin∠(θ, A) ≤ α whatever |A| is. For α_h < 1 the layer is also exactly
    N(x + (α_h/(1 − α_h)) Â): a post-LN step of the unit field Â (checked to 1e-16). It needs
    α_h = αh ≤ 1 to be an interpolation between x and Â; ``tp.layers`` cannot check h, so choose
    it so.

    Args:
        dynamics: any R^d dynamics.
        alpha: the eigen learning rate α > 0: a scalar, or per-coordinate, shape ``(d,)``.
    """

    dynamics: AbstractDynamics
    alpha: jax.Array

    def __init__(self, dynamics, alpha=1.0):
        self.dynamics = dynamics
        self.alpha = _check_positive(alpha, "NGPT.alpha")
        dim = dynamics.dim if isinstance(dynamics, AbstractDynamics) else None
        if jnp.ndim(self.alpha) == 1 and dim is not None and self.alpha.shape[0] != dim:
            raise ValueError(f"NGPT.alpha has shape {self.alpha.shape} but the dynamics act on d={dim}")

    def vector_field(self, x, weights, t):
        r = jnp.linalg.norm(x, axis=-1, keepdims=True)
        a_hat = unchecked_normalize(self.dynamics.vector_field(x / r, weights, t))
        return _rowwise(self.alpha, x) * (r * a_hat - x)

    def retract(self, x):
        return unchecked_normalize(x)


class LNScaling(AbstractNormalizationScheme):
    r"""LayerNorm Scaling (Sun et al., "The Curse of Depth", arXiv 2502.05795):

    x ← x + h A(N(x)/√ℓ),  ℓ = l + 1 (the first layer is unscaled).

    As the official code ``lmsdss/LayerNorm-Scaling`` defines it
    (docs: math/sphere.md#normalization-schemes): the normalized input of the sublayer is divided by √(layer_index + 1), layer_index 0-based; it feeds Q, K and
    V, so for a bilinear softmax attention the layer is x + (h/√ℓ) A_{β/ℓ}(θ): step 1/√ℓ *and*
    temperature β/ℓ. (This is the paper's definition, read in its code.)

    (F, R) = (A(c(t) N(x)), id) with c(t) = (1 + t/h0)^{-1/2}, the layer index being l = t/h0:
    with ``tp.layers(LNScaling(A, h0), x0, L, h0)`` (t0 = 0) layer l has
    c = 1/√(l + 1) exactly, so the architecture of depth step h0 is explicit Euler of this
    non-autonomous field. **There is no h → 0 limit at fixed t**: with ℓ = t/h + 1 the total
    displacement Σ h/√ℓ ≈ 2√(ht) → 0, the flow freezes (measured |x_L − x_0| ∝ h^0.54); on the
    clock τ = Σ h/√ℓ the layers tend to Pre-LN at β = 0 (uniform attention, order 0.97). So
    ``tp.solve`` integrates the *fixed-h0* interpolation of one architecture, not a limit; the
    architecture is O(h0) away from it (Euler refinement of it has order 1.01). The speed-only
    model attributed to Karagodin et al. (θ̇ = P⊥A(θ)/√(1 + t), ṙ = 0; secondary source) is a
    different model, not implemented.

    Args:
        dynamics: any R^d dynamics.
        depth_scale: h0 > 0, the layer step of the architecture (ℓ = 1 + t/h0).
        norm: the input normalization before the 1/√ℓ factor (default x/|x|).
    """

    dynamics: AbstractDynamics
    depth_scale: jax.Array
    norm: Norm

    def __init__(self, dynamics, depth_scale, *, norm=None):
        self.dynamics = dynamics
        depth_scale = check_scalar(depth_scale, "LNScaling.depth_scale", positive=True)
        self.depth_scale = scalar_param(depth_scale)
        dim = dynamics.dim if isinstance(dynamics, AbstractDynamics) else None
        self.norm = _check_norm(norm, "LNScaling", "norm", dim)

    def check_time(self, t, name: str = "t"):
        """Times from the first layer on: the layer index ℓ = 1 + t/h0 must be positive (c(t) =
        1/√ℓ is NaN or inf before it)."""
        t = check_scalar(t, name)
        why = f"the layer scale 1/√ℓ needs ℓ = 1 + {name}/depth_scale > 0"
        if is_concrete(t) and is_concrete(self.depth_scale):
            h0 = float(self.depth_scale)
            if not 1 + float(t) / h0 > 0:
                raise ValueError(f"LNScaling: {name} = {float(t):g} is before the first layer: {why}, i.e. "
                                 f"{name} > -depth_scale = {-h0:g}")
            return t
        t = jnp.asarray(t)
        return runtime_check(t, ~(1 + t / self.depth_scale > 0), f"LNScaling: {name} is before the first layer: {why}")

    def layer_scale(self, t):
        """c(t) = (1 + t/h0)^{-1/2} = 1/√ℓ at t = (ℓ − 1) h0."""
        return jax.lax.rsqrt(1 + t / self.depth_scale)

    def vector_field(self, x, weights, t):
        c = self.layer_scale(t).astype(x.dtype)
        return self.dynamics.vector_field(c * self.norm(x), weights, t)


def _check_post_fraction(alpha) -> float:
    check_scalar(alpha, "alpha")
    if not 0 < float(alpha) <= 1:
        raise ValueError(f"MixLN alpha (the Post-LN fraction of the layers) must lie in (0, 1], got "
                         f"{float(alpha)}")
    return float(alpha)


def num_post_layers(alpha, num_layers) -> int:
    """⌊αL⌋, Mix-LN's number of Post-LN layers (α read as the decimal it was written as, so
    α = 0.29, L = 100 gives 29, not 28)."""
    alpha = _check_post_fraction(alpha)
    num_layers = check_count(num_layers, "num_layers", minimum=1)
    return math.floor(Fraction(repr(float(alpha))) * num_layers)


class MixLN(AbstractSwitched, AbstractNormalizationScheme):
    r"""Mix-LN (Li, Yin, Liu, arXiv 2412.13795): Post-LN layers up to the switch, Pre-LN after.

    One dynamics (:class:`~transformer_pde.models.switched.AbstractSwitched`): on t ≤ τ it is
    :class:`~transformer_pde.PostLN` (F = |x|A(x/|x|), R = N), on t > τ :class:`PreLN`
    (F = A(N x), R = id); both fields are A(x) on the sphere, so only the retraction switches, and
    after the last Post-LN layer r = 1 (docs: math/sphere.md#normalization-schemes). Hence

    * ``tp.layers(tp.MixLN.from_layers(A, L, h, alpha), x0, L, h)`` is the architecture: ⌊αL⌋
      layers x ← N(x + hA(x)), then x ← x + hA(N(x)) (the public code ``nikitus20/mixln`` uses
      ⌊αL⌋ = 3 of 12 and 6 of 24 layers, α = 1/4);
    * ``tp.solve(tp.MixLN(A, tau), x0, t1=T, ...)`` with any solver integrates its limit, the
      projected flow θ̇ = P⊥_θ A(θ) on [t0, τ] then ẋ = A(N x) from r = 1 (steps land on τ).

    The switch of the layers is at t_m = t0 + ⌊αL⌋h, |t_m − (t0 + αT)| < h: the layers converge
    with order 1 to the limit switched at t0 + αT when αL is an integer, and with O(h) errors whose
    ratios oscillate otherwise (docs: math/sphere.md#normalization-schemes); compare layer by layer with τ = t_m.

    Args:
        dynamics: any R^d dynamics.
        switch_time: τ, the (absolute) time of the switch; :meth:`from_layers` and
            :meth:`from_fraction` compute it from α.
    """

    dynamics: AbstractDynamics
    switch_time: float = eqx.field(static=True)

    def __init__(self, dynamics, switch_time):
        self.dynamics = dynamics
        self.switch_time = check_switch_time(switch_time, "MixLN")

    @classmethod
    def from_layers(cls, dynamics, num_layers, step, alpha=0.25, t0=0.0) -> MixLN:
        """The architecture of ``num_layers`` layers of step h from t0: τ = t0 + ⌊αL⌋h."""
        check_scalar(step, "step", positive=True)
        return cls(dynamics, float(t0) + num_post_layers(alpha, num_layers) * float(step))

    @classmethod
    def from_fraction(cls, dynamics, t1, alpha=0.25, t0=0.0) -> MixLN:
        """The limit on [t0, t1] switched at τ = t0 + α(t1 − t0)."""
        return cls(dynamics, float(t0) + _check_post_fraction(alpha) * (float(t1) - float(t0)))

    @property
    def before(self) -> PostLN:
        """The Post-LN part: x ← N(x + hA(x))."""
        return PostLN(self.dynamics)

    @property
    def after(self) -> PreLN:
        """The Pre-LN part: x ← x + hA(N(x))."""
        return PreLN(self.dynamics)


def polar(x: Points) -> tuple[Float[Array, " n"], Points]:
    """(r, θ) with x = rθ: the radius |x_i| and direction x_i/|x_i| of every token (``x`` of shape
    ``(n, d)``, finite, no zero row: ValueError naming x; ``eqx.error_if`` under jit)."""
    x = check_points(x, "x")
    return jnp.linalg.norm(x, axis=-1), normalize(x)


def polar_velocity(dynamics: AbstractDynamics, x: Points, weights=None, t=0.0):
    """(ṙ, θ̇) of the ODE ẋ = F(t, x) in polar form: ṙ = ⟨θ, F⟩, θ̇ = P⊥_θ F / r (exact).

    For :class:`PreLN` this is ṙ = ⟨θ, A(θ)⟩, θ̇ = P⊥_θ A(θ)/r; for :class:`PeriLN` the same with
    Â = A/|A| (docs: math/sphere.md#normalization-schemes). Only for dynamics on R^d
    (a retracted dynamics has ṙ = 0).
    """
    if not isinstance(dynamics, AbstractDynamics):
        raise ValueError(f"dynamics must be a dynamics on R^d such as tp.PreLN(attn), got {type(dynamics).__name__}")
    t = dynamics.check_time(t)
    if isinstance(dynamics, AbstractRetractedDynamics):
        raise ValueError(f"polar_velocity is for dynamics on R^d; {type(dynamics).__name__} is "
                         "retracted after its steps (its radius does not follow ẋ = F)")
    x = dynamics.check_state(x)
    v = dynamics.velocity(x, weights, t)
    r, theta = polar(x)
    return jnp.sum(theta * v, axis=-1), unchecked_tangent_projection(theta, v) / r[:, None]
