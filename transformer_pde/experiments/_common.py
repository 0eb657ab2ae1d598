"""Helpers shared by the experiments (not experiments themselves): experiments share through this
module or the library, never by importing each other. Light: the entries (``configs/``) read its
option vocabularies (:data:`MODELS`, ...), so it imports JAX only inside the functions that use it."""

from __future__ import annotations

import importlib
import sys
import threading

import numpy as np

import transformer_pde as tp


def circle_angles(x):
    """Angles in (−π, π] of tokens on S^1 (shape ``(..., n, 2)``)."""
    import jax.numpy as jnp  # here: the entries (configs/) read this module's names without JAX

    return jnp.arctan2(x[..., 1], x[..., 0])


def pid(rtol: float, dtype, atol_ratio: float = 1e-2):
    """A PID controller whose tolerance is reachable in ``dtype`` (float32 runs use at least
    100 machine epsilons: a smaller rtol only exhausts max_steps)."""
    import diffrax

    rtol = max(float(rtol), 100 * float(np.finfo(np.dtype(dtype)).eps))
    return diffrax.PIDController(rtol=rtol, atol=rtol * atol_ratio)


STAGE_RADIUS = 1.25
"""The bound on |x| that the experiments declare to the fast kernel for unit tokens integrated by
a Runge–Kutta solver: the stages of a step leave the sphere (|x|² = 1 + O(h²); the radius-1 plan
stopped a Tsit5 run of n = 10⁶, dt = 0.1 at its first step). Euler layers evaluate on the sphere
and declare 1."""


def kernel_backend(name: str, tol: float, radius: float = STAGE_RADIUS):
    """The kernel backend object an experiment's ``backend`` option names (mapped once, here):
    ``exact`` (dense / exact streaming), ``fast`` (NUFFT, planned error ``tol`` for tokens with
    |x| <= ``radius``), ``auto`` (fast where predicted cheaper and accurate, exact fallback;
    kernels/backends.py)."""
    kernels = tp.kernels
    return {"exact": lambda: kernels.Exact(), "fast": lambda: kernels.Fast(tol=tol, radius=radius),
            "auto": lambda: kernels.Auto(tol=tol, radius=radius)}[name]()


def finish_panel(ax, *, legend: float = 8, grid: str = "major", **props) -> None:
    """The experiments' finish of a figure panel: ``ax.set(**props)`` (title, labels, scales,
    limits), a legend in font size ``legend`` and the light grid (alpha 0.3) on the ``grid``
    ticks (matplotlib's ``which``: "both" for the decades of a log axis)."""
    ax.set(**props)
    ax.legend(fontsize=legend)
    ax.grid(alpha=0.3, which=grid)


def clustered_pairs_described(over: str) -> dict[str, tuple[str, str]]:
    """The ``describe=`` entries (:func:`~transformer_pde.runs.result.grid`) of
    ``tp.diagnostics.clustered_pair_fraction`` averaged over ``over`` ("draws", "starts"):
    ``fraction`` and its standard error ``fraction_sem``, worded once for every experiment that
    saves them (on the sphere a token is its own direction)."""
    return {"fraction": ("P(clustered pair): fraction of ordered pairs i != j of directions with "
                         f"<θ_i, θ_j> > threshold, mean over the {over}", ""),
            "fraction_sem": (f"standard error over the {over} of fraction", "")}


ATTENTIONS = {"SA": lambda: tp.SoftmaxAttention, "USA": lambda: tp.UnnormalizedAttention}
"""GLPR's two models on the sphere (docs: math/sphere.md#the-projected-flow), by option name: SA (softmax) and USA
(unnormalized, GLPR's 1/n); each entry gives its class (reached lazily: printing ``--help``
imports no JAX)."""
MODELS = tuple(ATTENTIONS)
SCHEMES = {"projected": lambda: tp.Sphere, "post-ln": lambda: tp.PostLN}
"""The layer schemes on the sphere, by option name: the projected flow and the authors' post-LN
(each entry gives its class)."""


def model_dynamics(model: str, d: int, beta, scheme: str = "projected", backend=None):
    """The dynamics an experiment's ``model`` and ``scheme`` options name (mapped here, once per
    run): SA or USA with Q = K = V = I (:data:`ATTENTIONS`, docs: math/sphere.md#the-projected-flow) in the layer
    scheme ``scheme`` (:data:`SCHEMES`): Sphere(attention) by default, PostLN(attention) for the authors'
    post-LN layer; ``backend`` a kernel backend object (default: automatic, exact below n ~ 4096)."""
    kwargs = {} if backend is None else {"backend": backend}
    return SCHEMES[scheme]()(ATTENTIONS[model]().identity(d, beta, **kwargs))


def rescaled_usa_step(dt: float, beta: float) -> float:
    """USA moves e^β times faster than SA near clusters; the authors' step rule
    (docs: math/sphere.md#differences-from-the-papers, phase-diagram defaults): dt / max(sqrt(β) e^{β − 1/2}, 1).
    For β <= 0 USA is no faster than SA (e^{β⟨x,y⟩} <= e^{|β|} with the factor below 1 near
    clusters): dt itself."""
    if beta <= 0:
        return dt
    return dt / max(np.sqrt(beta) * np.exp(beta - 0.5), 1.0)


EUCLIDEAN_ATTENTIONS = {
    "softmax": lambda Q, K, V, beta, **kw: tp.SoftmaxAttention(Q, K, V, beta, **kw),
    "l2": lambda Q, K, V, beta, **kw: tp.L2Attention(Q, K, V, beta, **kw),
    "multihead": lambda Q, K, V, beta, **kw: tp.MultiHeadAttention.split(Q, K, V, 2 if Q.shape[0] % 2 == 0 else 1,
                                                                         beta, **kw),
    "sinkhorn": lambda Q, K, V, beta, **kw: tp.SinkhornAttention(Q, K, V, beta, epsilon=1.0, **kw),
    "sigmoid": lambda Q, K, V, beta, **kw: tp.SigmoidAttention(Q, K, V, beta, **kw),
}
"""Attentions with (Q, K, V, β) matrices, by option name (built when called: listing the names
imports no JAX): softmax, ℓ² (Kim et al., arXiv:2006.04710), multi-head (Q, K, V split into 2 row
blocks, 1 when d is odd), Sinkhorn (ε = 1), sigmoid."""


END_MODULES = ("transformer_pde.plot", "xarray", "h5netcdf")
"""What a run imports only at its end: matplotlib for its figures, xarray for its labelled grids."""


def import_end_modules_meanwhile() -> None:
    """Start importing the :data:`END_MODULES` not imported yet in a thread: while XLA compiles
    or runs a program, which do not hold the GIL, they take no wall time of their own (phase-diagram
    at the peers' settings 4.03 -> 3.75 s, its peak memory unchanged). Started before tracing, the
    thread competes with it (tracing holds the GIL: measured slower); where a run's peak comes
    after its first compile the modules add to it (normalization starts them once its programs
    exist, while they run). An import that fails there is left to the main thread's own import,
    which raises it."""
    missing = [m for m in END_MODULES if m not in sys.modules]
    if missing:
        threading.Thread(target=_import_quietly, args=(missing,), name="transformer-pde-end-imports",
                         daemon=True).start()


def _import_quietly(modules):
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not in sys.modules, so the main thread's import raises it
            pass
