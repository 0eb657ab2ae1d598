"""Any state resumes (runs/chunked.py): a Gaussian, a coupled system and tracers with log-densities
are killed by SIGTERM after a chunk in a real process, resumed from their checkpoint in another,
and end byte-identical to an uninterrupted chunked run."""

import os
import subprocess
import sys

import numpy as np
import pytest

_SCRIPT = r"""
import os, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np, diffrax
import transformer_pde as tp
from transformer_pde.runs import Checkpoint, solve_checkpointed, stop_on_signals
from transformer_pde.runs.signals import check_interrupt

kind, out, ckdir = sys.argv[1:4]
write_chunk = Checkpoint.write_chunk

def write_chunk_then_signal(self, name, index, arrays, manifest):
    write_chunk(self, name, index, arrays, manifest)
    if index == int(os.environ.get("TEST_SIGNAL_AFTER_CHUNK", "-1")):
        os.kill(os.getpid(), signal.SIGTERM)

Checkpoint.write_chunk = write_chunk_then_signal
attn = tp.SoftmaxAttention.identity(2, 0.2)  # its Gaussian closure blows up at t* >> 1.2
ts = jnp.linspace(0.0, 1.2, 7)
x = tp.uniform_sphere(jax.random.key(0), 12, 2) * 1.5
if kind == "gaussian":
    state = tp.Gaussian(jnp.asarray([0.3, -0.2]), jnp.asarray([[1.0, 0.2], [0.2, 0.5]]))
    kw = dict(noise=tp.Noise(0.3))
elif kind == "coupled":
    state = tp.Coupled(tp.Particles(x), tp.Gaussian(jnp.zeros(2), jnp.eye(2)))
    kw = dict(noise=tp.Noise(0.2), key=jax.random.key(4), solver=diffrax.Heun())
else:
    state = tp.WithLogDensity(tp.Tracers(tp.Gaussian(jnp.zeros(2), jnp.eye(2)), x[:5]), -0.5 * jnp.sum(x[:5] ** 2, 1))
    kw = {}
ckpt = None if ckdir == "-" else Checkpoint(ckdir, every=2, safe_point=check_interrupt)
with stop_on_signals():
    sol = solve_checkpointed(attn, state, t1=1.2, dt0=0.05, saveat=ts, checkpoint=ckpt, every=2, **kw)
leaves = jax.tree_util.tree_leaves((sol.means, sol.covs) if kind == "gaussian" else sol.xs)
np.savez(out, *[np.asarray(v) for v in leaves], steps=np.asarray(sol.num_steps))
"""


def _run(kind, out, ckdir, after_chunk=None):
    env = {k: v for k, v in os.environ.items() if k != "TEST_SIGNAL_AFTER_CHUNK"}
    env["JAX_PLATFORMS"] = "cpu"
    if after_chunk is not None:
        env["TEST_SIGNAL_AFTER_CHUNK"] = str(after_chunk)
    return subprocess.run([sys.executable, "-c", _SCRIPT, kind, str(out), str(ckdir)], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gaussian", "coupled", "log-density"])
def test_a_state_killed_after_a_chunk_resumes_byte_identically(kind, tmp_path):
    ref = _run(kind, tmp_path / "ref.npz", "-")
    assert ref.returncode == 0, ref.stderr
    killed = _run(kind, tmp_path / "run.npz", tmp_path / "ck", after_chunk=1)
    assert killed.returncode != 0 and not (tmp_path / "run.npz").exists(), killed.stderr
    manifest = (tmp_path / "ck" / "solve" / "manifest.json").read_text()
    assert '"completed": 2' in manifest  # chunks 0 and 1 on disk; the run stopped there
    resumed = _run(kind, tmp_path / "run.npz", tmp_path / "ck")
    assert resumed.returncode == 0, resumed.stderr
    with np.load(tmp_path / "ref.npz") as a, np.load(tmp_path / "run.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            assert a[k].tobytes() == b[k].tobytes(), k
        assert np.all(np.isfinite(a["arr_0"]))


def test_a_chunked_gaussian_is_the_solve_and_blows_up_where_it_does():
    import jax
    import jax.numpy as jnp

    import transformer_pde as tp

    state = tp.Gaussian(jnp.asarray([0.3, -0.2]), jnp.asarray([[1.0, 0.2], [0.2, 0.5]]))
    ts = jnp.linspace(0.0, 0.6, 7)
    slow = tp.SoftmaxAttention.identity(2, 0.2)
    chunked = tp.runs.solve_checkpointed(slow, state, t1=0.6, dt0=0.05, saveat=ts, every=2)
    plain = tp.solve(slow, state, t1=0.6, dt0=0.05, saveat=ts)
    np.testing.assert_allclose(chunked.covs, plain.covs, rtol=1e-12)
    # β = 1.5: the Riccati blow-up near t = 0.35 is found in the chunk holding it, against the
    # threshold of the whole run (1e10 tr Σ0), as by one solve (to its save grid)
    fast = tp.SoftmaxAttention.identity(2, 1.5)
    blown = tp.runs.solve_checkpointed(fast, state, t1=0.6, dt0=0.01, saveat=ts, every=2, throw=False)
    one = tp.solve(fast, state, t1=0.6, dt0=0.01, saveat=ts, throw=False)
    assert float(one.blowup_time) < 0.6 and abs(float(blown.blowup_time) - float(one.blowup_time)) < 0.02
    assert float(blown.threshold) == float(one.threshold)
    assert bool(jnp.all(jnp.isinf(blown.covs[ts > blown.blowup_time])))
    assert jax.tree_util.tree_structure(chunked) == jax.tree_util.tree_structure(plain)
