r"""Fast O(n + M log M) softmax reduction for low-dimensional scores (k <= 3), on jax-finufft.

Same contract as :func:`transformer_pde.kernels.exact.lse_average` (non-causal only), for
logits of the form $s_{ij}=\gamma\langle a_i,b_j\rangle+\mathrm{bias}_j$ with
$a_i,b_j\in\mathbb R^k$, $k\le 3$, $\gamma>0$:

$$\bar v_i=\sum_j\mathrm{softmax}_j(s_{ij})\,v_j,\qquad \ell_i=\log\sum_je^{s_{ij}}.$$

Softmax attention with $Q,K\in\mathbb R^{k\times d}$ is $a=Qx$, $b=Ky$, $\gamma=\beta$;
$\ell^2$ attention is $\gamma=2\beta$ with $-\beta|b_j|^2$ already in the bias
(docs: math/attention.md#l2-attention).

**Gaussian form** (docs: math/fast_kernels.md#attention-as-a-gaussian-sum, issue 13). From
$e^{\gamma\langle a,b\rangle}=e^{\gamma|a|^2/2}e^{\gamma|b|^2/2}e^{-\gamma|a-b|^2/2}$, with
$\log u_j=\mathrm{bias}_j+\gamma|b_j|^2/2$, $c=\max_j\log u_j$, $\tilde u_j=e^{\log u_j-c}\in[0,1]$,
$G(z)=e^{-\gamma|z|^2/2}$:

$$D_i=\sum_j\tilde u_jG(a_i-b_j),\quad N_i=\sum_j\tilde u_jG(a_i-b_j)(v_j-\bar c),\quad
\bar v_i=\bar c+N_i/D_i,\quad \ell_i=\tfrac\gamma2|a_i|^2+c+\log D_i,$$

where $\bar c$ is the mid-range of the values (the average is shift-equivariant; centring makes
the numerator's error scale with the half-range $V=\max_{j,e}|v_{je}-\bar c_e|$ of the values, not
their size). The general identity is used, never the sphere shortcut
$e^{\beta\langle x,y\rangle}=e^\beta e^{-\beta|x-y|^2/2}$, which is wrong off the sphere (and whose
gradient in $x$ differs by the normal component $-\beta x$ even on it).

**Fourier series of G.** If $|a_i|_\infty,|b_j|_\infty\le R$ every difference lies in
$[-2R,2R]^k$. Take a period $P>2R$ and the periodization $G_P(z)=\sum_{m\in\mathbb Z^k}G(z+Pm)$;
by Poisson summation, with $\omega_\ell=2\pi\ell/P$ and $\hat g(\omega)=\sqrt{2\pi/\gamma}\,
e^{-\omega^2/(2\gamma)}$,

$$G_P(z)=\prod_{d=1}^k\frac1P\sum_{\ell\in\mathbb Z}\hat g(\omega_\ell)e^{i\omega_\ell z_d},$$

and $G_{P,N}$ keeps the $N=2h+1$ modes $|\ell|\le h$ per dimension. Then
$\sum_j\tilde u_j(1,v_j-\bar c)G_{P,N}(a_i-b_j)$ is a type-1 NUFFT of the strengths
$\tilde u_j(1,(v_j-\bar c)/V)$ at the points $2\pi b_j/P$ (sources to $N^k$ modes), a multiply by
$\prod_d\hat g(\omega_{\ell_d})/P$, and a type-2 NUFFT back to the points $2\pi a_i/P$. Since
$G_{P,N}$ is real, the $1+e$ real channels travel in pairs as complex strengths $p+iq$ (one
stacked transform of $\lceil(1+e)/2\rceil$ channels): $O((n+m)w^k+M\log M)$ per channel with
$M\approx(2N)^k$ the upsampled grid and $w$ the spreading width, instead of the exact kernel's
$O(nmk)$.

**Choice of the period (checked against issue 13).** Aliasing only needs the nearest *image*
of the kernel, at distance $P-|z|\ge P-2R$, to be negligible: $P=2R+h_\mathrm{alias}$ with
$h_\mathrm{alias}\approx\sqrt{2\log(1/\mathrm{tol})/\gamma}$, i.e. a half-period
$R+h_\mathrm{alias}/2$. The issue's half-period $2R+\sqrt{2\log(1/\mathrm{tol})/\gamma}$ (box
covering every difference plus the reach) is also valid but twice as large, hence $2^k$ times more
modes for the same accuracy; the aliasing bound below is what the error requires.

**A-priori bound.** Per dimension, for $|t|\le 2R$ (with $h=P-2R$):

* aliasing $0\le g_P(t)-g(t)\le\varepsilon_A=2e^{-\gamma h^2/2}/(1-e^{-\gamma hP})$
  (each side's images are at distances $\ge h+jP$, $j\ge 0$);
* truncation $|g_{P,N}-g_P|\le\varepsilon_T=\frac2P\sum_{\ell>h}\hat g(\omega_\ell)$
  (summed numerically; $\approx$ the first omitted term $e^{-\omega_{h+1}^2/(2\gamma)}$);

so with $\varepsilon_1=\varepsilon_A+\varepsilon_T$ and $0\le g\le 1$ the product kernel obeys
$|G_{P,N}(a-b)-G(a-b)|\le\varepsilon_G=(1+\varepsilon_1)^k-1$. The NUFFTs are modelled (and
checked, tests/kernels/test_fast_kernel.py) by FINUFFT's per-entry estimate: the error of every output
is at most $\varepsilon_\mathrm{nu}$ times the $\ell^1$ norm of the input. The type-1 error
$\varepsilon_\mathrm{nu}\|c\|_1$ per mode passes through the positive multiplier whose sum is
$S=G_{P,N}(0)\le(1+\varepsilon_1)^k$, and the type-2 error is $\varepsilon_\mathrm{nu}$ times
the multiplied modes' $\ell^1$ norm $\le S\|c\|_1$: $2S\varepsilon_\mathrm{nu}\|c\|_1$ for
complex strengths $c=p+iq$. The kernel is real, so the real part of the output is
$\sum_jp_jG_{P,N}$ up to that error, and $\|c\|_1\le\|p\|_1+\|q\|_1$. Every channel here has
$\|p\|_1\le U=\sum_j\tilde u_j$ (values scaled to $|v-\bar c|/V\le1$), so every recovered channel
obeys

$$\Big|\widetilde{\textstyle\sum_j} p_jG(a_i-b_j)-\textstyle\sum_jp_jG(a_i-b_j)\Big|
\le\eta\,U,\qquad \eta=\varepsilon_G+4S\varepsilon_\mathrm{nu}+\varepsilon_\mathrm{round},$$

with $\varepsilon_\mathrm{round}=32\,\epsilon_\mathrm{mach}$ for the operations outside the
transforms.

So the denominator has $|\tilde D_i-D_i|\le\eta U$ and each numerator
component $|\tilde N_i-N_i|\le\eta UV$. Writing $\rho_i=U/D_i$ (the inverse of the kernel-weighted
mass fraction seen by query $i$; 1 when all mass sits on the query, large when $u$ spans many
orders of magnitude or the query is far from all mass):

$$|\tilde\ell_i-\ell_i|\le-\log(1-\eta\rho_i),\qquad
|\tilde{\bar v}_i-\bar v_i|_\infty\le\frac{2V\eta\rho_i}{1-\eta\rho_i}\qquad(\eta\rho_i<1),$$

plus rounding of the final few operations. The plan chooses $P$, $N$ and
$\varepsilon_\mathrm{nu}$ so that $\eta\le\mathrm{tol}$ (half the budget to $\varepsilon_G$, half
to the NUFFTs); :attr:`GaussianSumPlan.eta` is the achieved value. Accuracy is thus *absolute in
the total mass* $U$ (docs: math/fast_kernels.md#attention-as-a-gaussian-sum): relative to each query it is
$\mathrm{tol}\cdot\rho_i$.

**A-posteriori check.** The same algebra with the *computed* $\tilde D_i$ is exact:
$\tilde N/\tilde D-N/D=[(\tilde N-N)-(\bar v-\bar c)(\tilde D-D)]/\tilde D$, so with
$r_i=\eta U/\tilde D_i$,

$$|\tilde{\bar v}_i-\bar v_i|_\infty\le 2Vr_i,\qquad |\tilde\ell_i-\ell_i|\le-\log(1-r_i)$$

(plus rounding), computable for free. :func:`fast_lse_average_with_info` returns these bounds
(:class:`FastSumInfo`); a caller can recompute the rows whose bound is too large with the exact
kernel. A row with $r_i\ge1$ has no guarantee (bound $=\infty$): its denominator is clamped at
$\eta U$, which keeps the returned average within $3V$ of $\bar c$ and finite.

**Box.** Every query and every key with non-zero weight must satisfy $|x|_\infty\le R$ (the
planned ``radius``); otherwise the periodic images alias into the sum. This is checked at run time
(``eqx.error_if`` naming the radius, or ``info.in_box`` with ``throw=False``).

**Autodiff.** jax-finufft differentiates the transforms (forward and reverse, with respect to
strengths and points), and ``gamma`` enters only through closed forms ($\log u$, the multiplier,
$\gamma|a|^2/2$), so gradients with respect to ``a, b, v, bias, gamma`` are those of the Fourier
approximant; they agree with the dense formula to about $\mathrm{tol}\cdot\rho\cdot N$ (the mode
count from differentiating the series). The shift $c$, the centre $\bar c$ and the box check are
under ``stop_gradient`` (the result does not depend on them mathematically).
"""

from __future__ import annotations

import functools
import math
import warnings
from numbers import Integral, Real

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float
from jaxtyping import Real as RealArray

from .._checks import runtime_check

__all__ = [
    "PLAN_MEMORY_BUDGET",
    "FastSumInfo",
    "GaussianSumPlan",
    "PlanTooLarge",
    "plan_memory_bytes",
    "fast_lse_average",
    "fast_lse_average_with_info",
    "plan_gaussian_sum",
]

# Smallest NUFFT tolerance worth asking FINUFFT for, per dtype (below it rounding dominates;
# measured: float64 reaches ~1e-15 relative to the l1 norm, float32 ~3e-7).
_EPS_FLOOR = {"float64": 1e-14, "float32": 1e-6}
# Rounding of everything outside the transforms (exp of the shifted log-weights, the multiplier,
# the points 2πx/P), relative to the total mass, in units of the machine epsilon.
_ROUND_UNITS = 32.0
# Upsampling factor FINUFFT uses for these tolerances (the cost model only).
_SIGMA = 2.0
PLAN_MEMORY_BUDGET = 1 << 30
"""The default budget (bytes) for one plan's working memory (:func:`plan_memory_bytes`): 1 GiB.
Modes grow like R√γ per dimension and the grid like their k-th power (β = 10⁴ on S² needs 421³
modes on an 864³ grid, ~10 GiB per channel): a plan above it is refused (:class:`PlanTooLarge`)
before anything is allocated."""


class PlanTooLarge(ValueError):
    """A Gaussian-sum plan whose working memory exceeds its budget (raised before any allocation;
    ``tp.kernels.Auto`` takes the exact kernel instead)."""


def plan_memory_bytes(modes: int, fine_grid: int, k: int, dtype: str, value_width: int = 1) -> int:
    """Working memory (bytes) of one fast reduction with ``modes`` per dimension on FINUFFT's
    ``fine_grid`` per dimension: per complex channel (the 1 + e real channels packed in pairs)
    the upsampled grid (fine^k) and about k + 2 mode arrays (N^k: the type-1 output, the
    multiplier's products, the type-2 input). The O(n) arrays (points, strengths) are the exact
    kernel's too and are not counted."""
    channels = (2 + int(value_width)) // 2
    cbytes = 8 if dtype == "float32" else 16
    return int(cbytes * channels * (float(fine_grid) ** k + (k + 2) * float(modes) ** k))


def _too_large(needed: int, budget: float, *, modes: int, fine: int, k: int, dtype: str,
               value_width: int, gamma, radius: float, tol: float) -> PlanTooLarge:
    lo, hi = gamma
    g = f"gamma={lo:.6g}" if lo == hi else f"gamma in [{lo:.6g}, {hi:.6g}]"
    return PlanTooLarge(
        f"the fast kernel's plan for {g}, radius R={radius:.6g}, tol={tol:g} (k={k}, {dtype}, "
        f"{value_width} value column(s)) needs {modes}^{k} modes on a {fine}^{k} grid, about "
        f"{needed / 2**30:.3g} GiB, above the budget of {budget / 2**30:.3g} GiB ({int(budget)} "
        "bytes). Modes grow like R*sqrt(gamma) per dimension: use the exact kernel "
        "(tp.kernels.Exact(), or Auto, which takes it), or raise the budget (max_plan_bytes=)")


def _restore_not_mapped() -> None:
    """Let jax-finufft's ``vmap`` rule run on JAX >= 0.10.

    jax-finufft 1.3.1's batching rule compares axes with ``batching.not_mapped``, a name JAX 0.10
    removed (an unmapped axis is now plain ``None``), so every ``vmap`` over a transform raised
    ``AttributeError`` (jax-finufft issue #227, fixed upstream after 1.3.1 by comparing with
    ``None``). Defining the missing name as ``None`` is exactly that fix; it touches nothing
    else (JAX itself no longer reads the name). Drop this once jax-finufft > 1.3.1 is required.
    """
    from jax._src.interpreters import batching

    if "not_mapped" not in vars(batching):
        batching.not_mapped = None


@functools.cache
def _finufft():
    """jax-finufft's ``(nufft1, nufft2, Opts)``, imported on first use: most runs never take the
    fast path, and the import (with pydantic) costs 0.16 s of every process's start."""
    try:
        from jax_finufft import nufft1, nufft2
        from jax_finufft.options import Opts
    except ImportError:  # pragma: no cover - exercised only where jax-finufft is missing
        raise ImportError("the fast kernel needs jax-finufft: pip install jax-finufft") from None
    _restore_not_mapped()
    return nufft1, nufft2, Opts


def _transform(fn, *args, **kwargs):
    """Call a jax-finufft transform with implicit rank promotion allowed: its derivative rules
    broadcast ``(N, 1, 1) * (1, c, N, N, N)`` implicitly, which fails under
    ``jax_numpy_rank_promotion="raise"`` (set by our tests). The rules run while the transform is
    traced (JVP, and the linearization behind ``grad``), i.e. inside this context."""
    with jax.numpy_rank_promotion("allow"):
        return fn(*args, **kwargs)


def _aliasing(gamma: float, period: float, radius: float) -> float:
    """Per-dimension aliasing bound: max over |t| <= 2R of g_P(t) - g(t)."""
    h = period - 2.0 * radius
    if h <= 0:
        return math.inf
    return 2.0 * math.exp(-gamma * h * h / 2.0) / (-math.expm1(-gamma * h * period))


def _truncation(gamma: float, period: float, half: int) -> float:
    """Per-dimension truncation bound (2/P) Σ_{ℓ > half} ĝ(ω_ℓ), summed until negligible."""
    dw = 2.0 * np.pi / period
    last = half + 2 + int(math.sqrt(2.0 * gamma * 750.0) / dw)  # every later term underflows
    ell = np.arange(half + 1, last, dtype=np.float64)
    terms = np.exp(-((dw * ell) ** 2) / (2.0 * gamma))
    return float(2.0 / period * np.sqrt(2.0 * np.pi / gamma) * terms.sum())


def _spread_width(eps: float) -> int:
    """FINUFFT's kernel width for tolerance eps at upsampling 2 (cost model only)."""
    return int(min(16, max(2, math.ceil(math.log10(10.0 / eps)))))


def _next_smooth(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= n (FFT grid sizes, cost model only)."""
    best = 1 << max(0, int(n - 1).bit_length())
    p5 = 1
    while p5 < 2 * n:
        p35 = p5
        while p35 < 2 * n:
            p = p35
            while p < n:
                p *= 2
            best = min(best, p)
            p35 *= 3
        p5 *= 5
    return best


class GaussianSumPlan(eqx.Module):
    r"""A static plan for the Fourier-series Gaussian sum (build it outside ``jit``).

    Every field is static (Python numbers): the mode count fixes array shapes, so a plan is part of
    the compiled program, and a different plan recompiles. Build with :func:`plan_gaussian_sum`.

    Attributes:
        k: dimension of the score space (1, 2 or 3).
        gamma_min, gamma_max: the window of γ the bound holds for (aliasing is worst at
            ``gamma_min``, truncation at ``gamma_max``); one γ gives a zero-width window.
        radius: the box ``|a|_∞, |b|_∞ <= radius`` the plan is valid in.
        tol: the requested tolerance (relative to the total mass, see the module docstring).
        dtype: ``"float32"`` or ``"float64"``.
        period: the period P of the Fourier series (P = 2·radius + reach).
        modes: N, modes per dimension (odd: |ℓ| <= (N-1)/2); ``total_modes = N**k``.
        nufft_eps: the tolerance passed to FINUFFT (both transforms).
        aliasing_error, truncation_error: the per-dimension bounds ε_A, ε_T.
        kernel_error: ε_G = (1 + ε_A + ε_T)^k - 1, the uniform error of the kernel.
        nufft_error: 4 S ε_nu, the two transforms' contribution (x2: channels packed in pairs).
        rounding_error: rounding outside the transforms, relative to the total mass.
        eta: the total bound η: every channel's sum is off by at most η·||strengths||_1.
        spread_width, fine_grid: FINUFFT's kernel width and upsampled grid per dimension
            (predicted; used by the cost model).
        nthreads: FINUFFT's OpenMP threads (0: its default, all cores; 1 can be faster on a
            loaded machine or for small n).
    """

    k: int = eqx.field(static=True)
    gamma_min: float = eqx.field(static=True)
    gamma_max: float = eqx.field(static=True)
    radius: float = eqx.field(static=True)
    tol: float = eqx.field(static=True)
    dtype: str = eqx.field(static=True)
    period: float = eqx.field(static=True)
    modes: int = eqx.field(static=True)
    nufft_eps: float = eqx.field(static=True)
    aliasing_error: float = eqx.field(static=True)
    truncation_error: float = eqx.field(static=True)
    kernel_error: float = eqx.field(static=True)
    nufft_error: float = eqx.field(static=True)
    rounding_error: float = eqx.field(static=True)
    eta: float = eqx.field(static=True)
    spread_width: int = eqx.field(static=True)
    fine_grid: int = eqx.field(static=True)
    nthreads: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if self.k not in (1, 2, 3):
            raise ValueError(f"the fast kernel needs score dimension k in (1, 2, 3), got k={self.k}")
        if not 0 < self.gamma_min <= self.gamma_max < math.inf:
            raise ValueError(f"need 0 < gamma_min <= gamma_max < inf, got "
                             f"({self.gamma_min}, {self.gamma_max})")
        if not self.radius > 0:
            raise ValueError(f"radius must be positive, got {self.radius}")
        if not 0 < self.tol < 1:
            raise ValueError(f"tol must lie in (0, 1), got {self.tol}")
        if self.dtype not in _EPS_FLOOR:
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype}")
        if self.nthreads < 0:
            raise ValueError(f"nthreads must be >= 0 (0: all cores), got {self.nthreads}")
        if self.modes % 2 != 1 or not self.period > 2 * self.radius:
            raise ValueError(f"inconsistent plan: modes={self.modes} (must be odd), "
                             f"period={self.period} (must exceed 2*radius={2 * self.radius})")

    @property
    def total_modes(self) -> int:
        return self.modes**self.k

    @property
    def half_period(self) -> float:
        return self.period / 2.0

    def predicted_flops(self, n: Integral, m: Integral | None = None, e: Integral = 1) -> float:
        """Predicted flops of :func:`fast_lse_average` for n keys, m queries, e value columns.

        Per complex channel (the 1 + e real channels packed in pairs): spreading and
        interpolation, 8 w^k flops per point (plus w·k kernel evaluations); two FFTs of the fine
        grid (σN)^k, 5 M log2 M each; the diagonal multiply, 8 flops per mode.
        """
        m = n if m is None else m
        ch = (2 + e) // 2  # complex transforms: the 1 + e real channels packed in pairs
        w, k = self.spread_width, self.k
        fine = float(self.fine_grid) ** k
        spread = (n + m) * (ch * 8.0 * w**k + 10.0 * w * k)
        ffts = 2.0 * ch * 5.0 * fine * math.log2(max(fine, 2.0))
        return spread + ffts + 8.0 * ch * self.total_modes

    def exact_flops(self, n: Integral, m: Integral | None = None, e: Integral = 1) -> float:
        """Flops of the exact kernel on the same problem: per pair, the logit (2k), one exp
        (counted as 10, a polynomial evaluation) and the weighted accumulation of the 1 + e
        channels (2(1 + e)): O(n m k)."""
        m = n if m is None else m
        return float(n) * m * (2.0 * self.k + 10.0 + 2.0 * (1 + e))

    def predicted_speedup(self, n: Integral, m: Integral | None = None, e: Integral = 1) -> float:
        """``exact_flops / predicted_flops`` (a flop ratio; measured times in benchmarks/)."""
        return self.exact_flops(n, m, e) / self.predicted_flops(n, m, e)


def plan_gaussian_sum(
    gamma: Real | tuple[Real, Real],
    radius: Real,
    k: Integral,
    tol: Real = 1e-8,
    dtype=None,
    *,
    nthreads: Integral = 0,
    max_bytes: Real | None = None,
    value_width: Integral = 1,
) -> GaussianSumPlan:
    r"""Choose the period, mode count and NUFFT tolerance for a Gaussian sum of bandwidth γ.

    Args:
        gamma: γ > 0 (the logits are γ⟨a, b⟩ + bias), or a window ``(gamma_min, gamma_max)`` when
            γ is a parameter that moves (a fit): the bound then holds for every γ in it.
        radius: the box ``|a_i|_∞, |b_j|_∞ <= radius`` the plan must cover.
        k: dimension of a and b (1, 2 or 3).
        tol: target for η, the error of every kernel sum relative to the total mass
            (module docstring); the per-query errors are ``tol · ρ_i``.
        dtype: ``float32`` or ``float64`` (default: JAX's default float).
        nthreads: FINUFFT threads (0: all cores).
        max_bytes: refuse (:class:`PlanTooLarge`, a ValueError naming the sizes, γ and the
            budget) a plan whose working memory (:func:`plan_memory_bytes` for ``value_width``
            value columns) exceeds it; checked from the predicted mode count before the exact
            search, so a huge γR² costs nothing. None: no budget.

    The budget is split as: ε_A, ε_T <= tol/(4k) per dimension (so ε_G <= tol/2), and
    ε_nu = tol/10 for each transform (4 S ε_nu <= tol/2), clamped to what FINUFFT reaches in ``dtype``
    (float64 1e-14, float32 1e-6); a warning says when η then exceeds ``tol``.
    """
    if isinstance(gamma, (tuple, list)):
        g_lo, g_hi = (float(g) for g in gamma)
    else:
        g_lo = g_hi = float(gamma)
    radius, tol, k = float(radius), float(tol), int(k)
    dt = np.dtype(jnp.result_type(float) if dtype is None else dtype).name
    if dt not in _EPS_FLOOR:
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    if not (0 < g_lo <= g_hi < math.inf):
        raise ValueError(f"gamma must be positive (or a window 0 < lo <= hi), got {gamma}")
    if not 0 < radius < math.inf:
        raise ValueError(f"radius must be positive and finite, got {radius}")
    if not 0 < tol < 1:
        raise ValueError(f"tol must lie in (0, 1), got {tol}")
    if k not in (1, 2, 3):
        raise ValueError(f"the fast kernel needs score dimension k in (1, 2, 3), got k={k}")
    if max_bytes is not None and not float(max_bytes) > 0:
        raise ValueError(f"max_bytes must be None or positive, got {max_bytes!r}")

    def check_budget(half):
        if max_bytes is None:
            return
        modes = 2 * half + 1
        fine = _next_smooth(int(_SIGMA * modes))
        needed = plan_memory_bytes(modes, fine, k, dt, value_width)
        if needed > float(max_bytes):
            raise _too_large(needed, float(max_bytes), modes=modes, fine=fine, k=k, dtype=dt,
                             value_width=int(value_width), gamma=(g_lo, g_hi), radius=radius, tol=tol)

    per_dim = tol / (4.0 * k)
    # Period: the smallest reach h with aliasing <= per_dim at the smallest γ.
    h = math.sqrt(2.0 * math.log(2.0 / per_dim) / g_lo)
    while _aliasing(g_lo, 2 * radius + h, radius) > per_dim:
        h *= 1.01
    period = 2.0 * radius + h
    eps_a = _aliasing(g_lo, period, radius)
    # Modes: the smallest half-width with truncation <= per_dim at the largest γ.
    half_est = period * math.sqrt(2.0 * g_hi * math.log(1.0 / per_dim)) / (2 * math.pi)
    check_budget(max(1, int(min(half_est, 1e12)) - 2))  # before the search: it sums O(half) terms
    half = max(1, int(half_est) - 2)
    while _truncation(g_hi, period, half) > per_dim:
        half += 1
    check_budget(half)
    eps_t = _truncation(g_hi, period, half)
    eps_1 = eps_a + eps_t
    kernel_error = (1.0 + eps_1) ** k - 1.0
    s_bound = (1.0 + eps_1) ** k
    nufft_eps = max(tol / 10.0, _EPS_FLOOR[dt])
    nufft_error = 4.0 * s_bound * nufft_eps  # 2 transforms x 2 (channels packed in pairs)
    rounding = _ROUND_UNITS * float(np.finfo(dt).eps)
    eta = kernel_error + nufft_error + rounding
    if eta > 1.5 * tol:
        warnings.warn(f"plan_gaussian_sum: tol={tol:g} is below what {dt} reaches; the "
                      f"achieved bound is eta={eta:.2g}", stacklevel=2)
    modes = 2 * half + 1
    return GaussianSumPlan(
        k=k, gamma_min=g_lo, gamma_max=g_hi, radius=radius, tol=tol, dtype=dt, period=period,
        modes=modes, nufft_eps=nufft_eps, aliasing_error=eps_a, truncation_error=eps_t,
        kernel_error=kernel_error, nufft_error=nufft_error, rounding_error=rounding, eta=eta,
        spread_width=_spread_width(nufft_eps), fine_grid=_next_smooth(int(_SIGMA * modes)),
        nthreads=int(nthreads),
    )


class FastSumInfo(eqx.Module):
    r"""Per-query a-posteriori error bounds of :func:`fast_lse_average_with_info`.

    Attributes:
        in_box: every query and every weighted key lies in the planned box.
        mass_ratio: ``U / D̃_i``, the computed ρ_i (total mass over the mass seen by query i).
        lse_bound: bound on ``|lse_i - exact lse_i|``: ``-log(1 - η ρ_i)`` plus rounding
            (``inf`` where ``η ρ_i >= 1`` or outside the box).
        avg_bound: bound on ``max_e |avg_ie - exact avg_ie|``: ``2 V η ρ_i`` plus rounding, V the
            half-range of the values (``inf`` where ``η ρ_i >= 1`` or outside the box).
        value_half_range: V, the largest half-range over the value columns (live keys only).
    """

    in_box: Bool[Array, ""]
    mass_ratio: Float[Array, " m"]
    lse_bound: Float[Array, " m"]
    avg_bound: Float[Array, " m"]
    value_half_range: Float[Array, ""]

    def reliable(self, atol: Real) -> Bool[Array, " m"]:
        """Queries whose average and lse are both certified to within ``atol`` (and in the box):
        recompute the others with :func:`transformer_pde.kernels.exact.lse_average`."""
        return self.in_box & (self.lse_bound <= atol) & (self.avg_bound <= atol)


def _check_gamma(gamma, plan: GaussianSumPlan, throw: bool):
    lo = plan.gamma_min * (1 - 1e-9)
    hi = plan.gamma_max * (1 + 1e-9)
    if isinstance(gamma, (int, float)) or (not isinstance(gamma, jax.core.Tracer)
                                           and np.ndim(gamma) == 0):
        g = float(gamma)
        if not lo <= g <= hi:
            raise ValueError(f"gamma={g} lies outside the plan's window "
                             f"[{plan.gamma_min}, {plan.gamma_max}]; build a new plan")
        return jnp.asarray(gamma)
    gamma = jnp.asarray(gamma)
    if throw:
        gamma = runtime_check(gamma, (gamma < lo) | (gamma > hi),
                              f"gamma lies outside the plan's window "
                              f"[{plan.gamma_min}, {plan.gamma_max}]; build a new plan")
    return gamma


def _raise_outside_box(a: np.ndarray, b: np.ndarray, bias: np.ndarray, radius: float):
    """ValueError naming the worst offender (concrete inputs, outside ``jit``)."""
    qa = np.abs(a).max(axis=1) if a.size else np.zeros(0)
    kb = np.where(np.isfinite(bias), np.abs(b).max(axis=1), 0.0) if b.size else np.zeros(0)
    for name, r in (("query a", qa), ("key b", kb)):
        if r.size and r.max() > radius:
            i = int(np.argmax(r))
            raise ValueError(f"fast_lse_average: {name}[{i}] has |x|_inf = {r[i]:.6g}, outside the "
                             f"planned box |x|_inf <= radius = {radius}; build a new plan with a "
                             f"larger radius (or use the exact kernel)")


def fast_lse_average_with_info(
    a: Float[ArrayLike, "m k"],
    b: Float[ArrayLike, "n k"],
    v: Float[ArrayLike, "n e"],
    bias: Float[ArrayLike, " n"],
    gamma: RealArray[ArrayLike, ""],
    plan: GaussianSumPlan,
    *,
    throw: bool = True,
    axis_name: str | None = None,
) -> tuple[Float[Array, "m e"], Float[Array, " m"], FastSumInfo]:
    """:func:`fast_lse_average` plus its a-posteriori bounds (:class:`FastSumInfo`).

    With ``throw=False`` a state outside the planned box does not raise; ``info.in_box`` is then
    ``False`` and the results carry no guarantee.

    ``axis_name``: inside ``shard_map`` (or ``pmap``) over that axis, ``a`` holds this device's
    queries and ``b, v, bias`` this device's keys; the sum runs over every device's keys. Each
    device spreads its own keys (type 1), the mode arrays are summed across devices (one
    ``psum`` of ``ceil((1+e)/2) N^k`` complex numbers, independent of n) together with four
    scalars per value column (the weight shift, the value range, the total mass, the box flag),
    and each device evaluates its own queries (type 2). Same numbers as one device up to the
    order of the floating-point sums.
    """
    nufft1, nufft2, Opts = _finufft()
    if a.ndim != 2 or b.ndim != 2 or v.ndim != 2 or bias.ndim != 1:
        raise ValueError(f"expected a (m, k), b (n, k), v (n, e), bias (n,); got shapes "
                         f"{a.shape}, {b.shape}, {v.shape}, {bias.shape}")
    if a.shape[1] != plan.k or b.shape[1] != plan.k:
        raise ValueError(f"the plan is for k={plan.k}, got a {a.shape} and b {b.shape}")
    if not (b.shape[0] == v.shape[0] == bias.shape[0]):
        raise ValueError(f"b, v and bias need one row per key, got {b.shape}, {v.shape}, "
                         f"{bias.shape}")
    a, b, v, bias = (jnp.asarray(x) for x in (a, b, v, bias))
    dtype = jnp.result_type(a, b, v, bias)
    if np.dtype(dtype).name != plan.dtype:
        raise ValueError(f"the plan is for {plan.dtype} but the inputs are {np.dtype(dtype).name}; "
                         f"build the plan with dtype={np.dtype(dtype).name}")
    cdtype = jnp.complex64 if plan.dtype == "float32" else jnp.complex128
    a, b, v, bias = (x.astype(dtype) for x in (a, b, v, bias))
    gamma = _check_gamma(gamma, plan, throw).astype(dtype)
    k, P, N, R = plan.k, plan.period, plan.modes, plan.radius
    sg = jax.lax.stop_gradient
    tiny_round = 4.0 * float(np.finfo(plan.dtype).eps)

    def across(op, x):  # reduce over devices (identity on one device)
        if axis_name is None:
            return x
        return {"max": jax.lax.pmax, "min": jax.lax.pmin, "sum": jax.lax.psum}[op](x, axis_name)

    # --- the box (only keys with non-zero weight matter) -------------------------------------
    live = jnp.isfinite(bias)
    in_box = (jnp.all(jnp.abs(sg(a)) <= R)
              & jnp.all(jnp.where(live[:, None], jnp.abs(sg(b)), 0.0) <= R))
    in_box = across("min", in_box.astype(jnp.int32)) > 0
    if throw:
        if not any(isinstance(x, jax.core.Tracer) for x in (a, b, bias)):
            _raise_outside_box(np.asarray(a), np.asarray(b), np.asarray(bias), R)
        a = runtime_check(a, ~in_box, f"fast_lse_average: a query or a weighted key lies outside "
                                      f"the planned box |x|_inf <= radius = {R}; build a new plan "
                                      f"with a larger radius (or use the exact kernel)")
    b = jnp.where(live[:, None], b, 0.0)

    # --- weights u_j = exp(bias_j + γ|b_j|²/2), shifted by their maximum ----------------------
    log_u = bias + 0.5 * gamma * jnp.sum(b * b, axis=-1)
    c = across("max", sg(jnp.max(log_u)))
    c = jnp.where(jnp.isfinite(c), c, 0.0)
    u = jnp.exp(log_u - c)  # in [0, 1]; 0 for removed keys
    total = across("sum", jnp.sum(u))

    # --- values centred at their mid-range (over live keys) -----------------------------------
    vs = sg(v)
    vmax = across("max", jnp.max(jnp.where(live[:, None], vs, -jnp.inf), axis=0))
    vmin = across("min", jnp.min(jnp.where(live[:, None], vs, jnp.inf), axis=0))
    centre = jnp.where(jnp.isfinite(vmax), 0.5 * (vmax + vmin), 0.0)
    half_range = jnp.max(jnp.where(jnp.isfinite(vmax), 0.5 * (vmax - vmin), 0.0))

    # --- type 1: sources to modes. Real channels (1, (v - centre)/V) packed in pairs as
    # complex strengths p + i q (the kernel is real, so Re and Im never mix except through the
    # NUFFT error, which the plan's η budgets for): ceil((1 + e)/2) transforms, not 1 + e.
    scale = jnp.where(half_range > 0, half_range, 1.0)
    vc = jnp.where(live[:, None], (v - centre[None, :]) / scale, 0.0)  # removed keys: any value, no NaN
    chans = jnp.concatenate([jnp.ones((1, v.shape[0]), dtype), vc.T], axis=0)
    chans = u[None, :] * chans
    if chans.shape[0] % 2:
        chans = jnp.concatenate([chans, jnp.zeros_like(chans[:1])], axis=0)
    strengths = jax.lax.complex(chans[0::2], chans[1::2]).astype(cdtype)

    def fold(x):  # 2πx/P folded into [-π, π): identity inside the box (G_P is periodic)
        return jnp.mod(2.0 * jnp.pi / P * x + jnp.pi, 2.0 * jnp.pi) - jnp.pi

    xb = [fold(b[:, d]) for d in range(k)]
    xa = [fold(a[:, d]) for d in range(k)]
    opts = Opts(nthreads=plan.nthreads) if plan.nthreads else None
    modes = _transform(nufft1, (N,) * k, strengths, *xb, eps=plan.nufft_eps, iflag=-1, opts=opts)
    modes = across("sum", modes)

    # --- multiply by the Gaussian's Fourier coefficients ĝ(ω_ℓ)/P, one factor per dimension ---
    omega = jnp.asarray(2.0 * np.pi / P * np.arange(-(N // 2), N // 2 + 1), dtype)
    coef = jnp.sqrt(2.0 * jnp.pi / gamma) * jnp.exp(-(omega**2) / (2.0 * gamma)) / P
    for d in range(k):
        shape = [1] * (k + 1)
        shape[1 + d] = N
        modes = modes * coef.reshape(shape).astype(cdtype)

    # --- type 2: modes to queries, then unpack the pairs -------------------------------------
    packed = _transform(nufft2, modes, *xa, eps=plan.nufft_eps, iflag=1, opts=opts)
    sums = jnp.stack([jnp.real(packed), jnp.imag(packed)], axis=1).reshape(-1, packed.shape[-1])
    den, num = sums[0], scale * sums[1:1 + v.shape[1]].T

    # --- normalize; clamp the denominator where the bound says nothing ------------------------
    floor = plan.eta * total
    den_c = jnp.maximum(den, floor)
    pos = den_c > 0
    den_s = jnp.where(pos, den_c, 1.0)
    avg = jnp.where(pos[:, None], centre[None, :] + num / den_s[:, None], 0.0)
    quad = 0.5 * gamma * jnp.sum(a * a, axis=-1)
    lse = jnp.where(pos, quad + c + jnp.log(den_s), -jnp.inf)

    # --- a-posteriori bounds (module docstring): r_i = η U / D̃_i -------------------------------
    den_a, total_a = sg(den), sg(total)
    ok = (den_a > floor) & in_box  # r_i < 1, and the plan applies
    den_ok = jnp.where(ok, den_a, 1.0)
    ratio = jnp.where(den_a > floor, total_a / jnp.where(den_a > floor, den_a, 1.0), jnp.inf)
    r = jnp.where(ok, plan.eta * total_a / den_ok, 0.0)
    lse_round = tiny_round * (jnp.abs(sg(quad)) + jnp.abs(c) + jnp.abs(jnp.log(den_ok)) + 1.0)
    lse_bound = jnp.where(ok, -jnp.log1p(-r) + lse_round, jnp.inf)
    avg_round = tiny_round * (half_range + jnp.max(jnp.abs(centre)))
    avg_bound = jnp.where(ok, 2.0 * half_range * r + avg_round, jnp.inf)
    empty = total_a == 0  # every key removed: the exact answer (average 0, lse -inf)
    lse_bound = jnp.where(empty, 0.0, lse_bound)
    avg_bound = jnp.where(empty, 0.0, avg_bound)
    info = FastSumInfo(in_box=in_box, mass_ratio=ratio, lse_bound=lse_bound, avg_bound=avg_bound,
                       value_half_range=half_range)
    return avg, lse, info


def fast_lse_average(a, b, v, bias, gamma, plan: GaussianSumPlan, *,
                     throw: bool = True) -> tuple[Float[Array, "m e"], Float[Array, " m"]]:
    r"""Softmax average and log-normalizer of the logits ``gamma * a_i·b_j + bias_j``, fast.

    The contract of :func:`transformer_pde.kernels.exact.lse_average` with ``q = gamma * a``,
    ``k = b`` (non-causal only: a causal mask is not a convolution), to the accuracy of ``plan``
    (module docstring): ``|lse_i - exact| <= -log(1 - η ρ_i)`` and
    ``|avg_i - exact|_∞ <= 2 V η ρ_i / (1 - η ρ_i)``, with η = ``plan.eta`` <= ``plan.tol``.

    The arguments are typed once, on :func:`fast_lse_average_with_info`, which computes this.

    Args:
        a: queries' score coordinates (``Q x_i``), inside the plan's box.
        b: keys' score coordinates (``K x_j``), inside the box where the weight is non-zero.
        v: values, one row per key.
        bias: key biases (``log w_j``; ``-inf`` removes a key, with no NaN).
        gamma: γ, a scalar inside the plan's window (may be traced: differentiable).
        plan: from :func:`plan_gaussian_sum`, built outside ``jit``.
        throw: raise (``eqx.error_if``) when a token leaves the planned box.

    Returns:
        ``(average, lse)``, shapes ``(m, e)`` and ``(m,)``. A query with no key gets average 0 and
        lse ``-inf``. Use :func:`fast_lse_average_with_info` for per-query error bounds.
    """
    avg, lse, _ = fast_lse_average_with_info(a, b, v, bias, gamma, plan, throw=throw)
    return avg, lse
