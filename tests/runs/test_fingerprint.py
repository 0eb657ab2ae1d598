"""Run identity (issue 25 cause 4): a checkpoint knows what made it.

The fingerprint hashes functions by code, closure cells, defaults and globals read (not by name),
refuses what it cannot identify, and every chunk carries the run and its index: another run's
chunk, a chunk copied over another, and a damaged chunk are refused naming the file. A
checkpointed switched run (Mix-LN) passes its switch and matches the unchunked solve.
"""

from __future__ import annotations

import shutil

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.runs import Checkpoint, run_fingerprint, solve_checkpointed

D = 2
X0 = jax.random.normal(jax.random.key(0), (6, D))
TS = np.linspace(0.0, 0.4, 5)


EULER = dict(t1=0.4, dt0=0.1, solver=diffrax.Euler())


def _attn_with_v(scale):
    def V(t):
        return scale * jnp.eye(D) * (1 + t)
    return tp.SoftmaxAttention(Q=jnp.eye(D), K=jnp.eye(D), V=V)


def test_fingerprint_sees_closure_constants_defaults_and_code():
    assert run_fingerprint(_attn_with_v(1.0)) == run_fingerprint(_attn_with_v(1.0))
    assert run_fingerprint(_attn_with_v(1.0)) != run_fingerprint(_attn_with_v(2.0))

    def f(t, x, args, c=1.0):
        return c * jnp.mean(x)

    def g(t, x, args, c=2.0):
        return c * jnp.mean(x)

    g.__qualname__ = f.__qualname__  # same name, other default: another run
    assert run_fingerprint(f) != run_fingerprint(g)
    h = lambda t, x, args: jnp.mean(x)  # noqa: E731
    k = lambda t, x, args: jnp.max(x)  # noqa: E731
    assert run_fingerprint(h) != run_fingerprint(k)  # same qualname '<lambda>', other code
    assert run_fingerprint(jax.jit(h)) != run_fingerprint(jax.jit(k))
    assert run_fingerprint(jax.nn.relu) == run_fingerprint(jax.nn.relu)
    assert run_fingerprint(jax.nn.relu) != run_fingerprint(jax.nn.gelu)


def test_fingerprint_refuses_what_it_cannot_identify():
    class Opaque:
        def __call__(self, t, x, args):
            return jnp.mean(x)

    with pytest.raises(ValueError, match="cannot fingerprint saveat_fn.*memory address"):
        run_fingerprint(saveat_fn=Opaque())


def test_time_dependent_v_with_another_closure_constant_is_another_run(tmp_path, finished_dirs):
    ckpt, _ = _finished(tmp_path, finished_dirs)
    with pytest.raises(ValueError, match="different run"):
        solve_checkpointed(_attn_with_v(2.0), X0, **EULER, saveat=TS, checkpoint=ckpt)


def test_another_saveat_fn_is_another_run(tmp_path):
    ckpt = Checkpoint(tmp_path, every=2)
    attn = ATTN
    first = solve_checkpointed(attn, X0, **EULER, checkpoint=ckpt,
                               saveat=diffrax.SaveAt(ts=TS, fn=lambda t, x, a: jnp.mean(x)))
    with pytest.raises(ValueError, match="different run"):
        solve_checkpointed(attn, X0, **EULER, checkpoint=ckpt,
                           saveat=diffrax.SaveAt(ts=TS, fn=lambda t, x, a: jnp.max(x)))
    # the reference: the same statistic, unchunked
    ref = solve_checkpointed(attn, X0, **EULER, saveat=TS, every=2)
    np.testing.assert_allclose(first.stats, jnp.mean(ref.xs, axis=(1, 2)), rtol=1e-12)


ATTN = _attn_with_v(1.0)


@pytest.fixture(scope="module")
def finished_dirs(tmp_path_factory):
    """Two finished checkpoints: this run and one from another x0."""
    here, other = tmp_path_factory.mktemp("run"), tmp_path_factory.mktemp("other")
    solve_checkpointed(ATTN, X0, **EULER, saveat=TS, checkpoint=Checkpoint(here, every=2))
    solve_checkpointed(ATTN, X0 + 1.0, **EULER, saveat=TS, checkpoint=Checkpoint(other, every=2))
    return here, other


def _finished(tmp_path, finished_dirs):
    shutil.copytree(finished_dirs[0], tmp_path / "run")
    return Checkpoint(tmp_path / "run", every=2), tmp_path / "run" / "solve"


def test_a_chunk_copied_over_another_is_refused(tmp_path, finished_dirs):
    ckpt, stage = _finished(tmp_path, finished_dirs)
    shutil.copy(stage / "chunk_000000.npz", stage / "chunk_000001.npz")
    with pytest.raises(ValueError, match=r"chunk_000001\.npz is chunk 0 of its run"):
        solve_checkpointed(_attn_with_v(1.0), X0, **EULER, saveat=TS, checkpoint=ckpt)


def test_a_chunk_of_another_run_is_refused(tmp_path, finished_dirs):
    ckpt, stage = _finished(tmp_path, finished_dirs)
    shutil.copy(finished_dirs[1] / "solve" / "chunk_000001.npz", stage / "chunk_000001.npz")
    with pytest.raises(ValueError, match=r"chunk_000001\.npz belongs to another run"):
        solve_checkpointed(_attn_with_v(1.0), X0, **EULER, saveat=TS, checkpoint=ckpt)


@pytest.mark.parametrize("damage", [b"", b"garbage that is not a zip file" * 10])
def test_a_damaged_chunk_names_the_file(tmp_path, finished_dirs, damage):
    ckpt, stage = _finished(tmp_path, finished_dirs)
    (stage / "chunk_000001.npz").write_bytes(damage)
    with pytest.raises(ValueError, match=r"chunk_000001\.npz is damaged") as e:
        solve_checkpointed(ATTN, X0, **EULER, saveat=TS, checkpoint=ckpt)
    assert "pickled" not in str(e.value)


@pytest.mark.slow
def test_checkpointed_mixln_passes_its_switch(tmp_path):
    """Chunks after τ start off the sphere (Pre-LN): they are checked against the Pre-LN part."""
    attn = tp.SoftmaxAttention.identity(D, 1.0)
    mix = tp.MixLN(attn, 0.2)
    x0 = X0 / jnp.linalg.norm(X0, axis=1, keepdims=True)
    ts = np.linspace(0.0, 0.6, 4)
    opts = dict(t1=0.6, dt0=0.1, saveat=ts, solver=diffrax.Euler())
    ref = tp.layers(mix, x0, 6, 0.1)  # the architecture: 2 Post-LN layers, then 4 Pre-LN
    ckpt = Checkpoint(tmp_path, every=1)  # chunks [0.2, 0.4], [0.4, 0.6] start after τ
    sol = solve_checkpointed(mix, x0, **opts, checkpoint=ckpt)
    assert np.linalg.norm(sol.xs[-1], axis=1).max() > 1.0 + 1e-3  # left the sphere after τ
    np.testing.assert_allclose(sol.xs[-1], ref.xs[-1], rtol=1e-7)
    again = solve_checkpointed(mix, x0, **opts, checkpoint=ckpt)  # resumed
    np.testing.assert_array_equal(again.xs, sol.xs)
