"""Benchmark: the design choices of the streaming kernel's tile (benchmarks/README.md, "Kernel design").

One process, float32, n tokens on the sphere, medians of 5 calls after compilation:

1. the weighted sum over keys of a narrow tile (d = 3) as a broadcast multiply-reduce (what
   ``kernels._weighted_sum`` does) against a matrix product;
2. the wide tile (d = 64) with the shift and bias folded in as extra columns
   ([q, -c, 1]·[k, 1, b], what ``kernels._tile_sum`` does) against added between the products;
3. ``kernels.NARROW`` (the widest values that take the broadcast form and the tall tile) at 8
   and at 64, for d = 4 .. 32: where the broadcast form stops paying.

    python benchmarks/tile_forms.py            # n = 16384, about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp
from transformer_pde import kernels


def median_seconds(f, *args, reps: int = 5) -> float:
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def sphere(n: int, d: int):
    x = jax.random.normal(jax.random.key(0), (n, d), jnp.float32)
    return x / jnp.linalg.norm(x, axis=1, keepdims=True)


def key_loop(tile, n: int, kb: int, width: int):
    """Σ over key blocks of ``tile(qa, ka_block, va_block)`` for all queries at once."""

    def run(qa, ka, va):
        def body(j, acc):
            kblk = jax.lax.dynamic_slice_in_dim(ka, j * kb, kb)
            vblk = jax.lax.dynamic_slice_in_dim(va, j * kb, kb)
            return acc + tile(qa, kblk, vblk)

        return jax.lax.fori_loop(0, n // kb, body, jnp.zeros((qa.shape[0], width), qa.dtype))

    return jax.jit(run)


def augmented(x, beta):
    n = x.shape[0]
    one = jnp.ones((n, 1), x.dtype)
    return (jnp.concatenate([beta * x, -beta * one, one], 1), jnp.concatenate([x, one, 0 * one], 1),
            jnp.concatenate([x, one], 1))


def narrow_forms(n: int):
    qa, ka, va = augmented(sphere(n, 3), 4.0)
    qb = min(n, 16384)
    forms = {
        "broadcast multiply-reduce": lambda q, k, v: jnp.sum(jnp.exp(q @ k.T)[:, :, None] * v[None], 1),
        "matrix product": lambda q, k, v: jnp.exp(q @ k.T) @ v,
    }
    for name, tile in forms.items():
        t = median_seconds(key_loop(tile, n, 512, 4), qa[:qb], ka, va)
        print(f"d = 3, tile {qb} x 512, {name}: {qb * n / t:.3g} pairs/s", flush=True)


def wide_forms(n: int):
    x = sphere(n, 64)
    qa, ka, va = augmented(x, 1.0)
    qb = min(n, 4096)

    def unfolded(q, k, v):
        p = jnp.exp(q[:, :-2] @ k[:, :-2].T + q[:, -2:-1] + k[:, -1][None, :])
        return jnp.concatenate([p @ v[:, :-1], jnp.sum(p, 1, keepdims=True)], 1)

    forms = {"shift and bias added between the products": unfolded,
             "shift and bias as extra columns": lambda q, k, v: jnp.exp(q @ k.T) @ v}
    for name, tile in forms.items():
        f = key_loop(tile, n, 512, 65)
        t = median_seconds(jax.jit(lambda q, k, v: jax.lax.map(lambda b: f(b, k, v), q)),
                           qa.reshape(-1, qb, 66), ka, va)
        print(f"d = 64, tile {qb} x 512, {name}: {n * n / t:.3g} pairs/s", flush=True)


def narrow_threshold(n: int):
    default = kernels.NARROW
    try:
        for narrow in (8, 64):
            kernels.NARROW = narrow
            for d in (4, 8, 12, 16, 24, 32):
                x, w = sphere(n, d), jnp.full((n,), 1.0 / n, jnp.float32)
                attn = tp.SoftmaxAttention.identity(d, 2.0)
                t = median_seconds(jax.jit(lambda x, w: attn.vector_field(x, w, 0.0)), x, w)
                print(f"NARROW = {narrow}, d = {d}: {n * n / t:.3g} pairs/s", flush=True)
    finally:
        kernels.NARROW = default


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16384, help="tokens (a multiple of 4096)")
    args = p.parse_args(argv)
    if args.n < 4096 or args.n % 4096:
        raise SystemExit(f"--n must be a positive multiple of 4096, got {args.n}")
    narrow_forms(args.n)
    wide_forms(args.n)
    narrow_threshold(args.n)


if __name__ == "__main__":
    main()
