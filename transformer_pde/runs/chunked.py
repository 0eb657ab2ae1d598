"""Resumable integration: ``tp.solve`` in fixed chunks of save intervals, a checkpoint after each.

A long run is cut at its save times ``ts``: chunk ``j`` integrates from the last save of
chunk ``j-1`` (``t0`` for the first chunk) to the last of its ``every`` save times, one
:func:`transformer_pde.solve` call each, and the state at that time starts chunk ``j+1``.
After each chunk its outputs and end state are written (:class:`~.checkpoint.Checkpoint`),
so resuming recomputes only the missing chunks. This is a host loop: ``tp.solve`` itself
writes nothing.

The chunking depends only on ``(t0, saveat, every)``, never on where a run was interrupted,
so each chunk executes the same compiled program on the same input bits: a resumed run ends
bitwise equal to an uninterrupted one on the same machine. (It is *not* bitwise equal to one
unchunked ``tp.solve``, whose constant-step grid runs across save times.)
"""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_weights
from ..models.base import AbstractDynamics, retract_at
from ..solvers import Particles, Solution, solve
from ..solvers.solve import check_times, parse_saveat
from .checkpoint import DEFAULT_EVERY, Checkpoint, check_every
from .fingerprint import run_fingerprint

_FORMAT = 3  # 3: fingerprints over code and closures, chunks carry the run and their index
# (2: chunks are tp.solve calls with their own step cap; 1: one cap for all chunks)


def _save_times(saveat, t0: float, t1: float, dtype) -> tuple[np.ndarray, object]:
    """``(ts, fn)`` of the explicit save times a chunked solve needs (the chunks end there): an
    array of times, or ``diffrax.SaveAt(ts=..., fn=...)`` (``fn`` None: the states are saved).
    Parsed and checked by ``tp.solve``'s own rules, then narrowed to one save at given times."""
    saves = parse_saveat(saveat)
    if len(saves) != 1:
        raise ValueError(f"a checkpointed solve takes one save, not SaveAt(subs=[...]), got {saveat}")
    (ts, fn), = saves
    if ts is None:
        raise ValueError(f"a checkpointed solve needs explicit save times saveat=... (chunks end "
                         f"there): an array, or diffrax.SaveAt(ts=..., fn=...), got {saveat}")
    return np.asarray(check_times(t0, t1, None, ts, dtype)), fn


def _chunks(num_saves: int, every: int) -> list[range]:
    return [range(s, min(s + every, num_saves)) for s in range(0, num_saves, every)]


def solve_checkpointed(
    dynamics: AbstractDynamics,
    x0,
    *,
    t1,
    saveat,
    t0=0.0,
    dt0=None,
    weights=None,
    checkpoint: Checkpoint | None = None,
    every: int | None = None,
    progress: bool = False,
    throw: bool = True,
    **solve_kwargs,
) -> Solution:
    """:func:`~transformer_pde.solve` in fixed chunks of ``every`` save intervals, resumable.

    Same arguments and result as ``solve`` for particles (save times are required: the chunks
    are cut at them). With a ``checkpoint``, every finished chunk is written to
    ``checkpoint.stage_dir(checkpoint.name)`` and a rerun with the same inputs resumes after
    the last complete chunk; ``every`` then comes from the checkpoint. Without one the run is
    chunked identically (``every`` or :data:`DEFAULT_EVERY`), so results agree bitwise either
    way. ``progress`` draws a bar of chunks.

    Solver options (``solver``, ``stepsize_controller``, ``max_steps``, ``noise`` and ``key``, ...)
    pass through to ``solve`` for each chunk; a noisy run's Brownian tree spans [t0, t1] in every
    chunk, so the chunks follow one Brownian path (the unchunked run's, to rounding of the step
    grid). A chunk that stops on a non-finite state (``throw=False``) ends
    the run: later saves are ``inf`` and ``Solution.nonfinite_time`` says when. A checkpoint
    of another run (other dynamics, x0, weights, solver options, dt0 or save times: see
    :func:`run_fingerprint`) is refused, never mixed in.
    """
    if not isinstance(dynamics, AbstractDynamics):
        raise ValueError(f"dynamics must be an attention or tp.Sphere(attention), got "
                         f"{type(dynamics).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise ValueError(f"checkpoint must be a tp.runs.Checkpoint or None, got {type(checkpoint).__name__}")
    if "adjoint" in solve_kwargs:
        raise ValueError("solve_checkpointed writes files between chunks and does not support "
                         "gradients; use tp.solve for differentiable runs")
    if checkpoint is not None:
        if every is not None and check_every(every) != checkpoint.every:
            raise ValueError(f"every={every} differs from the checkpoint's every={checkpoint.every}")
        every = checkpoint.every
    every = DEFAULT_EVERY if every is None else check_every(every)
    name = "solve" if checkpoint is None else checkpoint.name

    x0 = dynamics.check_state(x0, "x0")
    dtype = x0.dtype
    w = check_weights(weights, x0.shape[0], dtype)
    t0f = float(t0)
    ts, stats = _save_times(saveat, t0f, float(t1), dtype)
    if solve_kwargs.get("noise") is not None and solve_kwargs.get("brownian_interval") is None:
        # one Brownian tree over [t0, t1] for all chunks: the chunked run follows the same path
        # as tp.solve(..., t0=t0, t1=t1, noise=..., key=...)
        solve_kwargs["brownian_interval"] = (t0f, float(t1))
    chunks = _chunks(len(ts), every)
    width = len(chunks[0])

    if stats is None:
        out_struct = jax.ShapeDtypeStruct(x0.shape, dtype)
    else:
        out_struct = jax.eval_shape(stats, jnp.zeros((), dtype), x0, None)
    leaves_struct, treedef = jax.tree_util.tree_flatten(out_struct)
    chunk_fn = None if stats is None else (lambda t, x, args: (stats(t, x, args), x))

    # identity of the run: resuming with different inputs must fail loudly, not mix runs. The
    # fingerprint hashes everything that determines the run: the dynamics (parameters and static
    # configuration), x0 and weights to the bit, the solver options, dt0 and the save times.
    signature = {
        "format": _FORMAT, "every": every, "num_chunks": len(chunks),
        "ts": [float(t) for t in ts], "t0": t0f, "x0_shape": list(x0.shape), "dtype": str(dtype),
        "x0_sum": float(np.sum(np.asarray(x0, np.float64))),
        "run": run_fingerprint(dynamics=dynamics, x0=x0, weights=w, dt0=dt0, saveat_fn=stats,
                               solve_options=solve_kwargs),
    }

    start = 0
    outputs: list[list[np.ndarray]] = []
    num_steps = 0
    x = x0
    if checkpoint is not None:
        man = checkpoint.manifest(name)
        if man is not None:
            diff = sorted(k for k in signature if man.get(k) != signature[k])
            if diff:
                raise ValueError(f"checkpoint {checkpoint.stage_dir(name)} belongs to a different run "
                                 f"(mismatch in {diff}); use a fresh output directory")
            start = int(man["completed"])
            for j in range(start):
                data = checkpoint.read_chunk(name, j, signature["run"])
                outputs.append([data[f"out_{i}"] for i in range(len(leaves_struct))])
                num_steps += int(data["num_steps"])
            if start:
                x = jnp.asarray(data["state"], dtype)  # the end state of the last chunk

    bar = None
    if progress and start < len(chunks):
        from tqdm.auto import tqdm

        bar = tqdm(total=len(chunks), initial=start, desc=f"{name} (chunks)", unit="chunk")
    nonfinite_time = np.inf
    result = diffrax.RESULTS.successful
    try:
        for j in range(start, len(chunks)):
            idx = chunks[j]
            a = t0f if j == 0 else float(ts[idx.start - 1])
            b = float(ts[idx[-1]])
            save = jnp.asarray(ts[idx.start: idx.stop], dtype)
            if b > a:
                # a short last chunk repeats its final time, keeping one shape (one compile)
                padded = jnp.concatenate([save, jnp.full((width - len(idx),), b, dtype)])
                chunk_saveat = padded if stats is None else diffrax.SaveAt(ts=padded, fn=chunk_fn)
                sol = solve(dynamics, Particles(x, w), t0=a, t1=b, dt0=dt0, saveat=chunk_saveat,
                            throw=throw, **solve_kwargs)
                if stats is None:
                    out, x_end = sol.xs, sol.xs[-1]
                else:
                    out, xs_chunk = sol.stats
                    x_end = xs_chunk[-1]
                out = jax.tree_util.tree_map(lambda o: o[: len(idx)], out)
                steps = int(sol.num_steps)
                nf = float(sol.nonfinite_time) if sol.nonfinite_time is not None else np.inf
                if not sol.succeeded and sol.result != diffrax.RESULTS.event_occurred:
                    result = sol.result
            else:  # every save time of this chunk equals its start: nothing to integrate
                xr = retract_at(dynamics, x, save[0])
                out = (jnp.broadcast_to(xr, (len(idx),) + xr.shape) if stats is None else
                       jax.tree_util.tree_map(lambda *l: jnp.stack(l), *[stats(t, xr, None) for t in save]))
                x_end, steps, nf = xr, 0, np.inf
            leaves = [np.asarray(v) for v in jax.tree_util.tree_leaves(out)]
            outputs.append(leaves)
            num_steps += steps
            if np.isfinite(nf) or result != diffrax.RESULTS.successful:
                nonfinite_time = nf
                if np.isfinite(nf):
                    result = diffrax.RESULTS.event_occurred
                break  # a failed chunk is not checkpointed: a resume retries it
            if checkpoint is not None:
                arrays = {f"out_{i}": v for i, v in enumerate(leaves)}
                arrays["state"] = np.asarray(x_end)
                arrays["num_steps"] = np.asarray(steps)
                checkpoint.write_chunk(name, j, arrays, signature)
                if checkpoint.safe_point is not None:
                    checkpoint.safe_point()
            x = x_end
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()

    # pad the saves after a stopped run with inf, as diffrax does
    done = sum(len(chunks[j]) for j in range(len(outputs)))
    cat = [np.concatenate([o[i] for o in outputs], axis=0) for i in range(len(leaves_struct))]
    if done < len(ts):
        cat = [np.concatenate([c, np.full((len(ts) - done,) + c.shape[1:], np.inf, c.dtype)])
               for c in cat]
    out = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(c) for c in cat])
    return Solution(
        ts=jnp.asarray(ts, dtype), xs=out if stats is None else None,
        stats=None if stats is None else out, weights=w, num_steps=jnp.asarray(num_steps),
        result=result, nonfinite_time=jnp.asarray(nonfinite_time, dtype),
    )


__all__ = ["run_fingerprint", "solve_checkpointed"]
