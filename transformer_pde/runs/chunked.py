"""Resumable integration: ``tp.solve`` in fixed chunks of save intervals, a checkpoint after each.

A long run is cut at its save times ``ts``: chunk ``j`` integrates from the last save of
chunk ``j-1`` (``t0`` for the first chunk) to the last of its ``every`` save times, one
:func:`transformer_pde.solve` call each, and the state at that time starts chunk ``j+1``
(:meth:`~transformer_pde.solvers.AbstractState.restart`: any state resumes, particles, a Gaussian,
tracers, coupled systems, log-densities, a density on the circle, a plain ODE).
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
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..solvers import AbstractState, BlowUp, Particles, solve
from ..solvers.solve import check_times, parse_saveat
from ..solvers.states import as_state
from .checkpoint import DEFAULT_EVERY, Checkpoint, check_every
from .fingerprint import run_fingerprint

_FORMAT = 4  # 4: any state (the run's identity is its start state); 3: fingerprints over code
# and closures, chunks carry the run and their index (2: chunks are tp.solve calls with their own
# step cap; 1: one cap for all chunks)


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
    dynamics,
    state0,
    *,
    t1,
    saveat,
    t0=0.0,
    dt0=None,
    weights=None,
    checkpoint: Checkpoint | None = None,
    every: int | None = None,
    progress_meter: diffrax.AbstractProgressMeter | None = None,
    throw: bool = True,
    **solve_kwargs,
):
    """:func:`~transformer_pde.solve` in fixed chunks of ``every`` save intervals, resumable.

    Same arguments and result as ``solve`` (save times are required: the chunks are cut at
    them), for any state: ``tp.Particles`` (an ``(n, d)`` array, with ``weights=`` if not
    uniform), ``tp.Gaussian`` (a :class:`~transformer_pde.GaussianSolution`), ``tp.Tracers``,
    ``tp.Coupled``, ``tp.WithLogDensity``, ``tp.CircleDensity``, a plain ODE's pytree. With a
    ``checkpoint``, every finished chunk is written to ``checkpoint.stage_dir(checkpoint.name)``
    and a rerun with the same inputs resumes after the last complete chunk; ``every`` then comes
    from the checkpoint. Without one the run is chunked identically (``every`` or
    :data:`DEFAULT_EVERY`), so results agree bitwise either way. ``progress_meter`` (a diffrax
    progress meter, e.g. ``diffrax.TqdmProgressMeter()``) is advanced after every chunk.

    Solver options (``solver``, ``stepsize_controller``, ``max_steps``, ``noise`` and ``key``,
    ``event``, ...) pass through to ``solve`` for each chunk; a noisy run's Brownian path spans
    [t0, t1] in every chunk, so the chunks follow one Brownian path (the unchunked run's, to
    rounding of the step grid). A Gaussian's blow-up threshold is the whole run's (from Σ at t0),
    not each chunk's. A chunk that stops on a non-finite state (``throw=False``) ends the run:
    later saves are ``inf`` and ``Solution.nonfinite_time`` (``GaussianSolution.blowup_time``)
    says when (a chunked Gaussian's ``final_*`` are then its last save's). A checkpoint of another
    run (other dynamics, start state, solver options, dt0 or save times: see
    :func:`run_fingerprint`) is refused, never mixed in.

    Example:
        ```python
        import tempfile
        import jax.numpy as jnp, jax.random as jr, transformer_pde as tp

        x0 = tp.uniform_sphere(jr.key(0), n=32, d=3)
        model = tp.Sphere(tp.SoftmaxAttention.identity(d=3, beta=1.0))
        ts = jnp.linspace(0, 2, 9)
        with tempfile.TemporaryDirectory() as d:             # a rerun with the same inputs resumes here
            sol = tp.runs.solve_checkpointed(model, x0, t1=2.0, dt0=0.1, saveat=ts,
                                             checkpoint=tp.runs.Checkpoint(d, every=4))   # chunks of 4 saves
        sol.xs.shape                                            # (9, 32, 3), as one tp.solve
        ```
    """
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise ValueError(f"checkpoint must be a tp.runs.Checkpoint or None, got {type(checkpoint).__name__}")
    if "adjoint" in solve_kwargs:
        raise ValueError("solve_checkpointed writes files between chunks and does not support "
                         "gradients; use tp.solve for differentiable runs")
    if "progress" in solve_kwargs:
        raise ValueError("solve_checkpointed takes progress_meter=diffrax.TqdmProgressMeter() (advanced "
                         "after every chunk), not progress=")
    if progress_meter is not None and not isinstance(progress_meter, diffrax.AbstractProgressMeter):
        raise ValueError(f"progress_meter must be a diffrax progress meter such as "
                         f"diffrax.TqdmProgressMeter(), got {progress_meter!r}")
    if checkpoint is not None:
        if every is not None and check_every(every) != checkpoint.every:
            raise ValueError(f"every={every} differs from the checkpoint's every={checkpoint.every}")
        every = checkpoint.every
    every = DEFAULT_EVERY if every is None else check_every(every)
    name = "solve" if checkpoint is None else checkpoint.name

    if weights is not None:
        if isinstance(state0, AbstractState):
            raise ValueError(f"weights are for an (n, d) array of tokens; {type(state0).__name__} carries "
                             "its own (tp.Particles(x, weights))")
        state0 = Particles(state0, weights)
    state = as_state(dynamics, state0).prepare(dynamics)
    dtype = state.dtype
    t0f = float(t0)
    ts, stats = _save_times(saveat, t0f, float(t1), dtype)
    if stats is not None:
        state.check_statistics()
    if solve_kwargs.get("noise") is not None and solve_kwargs.get("brownian_interval") is None:
        # one Brownian path over [t0, t1] for all chunks: the chunked run follows the same path
        # as tp.solve(..., t0=t0, t1=t1, noise=..., key=...)
        solve_kwargs["brownian_interval"] = (t0f, float(t1))
    event = solve_kwargs.get("event", BlowUp())
    criterion = None if event is None else state.resolve(event)
    if event is not None and event.threshold is None and len(jax.tree_util.tree_leaves(criterion)) == 1:
        # a Gaussian's default threshold is relative to Σ at the start: the run's, not each chunk's
        solve_kwargs["event"] = eqx.tree_at(lambda e: e.threshold, event, jax.tree_util.tree_leaves(criterion)[0],
                                            is_leaf=lambda v: v is None)
    chunks = _chunks(len(ts), every)
    width = len(chunks[0])

    value0 = state.value(dynamics, state.y, jnp.asarray(t0f, dtype))
    out_struct = value0 if stats is None else jax.eval_shape(stats, jnp.zeros((), dtype), value0, None)
    leaves_struct, treedef = jax.tree_util.tree_flatten(out_struct)
    value_leaves, value_def = jax.tree_util.tree_flatten(value0)
    chunk_fn = None if stats is None else (lambda t, x, args: (stats(t, x, args), x))

    # identity of the run: resuming with different inputs must fail loudly, not mix runs. The
    # fingerprint hashes everything that determines the run: the dynamics (parameters and static
    # configuration), the start state to the bit, the solver options, dt0 and the save times (the
    # progress meter only draws).
    options = {k: v for k, v in solve_kwargs.items() if k != "progress_meter"}
    signature = {
        "format": _FORMAT, "every": every, "num_chunks": len(chunks),
        "ts": [float(t) for t in ts], "t0": t0f, "state": type(state).__name__,
        "shapes": [list(np.shape(v)) for v in value_leaves], "dtype": str(dtype),
        "run": run_fingerprint(dynamics=dynamics, state0=state, dt0=dt0, saveat_fn=stats, solve_options=options),
    }

    start = 0
    outputs: list[list[np.ndarray]] = []
    num_steps = 0
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
            if start:  # the end state of the last chunk
                end = [jnp.asarray(data[_state_key(i)], v.dtype) for i, v in enumerate(value_leaves)]
                state = state.restart(jax.tree_util.tree_unflatten(value_def, end))

    meter = None if progress_meter is None or start >= len(chunks) else progress_meter
    meter_state = None
    if meter is not None:
        meter_state = meter.step(meter.init(), jnp.asarray(start / len(chunks)))
    nonfinite_time = np.inf
    result = diffrax.RESULTS.successful
    end_value = value0
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
                sol = solve(dynamics, state, t0=a, t1=b, dt0=dt0, saveat=chunk_saveat, throw=throw,
                            **solve_kwargs)
                out, values = (state.saved_values(sol),) * 2 if stats is None else sol.stats
                out = jax.tree_util.tree_map(lambda o: o[: len(idx)], out)
                end_value = jax.tree_util.tree_map(lambda v: v[len(idx) - 1], values)
                steps = int(sol.num_steps)
                nf = _stop_time(sol)
                if not sol.succeeded and sol.result != diffrax.RESULTS.event_occurred:
                    result = sol.result
            else:  # every save time of this chunk equals its start: nothing to integrate
                end_value = state.value(dynamics, state.y, save[0])
                out = (jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (len(idx),) + v.shape), end_value)
                       if stats is None else
                       jax.tree_util.tree_map(lambda *l: jnp.stack(l), *[stats(t, end_value, None) for t in save]))
                steps, nf = 0, np.inf
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
                end_leaves = jax.tree_util.tree_leaves(end_value)
                arrays.update({_state_key(i): np.asarray(v) for i, v in enumerate(end_leaves)})
                arrays["num_steps"] = np.asarray(steps)
                checkpoint.write_chunk(name, j, arrays, signature)
                if checkpoint.safe_point is not None:
                    checkpoint.safe_point()
            state = state.restart(end_value)
            if meter is not None:
                meter_state = meter.step(meter_state, jnp.asarray((j + 1) / len(chunks)))
    finally:
        if meter is not None:
            meter.close(meter_state)

    # pad the saves after a stopped run with inf, as diffrax does
    done = sum(len(chunks[j]) for j in range(len(outputs)))
    cat = [np.concatenate([o[i] for o in outputs], axis=0) for i in range(len(leaves_struct))]
    if done < len(ts):
        cat = [np.concatenate([c, np.full((len(ts) - done,) + c.shape[1:], np.inf, c.dtype)])
               for c in cat]
    saved = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(c) for c in cat])
    times = jnp.asarray(ts, dtype)
    final_time = times[done - 1] if done else jnp.asarray(t0f, dtype)
    return state.solution(times, saved, stats is not None, jnp.asarray(nonfinite_time, dtype),
                          (final_time, end_value), jnp.asarray(num_steps), result, criterion)


def _state_key(i: int) -> str:
    """The chunk file's name of leaf i of the end state: ``state`` (particles' one leaf, what the
    run directory checks a chunk for), then ``state_1``, ``state_2``, ..."""
    return "state" if i == 0 else f"state_{i}"


def _stop_time(sol) -> float:
    """When a chunk stopped on a blow-up (inf: it did not)."""
    return np.inf if sol.stop_time is None else float(sol.stop_time)


__all__ = ["run_fingerprint", "solve_checkpointed"]
