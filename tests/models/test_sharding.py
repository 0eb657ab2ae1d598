"""The token axis sharded over devices (one process, forced host devices) and over two
processes joined by jax.distributed on localhost: same numbers as one device."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.models.sharding import Sharded, shard_tokens, token_mesh

WORKER = Path(__file__).with_name("sharding_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _report(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    assert lines, f"worker printed no report:\n{stdout}"
    return json.loads(lines[-1])


@pytest.mark.slow
def test_four_host_devices_match_one_device():
    proc = subprocess.run([sys.executable, str(WORKER), "devices", "4"], capture_output=True, check=False,
                          text=True, timeout=240, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = _report(proc.stdout)
    assert report["devices"] == 4 and report["out_sharding"] == "P('tokens',)"
    expected = {"softmax", "softmax_streaming", "multihead", "multihead_shared", "causal_multihead_shared",
                "l2", "unnormalized", "sigmoid",
                "sinkhorn", "causal", "causal_streaming", "causal_alibi", "causal_sigmoid_streaming"}
    assert expected | {"sinkhorn_68", "solve"} == set(report["errors"])
    for name, err in report["errors"].items():
        assert err < 1e-12, (name, err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_jax_distributed_localhost():
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(WORKER), "distributed", port, str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env()) for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=180))
    finally:
        for p in procs:  # bounded: never leave a worker behind
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        report = _report(out)
        assert report["processes"] == 2 and report["devices"] == 2
        assert set(report["errors"]) == {"softmax", "l2", "sigmoid", "causal_streaming"}
        for name, e in report["errors"].items():
            assert e < 1e-12, (name, e)


@pytest.mark.slow
def test_one_device_mesh_and_bad_input():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 3))
    attn = tp.SoftmaxAttention.identity(3, 2.0)
    sharded = Sharded(attn)
    assert sharded.num_shards == 1 and sharded.dim == 3
    np.testing.assert_allclose(sharded.velocity(x), attn.velocity(x), rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError, match="attention variant"):
        Sharded(tp.Sphere(attn))
    with pytest.raises(ValueError, match="axis 'heads'"):
        Sharded(attn, token_mesh(), axis="heads")
    xs = shard_tokens(jnp.asarray(x), token_mesh())
    assert xs.shape == (20, 3)
