"""Krause attention at large n: one velocity evaluation, dense layout against the streamed one.

    python benchmarks/krause.py --n 4096 16384 --out benchmarks/results/krause

``tp.KrauseAttention.identity(d, sigma, radius, top_k)`` on n tokens uniform in [0, 1]^d
(float32), its velocity under ``jax.jit`` with ``layout=tp.kernels.Dense()`` (the n x n scores)
and with the default ``KRAUSE_LAYOUT`` (256 x 512 tiles, a running top-k merge). Reported per
case: the median wall time of ``--repeats`` evaluations after compilation, XLA's buffer
assignment (temporaries + output, ``compiled.memory_analysis()``), and the max difference between
the two layouts. A dense case whose n x n float32 scores exceed ``--dense-max-bytes`` is skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp
from transformer_pde.models.attention.krause import KRAUSE_LAYOUT


def case(n, d, layout, radius, top_k, repeats):
    attn = tp.KrauseAttention.identity(d, sigma=0.1, radius=radius, top_k=top_k, layout=layout)
    x = jax.random.uniform(jax.random.key(0), (n, d), dtype=jnp.float32)
    compiled = jax.jit(lambda a, y: a.velocity(y)).lower(attn, x).compile()
    mem = compiled.memory_analysis()
    out = jax.block_until_ready(compiled(attn, x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(attn, x))
        times.append(time.perf_counter() - t0)
    return out, {"seconds": statistics.median(times),
                 "xla_bytes": None if mem is None else int(mem.temp_size_in_bytes + mem.output_size_in_bytes)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--d", type=int, default=2)
    p.add_argument("--radius", type=float, default=0.1)
    p.add_argument("--top-k", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dense-max-bytes", type=float, default=8e9)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    rows = []
    for n in a.n:
        streamed, row_s = case(n, a.d, KRAUSE_LAYOUT, a.radius, a.top_k, a.repeats)
        row = {"n": n, "d": a.d, "radius": a.radius, "top_k": a.top_k, "streamed": row_s}
        if 4.0 * n * n * a.d <= a.dense_max_bytes:
            dense, row_d = case(n, a.d, tp.kernels.Dense(), a.radius, a.top_k, a.repeats)
            row["dense"] = row_d
            row["max_abs_difference"] = float(jnp.max(jnp.abs(dense - streamed)))
        else:
            row["dense"] = {"skipped": f"n x n x d float32 > {a.dense_max_bytes:g} bytes"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    load = open("/proc/loadavg").read().split()[:3]
    (a.out / "results.json").write_text(json.dumps({"rows": rows, "loadavg": load, "jax": jax.__version__}, indent=1))


if __name__ == "__main__":
    main()
