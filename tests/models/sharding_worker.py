"""Subprocess body for tests/models/test_sharding.py (not collected by pytest).

    python sharding_worker.py devices N          # one process, N forced host devices
    python sharding_worker.py distributed PORT I # process I of 2 joined on 127.0.0.1:PORT

Prints one JSON line {"errors": {name: max |sharded - single device| / max(1, max |single|)}}.
"""

import json
import os
import sys

mode = sys.argv[1]
if mode == "devices":
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[2])}"

import jax

jax.config.update("jax_enable_x64", True)
if mode == "distributed":
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{int(sys.argv[2])}",
                               num_processes=2, process_id=int(sys.argv[3]),
                               initialization_timeout=60)

import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from sharding_common import VEL, rel_err

import transformer_pde as tp
from transformer_pde.kernels import Exact, Streaming
from transformer_pde.models.sharding import Sharded, shard_tokens, token_mesh


def variants(d, rng):
    Q, K, V = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    return {
        "softmax": tp.SoftmaxAttention(Q, K, V, 2.0),
        "softmax_streaming": tp.SoftmaxAttention(Q, K, V, 2.0, backend=Exact(Streaming(16))),
        "multihead": tp.MultiHeadAttention.split(Q, K, V, 2, 1.5),
        # V and W shared by the heads: the heads' weights summed, their keys gathered per head
        "multihead_shared": tp.MultiHeadAttention(np.stack([Q, K]), np.stack([K, V]), V, np.eye(d) / 2, 1.5),
        "causal_multihead_shared": tp.Causal(tp.MultiHeadAttention(np.stack([Q, K]), np.stack([K, V]), V,
                                                                          np.eye(d) / 2, 1.5)),
        "l2": tp.L2Attention(Q, K, V, 0.7),
        "unnormalized": tp.UnnormalizedAttention(Q, K, V, 1.2),
        "sigmoid": tp.SigmoidAttention(Q, K, V, 1.0, bias=-0.5),
        "sinkhorn": tp.SinkhornAttention(Q, K, V, 1.0, epsilon=1.0, threshold=1e-12),
        # each shard's queries are tokens r n/D ... : the mask must use global positions
        "causal": tp.Causal(tp.SoftmaxAttention(Q, K, V, 2.0)),
        "causal_streaming": tp.Causal(tp.SoftmaxAttention(Q, K, V, 2.0, backend=Exact(Streaming(8)))),
        # ALiBi positions j/N over the n tokens, not the padded count (n = 70 on 4 devices)
        "causal_alibi": tp.Causal(tp.SoftmaxAttention(Q, K, V, 2.0), alibi=0.7, include_self=False),
        "causal_sigmoid_streaming": tp.Causal(tp.SigmoidAttention(Q, K, V, 1.0, bias=-0.5,
                                                                         layout=Streaming(8))),
    }


def main():
    rng = np.random.default_rng(0)
    d = 4
    mesh = token_mesh()
    report = {"devices": len(jax.devices()), "processes": jax.process_count(), "errors": {}}
    if mode == "devices":
        n = 70  # not a multiple of the device count: padding path
        x = rng.normal(size=(n, d))
        w = rng.random(n)
        w /= w.sum()
        x, w = jnp.asarray(x), jnp.asarray(w)
        attns = variants(d, rng)
        for name, attn in attns.items():
            ref = VEL(attn, x, w)
            # unsharded input, n = 70: padded to 72 inside
            out = VEL(Sharded(attn, mesh), x, w)
            report["errors"][name] = rel_err(out, ref)
        w68 = w[:68] / jnp.sum(w[:68])
        attn = attns["sinkhorn"]
        out = VEL(Sharded(attn, mesh), shard_tokens(x[:68], mesh), shard_tokens(w68, mesh))
        report["errors"]["sinkhorn_68"] = rel_err(out, VEL(attn, x[:68], w68))
        report["out_sharding"] = str(out.sharding.spec)
        # a whole solve on the sphere, sharded state
        attn = tp.SoftmaxAttention.identity(d, 3.0)
        x0 = tp.normalize(x[:68])
        ts = jnp.linspace(0.0, 1.0, 3)
        ref = tp.solve(tp.Sphere(attn), x0, t1=1.0, dt0=0.05, saveat=ts).xs
        out = tp.solve(tp.Sphere(Sharded(attn, mesh)), shard_tokens(x0, mesh), t1=1.0, dt0=0.05,
                       saveat=ts).xs
        report["errors"]["solve"] = rel_err(out, ref)
    else:
        n = 64
        x = rng.normal(size=(n, d))  # every process draws the same global data
        w = np.full(n, 1.0 / n)
        per = n // jax.process_count()
        rows = slice(jax.process_index() * per, (jax.process_index() + 1) * per)
        xs, ws = shard_tokens(x[rows], mesh), shard_tokens(w[rows], mesh)
        local = jax.local_devices()[0]
        for name in ("softmax", "l2", "sigmoid", "causal_streaming"):
            attn = variants(d, np.random.default_rng(1))[name]
            out = VEL(Sharded(attn, mesh), xs, ws)
            out = multihost_utils.process_allgather(out, tiled=True)
            with jax.default_device(local):
                ref = VEL(attn, jnp.asarray(x), jnp.asarray(w))
            report["errors"][name] = rel_err(out, ref)
    print(json.dumps(report), flush=True)


main()
if mode == "distributed":
    jax.distributed.shutdown()
