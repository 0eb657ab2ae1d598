"""Resumable runs: kill a real CLI run (SIGTERM, SIGKILL), resume it, compare bitwise.

The oracle is the uninterrupted run of the same command: a resumed run must end with a
byte-identical ``data.npz`` (same machine). Library-level tests check the same property for
:func:`tp.runs.solve_checkpointed` in-process, plus the checkpoint's refusal to mix runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.runs import Checkpoint, InterruptedRun, solve_checkpointed
from transformer_pde.runs.signals import WATCHDOG_GRACE_S

ROOT = Path(__file__).resolve().parents[2]

# ~800 Tsit5 steps of 256 tokens in 21 checkpointed chunks; d=2 keeps the figure cheap.
OPTIONS = ["--models", "SA", "--no-animate", "--n", "256", "--d", "2", "--t1", "40", "--dt", "0.05",
           "--num-saves", "41",
           "--checkpoint-every", "2", "--no-progress"]
NUM_CHUNKS = 21  # ceil(41 / 2)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _cli(*args):
    return [sys.executable, "-m", "transformer_pde.cli", *args]


def _run(args, timeout=300):
    return subprocess.run(_cli(*args), env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    res = _run(["run", "clustering", "--out", str(out), *OPTIONS])
    assert res.returncode == 0, res.stderr
    return out


def _manifest(out: Path):
    path = out / "checkpoints" / "trajectory_SA" / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else None


def _start(args):
    return subprocess.Popen(_cli(*args), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _signal_when(proc, ready, sig: int) -> tuple[int, str]:
    """Send ``sig`` once ``ready()`` holds; ``(returncode, stderr)``."""
    deadline = time.monotonic() + 240
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"run ended before the moment to signal: {proc.communicate()}")
        time.sleep(0.005)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


# The CLI, in a process that sends itself a signal right after it checkpoints chunk K: the
# signal lands at the same point of the run however loaded the machine is (a signal sent by the
# test when it sees the manifest could arrive after the run has finished).
_SIGNAL_AFTER_CHUNK = """
import os, sys
from transformer_pde.cli import main
from transformer_pde.runs import Checkpoint

write_chunk = Checkpoint.write_chunk

def write_chunk_then_signal(self, name, index, arrays, manifest):
    write_chunk(self, name, index, arrays, manifest)
    if index == int(os.environ["TEST_SIGNAL_AFTER_CHUNK"]):
        os.kill(os.getpid(), int(os.environ["TEST_SIGNAL"]))

Checkpoint.write_chunk = write_chunk_then_signal
sys.exit(main())
"""


def _run_signalled_after_chunk(args, sig: int, chunk: int) -> tuple[int, str, int]:
    """Run the CLI with ``args``; it receives ``sig`` once chunk ``chunk`` (0-based) is written.
    Returns ``(returncode, stderr, pid)``."""
    env = {**_env(), "TEST_SIGNAL_AFTER_CHUNK": str(chunk), "TEST_SIGNAL": str(int(sig))}
    proc = subprocess.Popen([sys.executable, "-c", _SIGNAL_AFTER_CHUNK, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err, proc.pid


def _status(out: Path):
    try:
        return json.loads((out / "metadata.json").read_text())["status"]
    except (OSError, ValueError):
        return None


def _assert_consistent_unfinished(out: Path, status: str, at_least: int = 1) -> int:
    meta = json.loads((out / "metadata.json").read_text())  # parses: never half-written
    assert meta["status"] == status
    assert not (out / "data.npz").exists()
    man = _manifest(out) or {"completed": 0}
    assert at_least <= man["completed"] < NUM_CHUNKS, f"the signal did not land mid-run: {man}"
    for j in range(man["completed"]):  # every declared chunk is complete and loadable
        with np.load(out / "checkpoints" / "trajectory_SA" / f"chunk_{j:06d}.npz") as f:
            assert np.isfinite(f["state"]).all()
    return man["completed"]


@pytest.mark.slow
def test_kill_resume_interrupt_resume_is_bitwise_identical(reference, tmp_path):
    """Signals at several moments of one run and its resumptions: SIGTERM as it starts (in the
    compilation), SIGKILL mid-run (its lock is left to a dead process and taken over), SIGTERM
    mid-run, SIGTERM after the last checkpoint (while the data and figures are written). Each
    leaves a consistent directory whose status says what happened, and the end result has the
    same bytes as a run never stopped."""
    out = tmp_path / "run"
    proc = _start(["run", "clustering", "--out", str(out), *OPTIONS])
    rc, err = _signal_when(proc, lambda: _status(out) == "running", signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM, err
    # one line: the run's own stop, or the watchdog's if the signal landed in an XLA compilation
    # longer than its grace on a loaded machine (never a report of a swallowed exception)
    assert err.strip().splitlines() in ([f"interrupted (SIGTERM); the output directory is consistent. "
                                         f"Continue with: transformer-pde run --resume {out}"],
                                        [f"interrupted (SIGTERM) inside a native computation; stopped "
                                         f"{WATCHDOG_GRACE_S:g} s later by the watchdog; the output directory "
                                         f"is consistent (--resume continues it)"]), err
    done = _assert_consistent_unfinished(out, "interrupted", at_least=0)

    resume = ["run", "--resume", str(out), "--no-progress"]
    rc, _, pid = _run_signalled_after_chunk(resume, signal.SIGKILL, chunk=done + 2)
    assert rc == -signal.SIGKILL
    assert _assert_consistent_unfinished(out, "running") == done + 3  # killed: no chance to say so
    done += 3
    assert json.loads((out / ".lock").read_text())["pid"] == pid  # a dead holder's lock, taken over next

    rc, _, _ = _run_signalled_after_chunk(resume, signal.SIGTERM, chunk=done + 2)
    assert rc == 128 + signal.SIGTERM
    assert _assert_consistent_unfinished(out, "interrupted") == done + 3
    assert json.loads((out / "metadata.json").read_text())["resumed"] == 2

    # after the last checkpoint: the signal lands while the data and figures are written
    rc, err, _ = _run_signalled_after_chunk(resume, signal.SIGTERM, chunk=NUM_CHUNKS - 1)
    status = _status(out)
    assert (rc, status) in ((128 + signal.SIGTERM, "interrupted"), (0, "complete")), (rc, status, err)
    assert (out / "data.npz").exists() or status == "interrupted"
    if status == "interrupted":  # all chunks are checkpointed: the resume only writes the outputs
        res = _run(["run", "clustering", "--resume", str(out), "--no-progress"])
        assert res.returncode == 0, res.stderr
    assert (out / "data.npz").read_bytes() == (reference / "data.npz").read_bytes()
    assert (out / "config.toml").read_bytes() == (reference / "config.toml").read_bytes()
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["resumed"] == (4 if status == "interrupted" else 3)
    assert not (out / "checkpoints").exists()
    assert not list(out.glob(".*.tmp"))


# --- in-process: the library function -------------------------------------------------------

class _Crash(Exception):
    pass


def _problem():
    x0 = tp.uniform_sphere(jax.random.key(1), 24, 3)
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 2.0))
    return dyn, x0, jnp.linspace(0.0, 2.0, 9)


EULER = diffrax.Euler()  # cheap to compile; the chunking logic does not depend on the solver


@pytest.mark.slow
def test_solve_checkpointed_resume_matches_uninterrupted(tmp_path, monkeypatch):
    dyn, x0, ts = _problem()
    stats = lambda t, x, args: {"mean": jnp.mean(x, 0), "t": t}  # noqa: E731
    ref = solve_checkpointed(dyn, x0, t1=2.0, dt0=0.05, solver=EULER, saveat=ts, every=3)
    ref_stats = solve_checkpointed(dyn, x0, t1=2.0, dt0=0.05, solver=EULER, saveat=diffrax.SaveAt(ts=ts, fn=stats),
                                   every=3)
    # chunking does not change the trajectory beyond round-off (against one plain solve)
    plain = tp.solve(dyn, x0, t1=2.0, dt0=0.05, solver=EULER, saveat=ts)
    np.testing.assert_allclose(ref.xs, plain.xs, atol=1e-12)
    np.testing.assert_allclose(ref_stats.stats["mean"], jnp.mean(ref.xs, 1), atol=1e-14)

    ckpt = Checkpoint(tmp_path / "ck", every=3)
    real_write = Checkpoint.write_chunk
    calls = []

    def crashing_write(self, name, index, arrays, manifest):
        if len(calls) == 2:
            raise _Crash
        calls.append(index)
        real_write(self, name, index, arrays, manifest)

    monkeypatch.setattr(Checkpoint, "write_chunk", crashing_write)
    with pytest.raises(_Crash):
        solve_checkpointed(dyn, x0, t1=2.0, dt0=0.05, solver=EULER, saveat=ts, checkpoint=ckpt.stage("a"))
    monkeypatch.setattr(Checkpoint, "write_chunk", real_write)
    assert ckpt.manifest("a")["completed"] == 2
    res = solve_checkpointed(dyn, x0, t1=2.0, dt0=0.05, solver=EULER, saveat=ts, checkpoint=ckpt.stage("a"))
    np.testing.assert_array_equal(res.xs, ref.xs)  # bitwise
    assert int(res.num_steps) == int(ref.num_steps)
    # a finished stage resumes with no work and the same answer; stats mode too
    again = solve_checkpointed(dyn, x0, t1=2.0, dt0=0.05, solver=EULER, saveat=ts, checkpoint=ckpt.stage("a"))
    np.testing.assert_array_equal(again.xs, ref.xs)
    s1 = solve_checkpointed(dyn, x0, t1=2.0, dt0=0.05, solver=EULER, saveat=diffrax.SaveAt(ts=ts, fn=stats),
                            checkpoint=ckpt.stage("s"))
    np.testing.assert_array_equal(s1.stats["mean"], ref_stats.stats["mean"])
    np.testing.assert_array_equal(s1.stats["t"], ts)


@pytest.mark.slow
def test_checkpoint_refuses_a_different_run(tmp_path):
    dyn, x0, ts = _problem()
    ckpt = Checkpoint(tmp_path, every=4)
    solve_checkpointed(dyn, x0, t1=2.0, dt0=0.05, solver=EULER, saveat=ts, checkpoint=ckpt.stage("a"))
    with pytest.raises(ValueError, match=r"different run \(mismatch in \['run'\]\)"):
        solve_checkpointed(dyn, tp.normalize(x0[::-1] + 0.1), t1=2.0, dt0=0.05, solver=EULER, saveat=ts,
                           checkpoint=ckpt.stage("a"))
    with pytest.raises(ValueError, match="every=2 differs"):
        solve_checkpointed(dyn, x0, t1=2.0, dt0=0.05, solver=EULER, saveat=ts, checkpoint=ckpt.stage("a"),
                           every=2)


@pytest.mark.slow
def test_interrupted_runner_leaves_consistent_directory(tmp_path):
    """An exception inside compute (as SIGINT raises KeyboardInterrupt) marks the run, and
    the runner says so by type (InterruptedRun)."""
    from transformer_pde.experiments import get
    from transformer_pde.runs import run_experiment

    exp = get("clustering")
    # chunks of 10, 10, 1 save intervals
    cfg = exp.make_config(n=16, d=2, t1=2.0, dt=0.1, num_saves=21, models=("SA",), animate=False)
    real = Checkpoint.write_chunk

    def interrupt(self, name, index, arrays, manifest):
        if index == 1:
            raise KeyboardInterrupt
        real(self, name, index, arrays, manifest)

    Checkpoint.write_chunk = interrupt
    try:
        with pytest.raises(InterruptedRun) as stopped:
            run_experiment(exp, cfg, tmp_path, progress=False)
    finally:
        Checkpoint.write_chunk = real
    assert stopped.value.run_dir == tmp_path and stopped.value.signum == signal.SIGINT
    assert isinstance(stopped.value.__cause__, KeyboardInterrupt)
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta["status"] == "interrupted" and not (tmp_path / "data.npz").exists()
    # only this run continues there: other options are refused, naming the difference
    with pytest.raises(ValueError, match=r"holds an unfinished run \(interrupted\) with other options "
                                         r"\(n=16 there, 17 here\)"):
        run_experiment(exp, dataclasses.replace(cfg, n=17), tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"cannot resume the run in .* with other options \(beta=1.0 there, "
                                         r"2.0 here\)"):
        run_experiment(exp, dataclasses.replace(cfg, beta=2.0), tmp_path, progress=False, resume=True)
    with pytest.raises(ValueError, match=r"other options \(checkpoint_every=10 there, 3 here\)"):
        run_experiment(exp, cfg, tmp_path, progress=False, checkpoint_every=3)
    # the same run again continues from its checkpoint (as resume=True would)
    out = run_experiment(exp, cfg, tmp_path, progress=False)
    assert out["continued"] and json.loads((tmp_path / "metadata.json").read_text())["resumed"] == 1
    # without a checkpoint, compute integrates in the same chunks (DEFAULT_EVERY): same bits
    direct = exp.compute(cfg, False)
    np.testing.assert_array_equal(out["results"]["xs_SA"], direct["xs_SA"])
