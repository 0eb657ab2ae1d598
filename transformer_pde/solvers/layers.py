"""The discrete residual Transformer, ``tp.layers``: ``tp.solve`` with the residual layer as its step
rule (:class:`~transformer_pde.solvers.residual.ResidualLayer`)."""

from __future__ import annotations

import diffrax
import jax
import numpy as np

from .._checks import check_int, check_scalar, is_concrete
from .noise import AbstractNoise
from .residual import ResidualLayer
from .solution import Solution
from .solve import solve


def layers(dynamics, x0, num_layers: int, step, *, t0=0.0, save_every: int = 1, fn=None,
           noise: AbstractNoise | None = None, key=None, throw: bool = True) -> Solution:
    """The discrete residual Transformer: x ← retract(x + h · v(t_l, x)), t_l = t0 + l·h:
    ``tp.solve(dynamics, x0, t0=t0, t1=t0 + L·h, dt0=h, solver=tp.ResidualLayer(), saveat=...)``
    with the saves after every ``save_every`` layers.

    This is explicit Euler with step ``h``; on the sphere it is followed by layer
    normalization x ← x/|x| (docs: math/attention.md#conventions). ``x0`` is an ``(n, d)`` array or
    ``tp.Particles(x, weights)``. Returns states after every ``save_every`` layers, including
    the input (layer 0); with ``fn(t, x, args)`` (a statistic, as in ``diffrax.SaveAt(fn=...)``;
    ``args`` is None) its value there instead, in ``Solution.stats``, and no state is kept.
    ``t0`` and ``step`` are concrete numbers (the layers are counted before the run).

    Every save is watched: a NaN or inf raises :class:`~transformer_pde.NonFiniteStateError` naming
    the first such layer when the call is concrete, ``eqx.error_if`` under ``jit``/``vmap``;
    with ``throw=False`` nothing is raised, ``Solution.nonfinite_time`` is its time (inf when the
    run stayed finite) and the floating saves from it on are inf, as ``tp.solve``'s (say, which
    β of a vmapped sweep blow up). A statistic's own NaN check of the tokens it is handed is left
    to this watch, and so is a traced start's (a concrete one is checked first): under
    ``throw=False`` a NaN start is ``nonfinite_time = t0``. A traced call whose dynamics are built
    from concrete values, whose start is a normalization (``tp.uniform_sphere``, ``tp.normalize``)
    and with ``throw=False`` holds no host callback, so its program can be kept in JAX's
    persistent compilation cache.

    With ``noise=tp.Noise(σ)`` and a ``key``, the noisy residual layer (docs: math/noise.md#independent-noise):
    x ← R(x + h v(t_l, x) + σ(t_l)√h g(x, ξ_l)), ξ_l ~ N(0, I) i.i.d. per token and layer
    (``fold_in(key, l)``), g the dynamics' :meth:`~transformer_pde.models.AbstractDynamics.diffusion`
    (ξ itself; its tangent part on :class:`~transformer_pde.Sphere`): Euler–Maruyama, then the
    layer's normalization. Any noise of the family works the same way, with the increment
    ``tp.solve`` applies (:meth:`~transformer_pde.solvers.AbstractNoise.increment`; common noise,
    ``tp.CommonNoise(g)``: one ξ_l of g's shape for all tokens, and its drift a(x) in the step).

    Example:
        ```python
        import jax.random as jr, transformer_pde as tp

        x0 = tp.uniform_sphere(jr.key(0), n=32, d=3)
        model = tp.Sphere(tp.SoftmaxAttention.identity(d=3, beta=1.0))   # layer normalization after each layer
        sol = tp.layers(model, x0, num_layers=10, step=0.1, save_every=5)
        sol.xs.shape                                            # (3, 32, 3): layers 0, 5 and 10
        ```
    """
    num_layers = check_int(num_layers, "num_layers", minimum=1)
    save_every = check_int(save_every, "save_every", minimum=1)
    if int(num_layers) % int(save_every):
        raise ValueError(f"save_every={save_every} must be >= 1 and divide num_layers={num_layers}")
    check_scalar(step, "step", positive=True)
    check_scalar(t0, "t0")
    if not (is_concrete(step) and is_concrete(t0)):
        raise ValueError("layers counts its layers before the run: step and t0 must be concrete numbers "
                         "(not traced under jit/vmap); trace the tokens or the parameters instead")
    if fn is not None and not callable(fn):
        raise ValueError(f"fn must be a statistic fn(t, x, args) or None, got {fn!r}")
    L, every, h, start = int(num_layers), int(save_every), float(step), float(t0)
    ts = start + h * np.arange(0, L + 1, every)
    with jax.ensure_compile_time_eval():  # SaveAt makes its times arrays: concrete ones, even under jit
        saveat = ts if fn is None else diffrax.SaveAt(ts=ts, fn=fn)
    return solve(dynamics, x0, t0=t0, t1=start + L * h, dt0=step, solver=ResidualLayer(), saveat=saveat,
                 noise=noise, key=key, throw=throw)


__all__ = ["layers"]
