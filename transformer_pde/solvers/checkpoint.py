"""Resumable integration: solve in fixed chunks of save intervals, checkpoint after each.

A long run is cut at its save times ``ts``: chunk ``j`` integrates from the last save of
chunk ``j-1`` (``t0`` for the first chunk) to the last of its ``every`` save times, and the
state at that time starts chunk ``j+1``. After each chunk its outputs and end state are
written atomically (temporary file + rename), then a small manifest records how many chunks
are complete. A run killed at any instant therefore leaves either the previous or the new
checkpoint, never a half-written one, and resuming recomputes only the missing chunks.

The chunking depends only on ``(t0, saveat, every)``, never on where a run was interrupted,
so each chunk executes the same compiled program on the same input bits: a resumed run ends
bitwise equal to an uninterrupted one on the same machine. (It is *not* bitwise equal to one
unchunked :func:`~transformer_pde.solve`, whose constant-step grid runs across save times.)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_weights
from .._io import save_json, save_npz
from ..models.base import AbstractDynamics, retract_at
from .solution import Solution
from .solve import check_times, default_max_steps, parse_saveat, solve
from .states import Particles

DEFAULT_EVERY = 10
"""Default chunk length, in save intervals (the CLI's ``--checkpoint-every``)."""

_FORMAT = 1


def _check_every(every) -> int:
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise ValueError(f"checkpoint every must be an integer >= 1 (save intervals per chunk), "
                         f"got {every!r}")
    return int(every)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"checkpoint stage name must be a non-empty string of letters, digits, "
                         f"'-' and '_', got {name!r}")
    return name


class Checkpoint:
    """A directory of checkpoints, one sub-directory per named stage of a run.

    Args:
        directory: where checkpoints live (created if needed).
        every: chunk length in save intervals; a checkpoint is written after each chunk.
        name: the stage a ``tp.solve(..., checkpoint=...)`` writes to; :meth:`stage` gives
            the same directory with another stage (one per solve of a multi-solve run).

    Resumable experiments receive one from the runner and pass ``checkpoint.stage(...)`` to
    :func:`transformer_pde.solve` (see ``experiments/clustering.py``).
    """

    def __init__(self, directory, every: int = DEFAULT_EVERY, name: str = "solve"):
        self.every = _check_every(every)
        self.name = _check_name(name)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def __repr__(self):
        return f"Checkpoint({str(self.directory)!r}, every={self.every}, name={self.name!r})"

    def stage(self, name: str) -> "Checkpoint":
        """This checkpoint directory, writing to stage ``name``."""
        return Checkpoint(self.directory, self.every, name)

    def stage_dir(self, name: str) -> Path:
        return self.directory / _check_name(name)

    def manifest(self, name: str) -> dict | None:
        """The stage's manifest (``{"completed": k, ...}``), or None if it never checkpointed."""
        path = self.stage_dir(name) / "manifest.json"
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:  # atomic writes make this unreachable
            raise ValueError(f"checkpoint manifest {path} is unreadable: {e}") from e

    def write_chunk(self, name: str, index: int, arrays: dict, manifest: dict) -> None:
        """Write chunk ``index`` then the manifest that declares it complete (in that order)."""
        d = self.stage_dir(name)
        d.mkdir(parents=True, exist_ok=True)
        save_npz(d / f"chunk_{index:06d}.npz", arrays)
        save_json(d / "manifest.json", {**manifest, "completed": index + 1})

    def read_chunk(self, name: str, index: int) -> dict:
        path = self.stage_dir(name) / f"chunk_{index:06d}.npz"
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}


def run_fingerprint(*objects) -> str:
    """SHA-256 of pytrees: every array leaf to the bit (dtype, shape, bytes), every other leaf
    and the tree structure (static fields, solver and controller classes and options) by repr."""
    h = hashlib.sha256()
    leaves, treedef = jax.tree_util.tree_flatten(objects, is_leaf=lambda v: v is None)
    h.update(str(treedef).encode())
    for leaf in leaves:
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
            a = np.asarray(jax.random.key_data(leaf) if jax.dtypes.issubdtype(
                getattr(leaf, "dtype", None), jax.dtypes.prng_key) else leaf)
            h.update(f"{a.dtype}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        elif callable(leaf):
            h.update(getattr(leaf, "__qualname__", type(leaf).__name__).encode())
        else:
            h.update(repr(leaf).encode())
    return h.hexdigest()


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
    """:func:`~transformer_pde.solve` in fixed chunks of ``every`` save intervals, resumable
    (``tp.solve(..., checkpoint=...)`` calls this).

    Same arguments and result as ``solve`` (save times are required: the chunks are cut at
    them). With a ``checkpoint``, every finished chunk is written to
    ``checkpoint.stage_dir(checkpoint.name)`` and a rerun with the same inputs resumes after the last
    complete chunk; ``every`` then comes from the checkpoint. Without one the run is chunked
    identically (``every`` or :data:`DEFAULT_EVERY`), so results agree bitwise either way.

    Solver options (``solver``, ``stepsize_controller``, ``max_steps``, ...) pass through to
    ``solve`` for each chunk. A chunk that stops on a non-finite state (``throw=False``) ends
    the run: later saves are ``inf`` and ``Solution.nonfinite_time`` says when.
    """
    if not isinstance(dynamics, AbstractDynamics):
        raise ValueError(f"dynamics must be an attention or tp.Sphere(attention), got "
                         f"{type(dynamics).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise ValueError(f"checkpoint must be a tp.Checkpoint or None, got {type(checkpoint).__name__}")
    save_ts, stats = parse_saveat(saveat)
    if save_ts is None:
        raise ValueError("a checkpointed solve needs explicit save times saveat=... (chunks end there)")
    if "adjoint" in solve_kwargs:
        raise ValueError("solve_checkpointed writes files between chunks and does not support "
                         "gradients; use tp.solve for differentiable runs")
    if checkpoint is not None:
        if every is not None and _check_every(every) != checkpoint.every:
            raise ValueError(f"every={every} differs from the checkpoint's every={checkpoint.every}")
        every = checkpoint.every
    every = DEFAULT_EVERY if every is None else _check_every(every)
    name = "solve" if checkpoint is None else checkpoint.name

    x0 = dynamics.check_state(x0, "x0")
    dtype = x0.dtype
    w = check_weights(weights, x0.shape[0], dtype)
    ts = np.asarray(check_times(t0, t1, dt0, save_ts, dtype))
    t0f = float(t0)
    chunks = _chunks(len(ts), every)
    width = len(chunks[0])
    if solve_kwargs.get("max_steps") is None:
        # one static step cap for all chunks (the longest), so they share one compilation
        bounds = [t0f] + [float(ts[c[-1]]) for c in chunks]
        longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
        solve_kwargs["max_steps"] = default_max_steps(
            0.0, max(longest, 1e-300), dt0,
            solve_kwargs.get("stepsize_controller") or diffrax.ConstantStepSize())

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
        "run": run_fingerprint(dynamics, x0, w, dt0, stats, solve_kwargs),
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
                data = checkpoint.read_chunk(name, j)
                outputs.append([data[f"out_{i}"] for i in range(len(leaves_struct))])
                num_steps += int(data["num_steps"])
            if start:
                x = jnp.asarray(checkpoint.read_chunk(name, start - 1)["state"], dtype)

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


__all__ = ["Checkpoint", "DEFAULT_EVERY", "solve_checkpointed"]
