"""Subprocess body for tests/models/test_fast_attention.py (not collected by pytest).

    python fast_sharding_worker.py N     # one process, N forced host devices

The fast backends under ``tp.Sharded``: each device spreads its own tokens (type 1), the modes
are summed across devices, each evaluates its own queries (type 2). Prints one JSON line:
{"errors": {name: max |sharded - one device| / max(1, max |one device|)}, ...} and what the
compiled fast program communicates (all-gathers, elements all-reduced).
"""

import json
import os
import re
import sys

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[1])}"

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from sharding_common import VEL, rel_err  # noqa: E402

import transformer_pde as tp  # noqa: E402
from transformer_pde.kernels import Auto, Fast  # noqa: E402
from transformer_pde.models.sharding import Sharded, token_mesh  # noqa: E402


def main():
    rng = np.random.default_rng(0)
    mesh = token_mesh()
    n, d = 70, 3  # not a multiple of the device count: zero-weight padding
    x = rng.normal(size=(n, d))
    x *= rng.uniform(0.5, 1.0, (n, 1)) / np.linalg.norm(x, axis=1, keepdims=True)
    w = rng.random(n)
    x, w = jnp.asarray(x), jnp.asarray(w / w.sum())
    Q, K, V = (np.eye(d) + 0.3 * rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    auto = dict(tol=1e-9, min_speedup=0.0)
    eye4 = np.eye(4)
    x4 = jnp.concatenate([x, x[:, :1]], axis=1) / 1.5
    cases = {
        "softmax_fast": (tp.SoftmaxAttention(Q, K, V, 2.0, backend=Fast(tol=1e-10)), x),
        "multihead_fast": (tp.MultiHeadAttention.split(eye4, eye4, eye4, 2, 1.5,
                                                       backend=Fast(tol=1e-10)), x4),
        "unnormalized_fast": (tp.UnnormalizedAttention(Q, K, V, 1.2, backend=Fast(tol=1e-10)), x),
        # every token outside the box: the devices take the exact branch together (its
        # all-gathers inside a lax.switch whose index is agreed by a pmax)
        "auto_fallback": (tp.SoftmaxAttention(Q, K, V, 2.0, backend=Auto(radius=0.3, **auto)), x),
    }
    report = {"devices": len(jax.devices()), "errors": {}}
    for name, (attn, xs) in cases.items():
        ref = VEL(attn, xs, w)
        out = VEL(Sharded(attn, mesh), xs, w)
        report["errors"][name] = rel_err(out, ref)
    attn = cases["softmax_fast"][0]
    hlo = VEL.lower(Sharded(attn, mesh), x[:68], w[:68]).compile().as_text()
    report["fast_all_gathers"] = len(re.findall(r"all-gather(-start)?\(", hlo))
    sizes = []
    for m in re.finditer(r"= (\w+)\[([\d,]*)\][^=]*? all-reduce(-start)?\(", hlo):
        sizes.append(int(np.prod([int(s) for s in m.group(2).split(",") if s])))
    report["fast_all_reduce_elems"] = int(sum(sizes))
    report["modes"] = int(attn.kernel_choice(17, 68, x.dtype).plan.total_modes)
    print(json.dumps(report), flush=True)


main()
