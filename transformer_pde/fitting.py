r"""Training the parameters of a dynamics through the solver: ``tp.fit``.

The models are equinox Modules, so their parameters — including time-dependent ones, such as a
:class:`~transformer_pde.PiecewiseConstant` stack of per-layer weights (docs: math/attention.md#the-transformer-pde,
"Time-dependent weights") — are leaves that ``jax.grad`` reaches through :func:`tp.solve`.
``fit`` partitions the model into trainable leaves and the rest (``eqx.partition``), and runs an
optax optimizer on the former:

    model, history = tp.fit(model, loss, optimizer=optax.adam(1e-2), steps=500)

Gradients through long horizons: :func:`tp.solve` differentiates with diffrax's
``RecursiveCheckpointAdjoint``, which by default keeps O(log(max_steps)) checkpoints and
recomputes the rest (memory O(log N) states for N steps, work O(N log N)); pass
``adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=k)`` to trade memory (k stored states)
for recomputation (:func:`checkpointed_adjoint`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._checks import check_count, check_scalar
from ._programs import run_program


class FitResult(NamedTuple):
    """``(model, losses)``: the trained model and the loss before each step taken (``(steps,)``,
    fewer when a :class:`BestIterate` stopped early); ``final_loss`` is the loss of the returned
    model."""

    model: Any
    losses: np.ndarray
    final_loss: float


class BestIterate(eqx.Module):
    """Keep the iterate of least loss, and stop early once it stops improving (``tp.fit(...,
    keep=BestIterate(...))``): a fit returns the model at which its loss was lowest, among the
    iterates before every step and the one after the last, not the last one.

    Args:
        patience: stop after this many steps without a loss below the best one by more than
            ``tol`` (None: take every step).
        tol: the least decrease that counts as progress for ``patience`` (>= 0; any lower loss
            still becomes the kept iterate).
    """

    patience: int | None = None
    tol: float = 0.0

    def __check_init__(self):
        if self.patience is not None:
            check_count(self.patience, "BestIterate.patience", minimum=1)
        check_scalar(self.tol, "BestIterate.tol", nonnegative=True)


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def trainable_filter(model, trainable=None):
    """The filter spec (a pytree of bools shaped like ``model``) of the leaves to train.

    Args:
        trainable: ``None`` (every floating array), a callable ``model -> node or tuple of
            nodes`` naming the trained parts (``lambda m: (m.V, m.W)``; every floating array
            inside them is trained), or a ready-made filter pytree of bools.
    """
    if trainable is None:
        return jax.tree.map(eqx.is_inexact_array, model)
    if callable(trainable) and not isinstance(trainable, eqx.Module):
        nodes = _as_tuple(trainable(model))
        base = jax.tree.map(lambda _: False, model)
        return eqx.tree_at(lambda m: _as_tuple(trainable(m)), base,
                           replace=tuple(jax.tree.map(eqx.is_inexact_array, n) for n in nodes))
    spec_def, model_def = jax.tree.structure(trainable), jax.tree.structure(model)
    if spec_def != model_def:
        raise ValueError("a trainable filter pytree must have the structure of the model")
    return trainable


def fit(
    model,
    loss: Callable,
    *,
    optimizer,
    steps: int,
    trainable=None,
    progress: Callable[[int, float], None] | None = None,
    keep=None,
) -> FitResult:
    """Minimize ``loss(model)`` over the trainable leaves of ``model`` with an optax optimizer.

    Args:
        model: any pytree of parameters (an attention, ``tp.Sphere(...)``, a tuple of them...).
        loss: ``loss(model) -> scalar``; usually solves the dynamics and measures the result.
        optimizer: an ``optax.GradientTransformation`` (e.g. ``optax.adam(1e-2)``).
        steps: number of optimizer steps (>= 1).
        trainable: which leaves to train (see :func:`trainable_filter`); the others are held
            fixed (so are non-array fields such as ``PiecewiseConstant.t0``/``dt``).
        progress: an observer called as ``progress(step, loss)`` after every step, e.g.
            :func:`tqdm_progress` (a bar) or a function collecting the losses; None: silent.
        keep: None returns the last iterate after ``steps`` steps; a :class:`BestIterate`
            returns the iterate of least loss and may stop early (its ``patience`` and ``tol``).

    Returns:
        ``FitResult(model, losses, final_loss)``; unpacks as ``model, losses, final = ...``.
        Raises ``ValueError`` if the loss becomes NaN or infinite (with the step number).

    Example:
        ```python
        import jax.numpy as jnp, jax.random as jr, optax, transformer_pde as tp

        x0 = jr.normal(jr.key(0), (16, 2))

        def loss(attn):                                         # differentiates through the solver
            x1 = tp.solve(attn, x0, t1=0.5, dt0=0.1).xs[-1]
            return jnp.mean((x1 - 2.0 * x0) ** 2)

        attn0 = tp.SoftmaxAttention.identity(d=2, beta=1.0)
        model, losses, final = tp.fit(attn0, loss, optimizer=optax.adam(0.05), steps=5)
        losses.shape                                            # (5,)
        ```
    """
    steps = check_count(steps, "steps", minimum=1)
    if not callable(loss):
        raise ValueError(f"loss must be a callable loss(model) -> scalar, got {loss!r}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be None or a callable progress(step, loss), such as "
                         f"tp.fitting.tqdm_progress(steps), got {progress!r}")
    if not isinstance(optimizer, optax.GradientTransformation):
        raise ValueError(f"optimizer must be an optax GradientTransformation, got {optimizer!r}")
    if keep is not None and not isinstance(keep, BestIterate):
        raise ValueError(f"keep must be None (the last iterate) or tp.BestIterate(patience, tol), "
                         f"got {keep!r}")
    spec = trainable_filter(model, trainable)
    params, static = eqx.partition(model, spec)
    if not jax.tree.leaves(params):
        raise ValueError("nothing to train: the trainable filter selects no floating array")
    opt_state = optimizer.init(params)

    def objective(p):
        value = loss(eqx.combine(p, static))
        if jnp.ndim(value) != 0:
            raise ValueError(f"loss must return a scalar, got shape {jnp.shape(value)}")
        return value

    # one compiled value-and-gradient serves every step and the final loss; its backward pass
    # goes through ott's Sinkhorn VJP and jax-finufft's JVP, which broadcast implicitly (traced
    # here, outside any context set inside the loss), hence the local "allow"
    def loss_and_grad(params):
        return eqx.filter_value_and_grad(objective)(params)

    compiled = eqx.filter_jit(loss_and_grad)
    # both programs are kept between processes inside tp.runs.kept_programs (run_program): a step
    # holds its solves' checks, which only a kept program reports as values

    def value_and_grad(params):
        with jax.numpy_rank_promotion("allow"):
            return run_program(loss_and_grad, compiled, (params,))

    def apply(grads, opt_state, params):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state

    apply_jitted = eqx.filter_jit(apply)

    def update(grads, opt_state, params):
        return run_program(apply, apply_jitted, (grads, opt_state, params))

    def step(params, opt_state):
        value, grads = value_and_grad(params)
        params, opt_state = update(grads, opt_state, params)
        return params, opt_state, value

    def diverged(k, e):
        return ValueError(f"fit: the optimizer diverged at step {k} of {steps}: with the parameters "
                          f"it reached, the loss cannot be computed ({_first_line(e)}); lower the "
                          f"learning rate, clip the gradients (optax.clip_by_global_norm) or bound the "
                          f"parameters")

    losses = np.empty(steps)
    best, best_loss, stale = params, np.inf, 0  # the kept iterate (keep=BestIterate) and its loss
    for k in range(steps):
        before = params
        try:
            params, opt_state, value = step(params, opt_state)
        except (FloatingPointError, RuntimeError) as e:  # a solve that blew up (eqx.error_if)
            if k == 0:
                raise  # the initial model fails: not the optimizer's doing
            raise diverged(k, e) from e
        losses[k] = float(value)
        if not np.isfinite(losses[k]):
            raise ValueError(f"fit: the loss is {losses[k]} at step {k}; lower the learning rate "
                             "or check the loss")
        if progress is not None:
            progress(k, losses[k])
        if keep is not None:
            stale = 0 if losses[k] < best_loss - keep.tol else stale + 1
            if losses[k] < best_loss:
                best, best_loss = before, losses[k]
            if keep.patience is not None and stale >= keep.patience:
                losses = losses[: k + 1]
                break
    try:
        final = float(value_and_grad(params)[0])
    except (FloatingPointError, RuntimeError) as e:
        raise diverged(len(losses), e) from e
    if keep is not None and not final < best_loss:
        params, final = best, float(best_loss)
    return FitResult(eqx.combine(params, static), losses, final)


def _first_line(e: BaseException) -> str:
    """The message of an error raised inside jit (equinox puts it after its own preamble)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("equinox.EquinoxRuntimeError:"):
            return ln.split(":", 1)[1].strip()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def tqdm_progress(steps: int, desc: str = "fit") -> Callable[[int, float], None]:
    """An observer for :func:`fit`: a tqdm bar of ``steps`` steps showing the loss (closed after
    the last step)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=int(steps), desc=desc)

    def observe(step: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4g}")
        if step + 1 >= bar.total:
            bar.close()

    return observe


def checkpointed_adjoint(num_steps: int, memory: int | None = None) -> diffrax.RecursiveCheckpointAdjoint:
    """Reverse-mode adjoint for ``num_steps`` solver steps storing ``memory`` states.

    ``memory=None`` picks ⌈√num_steps⌉ checkpoints: every step is recomputed about once
    (work ≈ 2× the forward pass) with O(√N) memory; diffrax's own default (``None``
    checkpoints) stores O(log N) states and recomputes O(log N) times.
    """
    num_steps = check_count(num_steps, "num_steps", minimum=1)
    k = math.ceil(math.sqrt(num_steps)) if memory is None else check_count(memory, "memory", minimum=1)
    return diffrax.RecursiveCheckpointAdjoint(checkpoints=k)



