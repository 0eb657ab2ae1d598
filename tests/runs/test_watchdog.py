"""A signal stops a run inside native code within seconds (issue 25 cause 2): the watchdog ends
a process whose main thread sits in one long compiled XLA call, after calling its hooks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
import jax, jax.numpy as jnp
from transformer_pde.runs.signals import on_forced_stop, stop_on_signals

marker = sys.argv[1]
# ~2·10^9 dependent multiply-adds: about a minute or more inside one compiled call
f = jax.jit(lambda x: jax.lax.fori_loop(0, 2 * 10**9, lambda i, v: v * 0.999999 + 1e-9, x))
g = f.lower(jnp.ones(())).compile()
with stop_on_signals(grace=1.0):
    with on_forced_stop(lambda s: open(marker, "w").write(str(s))):
        print("ready", flush=True)
        g(jnp.ones(())).block_until_ready()
print("finished", flush=True)
"""


def test_sigterm_inside_a_compiled_call_ends_the_run_within_seconds(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "JAX_PLATFORMS": "cpu"}
    marker = tmp_path / "hook"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(marker)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # inside the compiled call
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - sent
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert elapsed < 15, elapsed  # grace 1 s; the call alone would take minutes
    assert marker.read_text() == str(int(signal.SIGTERM))  # the hook ran first
    assert "stopped 1 s later by the watchdog" in err and "finished" not in out
