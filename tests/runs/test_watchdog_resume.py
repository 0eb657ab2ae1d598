"""A CLI run killed by the watchdog, resumed end to end (issue 25 cause 2).

The run receives SIGTERM while its main thread waits in one long compiled XLA call, where no
Python handler can run: the watchdog (``runs/signals.py``) must end the process within a few
seconds, leave the directory consistent (metadata "interrupted", only whole chunks declared,
no data yet), and ``--resume`` must finish the run with the same ``data.npz`` bytes as a run
never stopped.

The long call is placed deterministically: right after chunk K is checkpointed, the process
(a wrapper around the CLI's ``main``) starts a thread that sends it SIGTERM half a second later
and enters a compiled loop of about a minute (the one ``tests/runs/test_watchdog.py`` uses),
as a long chunk of a large run would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

OPTIONS = ["--models", "SA", "--no-animate", "--n", "32", "--d", "2", "--t1", "4", "--dt", "0.1",
           "--num-saves", "9", "--checkpoint-every", "2", "--no-progress"]
NUM_CHUNKS = 5  # ceil(9 / 2)
CHUNK = 1  # the signal lands after chunk 1 (0-based) is written

_LONG_CALL_AFTER_CHUNK = """
import os, sys, threading, time
import jax, jax.numpy as jnp
from transformer_pde.cli import main
from transformer_pde.runs import Checkpoint

write_chunk = Checkpoint.write_chunk
long_call = jax.jit(lambda x: jax.lax.fori_loop(0, 2 * 10**9, lambda i, v: v * 0.999999 + 1e-9, x))

def write_chunk_then_long_call(self, name, index, arrays, manifest):
    write_chunk(self, name, index, arrays, manifest)
    if index == int(os.environ["TEST_CHUNK"]):
        compiled = long_call.lower(jnp.ones(())).compile()
        from transformer_pde.runs.signals import _SignalState
        _SignalState.stopping = True  # the handler only records: a signal that lands before the call is the watchdog's too
        def send():
            time.sleep(0.5)
            os.kill(os.getpid(), 15)
        threading.Thread(target=send, daemon=True).start()
        compiled(jnp.ones(())).block_until_ready()  # native code: Python handlers wait
        print("the long call returned", file=sys.stderr, flush=True)

Checkpoint.write_chunk = write_chunk_then_long_call
sys.exit(main())
"""


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "transformer_pde.cli", *args], env=_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_watchdog_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    reference = tmp_path / "reference"
    res = _cli("run", "clustering", "--out", str(reference), *OPTIONS)
    assert res.returncode == 0, res.stderr

    out = tmp_path / "run"
    env = {**_env(), "TEST_CHUNK": str(CHUNK)}
    proc = subprocess.run([sys.executable, "-c", _LONG_CALL_AFTER_CHUNK, "run", "clustering", "--out", str(out),
                           *OPTIONS], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert "the long call returned" not in proc.stderr  # the watchdog ended it inside the call
    assert "stopped 3 s later by the watchdog" in proc.stderr  # its report, not a clock

    # consistent: marked interrupted by the watchdog's hook, whole chunks only, no data yet
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "interrupted"
    assert not (out / "data.npz").exists()
    manifest = json.loads((out / "checkpoints" / "trajectory_SA" / "manifest.json").read_text())
    assert manifest["completed"] == CHUNK + 1
    for j in range(manifest["completed"]):
        with np.load(out / "checkpoints" / "trajectory_SA" / f"chunk_{j:06d}.npz") as f:
            assert np.isfinite(f["state"]).all()

    res = _cli("run", "--resume", str(out), "--no-progress")
    assert res.returncode == 0, res.stderr
    assert (out / "data.npz").read_bytes() == (reference / "data.npz").read_bytes()
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["resumed"] == 1
    assert not (out / "checkpoints").exists()
