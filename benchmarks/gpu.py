"""Everything a GPU should tell us, in one command (issue 24, item 2), as a markdown table.

    python benchmarks/gpu.py --out benchmarks/results/gpu/results.md     # on a GPU, < 10 min
    python benchmarks/gpu.py --dry-run --out /tmp/gpu.md                 # on CPU, tiny, seconds

Sections (each case's time is the median of a few calls after one compiling call):

1. **device**: JAX's platform and device kind, versions, the platforms the installed jax-finufft
   serves (``tp.kernels.fast_platforms()``), the kernel ``tp.kernels.automatic()`` takes.
2. **exact kernel**: pairs/s of one velocity evaluation n² / time, float32, d = 3 and 64, of
   ``SoftmaxAttention.identity(d, β).vector_field`` under ``jit`` (``Exact()``, its default
   layout) against ``jax.nn.dot_product_attention`` (XLA) and torch's
   ``scaled_dot_product_attention`` (if torch is installed; on CUDA when available).
3. **block sizes**: the exact streaming kernel's key/query blocks (``Exact(Streaming(kb, qb))``)
   at the largest n.
4. **fast path**: ``Fast()`` (NUFFT) at n = 10⁶, d = 3, float64 and float32, where jax-finufft
   runs on this platform; otherwise the reason it does not.
5. **large-n end to end**: the ``large-n`` experiment's compute (Euler layers on S², d = 3) at a
   size that fits the time, with the automatic backend.
6. **peak memory**: the device's peak bytes in use (``memory_stats``; the process's peak RSS on
   CPU) after each section.

The n grid shrinks with ``--max-seconds`` (a case whose predicted time, scaled by n² from the
previous n, exceeds it is skipped and recorded as such).
"""

from __future__ import annotations

import argparse
import platform as _platform
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _timed(call, repeats: int) -> tuple[float, float]:
    """(compile + first call seconds, median seconds of ``repeats`` later calls)."""
    t0 = time.perf_counter()
    _block(call())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _block(call())
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def _block(out):
    import jax

    jax.block_until_ready(out)
    return out


def _peak_bytes() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # CPU: peak RSS


def _gib(b) -> str:
    return "–" if b is None else f"{b / 2**30:.3g} GiB"


def _sphere(n, d, dtype, seed=0):
    import jax

    import transformer_pde as tp

    return tp.uniform_sphere(jax.random.key(seed), n, d, dtype=dtype)


def device_section(rows):
    import jax

    import transformer_pde as tp

    dev = jax.devices()[0]
    auto = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0)).dynamics
    choice = auto.kernel_choice(10**6, 10**6, "float64")
    rows += [
        ("device", "platform", jax.default_backend()),
        ("device", "device kind", f"{dev.device_kind} (x{jax.device_count()})"),
        ("device", "versions", f"python {_platform.python_version()}, jax {jax.__version__}"),
        ("device", "jax-finufft serves", ", ".join(sorted(tp.kernels.fast_platforms())) or "none"),
        ("device", "automatic kernel, Sphere SA d=3, n=10⁶, float64", f"{choice.path}: {choice.reason}"),
    ]


def exact_section(rows, ns, dims, repeats, max_seconds):
    import jax
    import jax.numpy as jnp

    import transformer_pde as tp

    torch = None
    try:
        import torch
    except ImportError:
        pass
    beta = {3: 4.0, 64: 1.0}
    for d in dims:
        b = beta.get(d, 1.0)
        attn = tp.SoftmaxAttention.identity(d, b, backend=tp.kernels.Exact())
        ours = jax.jit(lambda x: attn.vector_field(x, jnp.full(x.shape[0], 1.0 / x.shape[0], x.dtype), 0.0))

        def jnn(x):
            q = (b * x)[None, :, None, :]
            k = x[None, :, None, :]
            return jax.nn.dot_product_attention(q, k, k, scale=1.0)[0, :, 0, :]

        libs = {"transformer_pde Exact": jax.jit(ours), "jax.nn.dot_product_attention": jax.jit(jnn)}
        if torch is not None:
            tdev = "cuda" if torch.cuda.is_available() else "cpu"

            def sdpa(x, tdev=tdev, b=b):
                t = torch.as_tensor(jax.device_get(x), device=tdev)[None, None]
                with torch.no_grad():
                    out = torch.nn.functional.scaled_dot_product_attention(b * t, t, t, scale=1.0)
                if tdev == "cuda":
                    torch.cuda.synchronize()
                return out

            libs[f"torch SDPA ({tdev}, incl. transfer)"] = sdpa
        else:
            rows.append((f"exact d={d}", "torch SDPA", "skipped: torch is not installed"))
        for name, fn in libs.items():
            last = None
            for n in ns:
                if last is not None and last[1] * (n / last[0]) ** 2 > max_seconds:
                    rows.append((f"exact d={d}", f"{name}, n={n}",
                                 f"skipped: predicted > {max_seconds:g} s"))
                    continue
                x = _sphere(n, d, jnp.float32)
                try:
                    first, sec = _timed(lambda: fn(x), repeats)
                except Exception as e:  # noqa: BLE001 - a peer that fails is recorded, not fatal
                    rows.append((f"exact d={d}", f"{name}, n={n}", f"failed: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:160]}"))
                    break
                last = (n, sec)
                rows.append((f"exact d={d}", f"{name}, n={n}",
                             f"{n * n / sec:.3g} pairs/s ({sec * 1e3:.3g} ms; first call {first:.2g} s)"))
    rows.append(("exact", "peak memory", _gib(_peak_bytes())))


def blocks_section(rows, ns, dims, blocks, repeats):
    import jax
    import jax.numpy as jnp

    import transformer_pde as tp

    for n, d in ((n, d) for d in dims for n in ns):
        x = _sphere(n, d, jnp.float32)
        w = jnp.full(n, 1.0 / n, jnp.float32)
        for kb, qb in blocks:
            layout = tp.kernels.Streaming(kb, qb)
            attn = tp.SoftmaxAttention.identity(d, 1.0, backend=tp.kernels.Exact(layout))
            fn = jax.jit(lambda x, attn=attn: attn.vector_field(x, w, 0.0))
            first, sec = _timed(lambda: fn(x), repeats)
            rows.append((f"blocks d={d}, n={n}", f"key_block={kb}, query_block={qb}",
                         f"{n * n / sec:.3g} pairs/s ({sec * 1e3:.3g} ms)"))


def fast_section(rows, n, dtypes, repeats):
    import jax.numpy as jnp

    import transformer_pde as tp
    from transformer_pde.kernels.platforms import current_platform, no_fast_path_message

    here = current_platform()
    if here not in tp.kernels.fast_platforms():
        rows.append(("fast", "Fast() NUFFT", f"skipped: {no_fast_path_message(here)}"))
        return
    for dtype in (jnp.dtype(t) for t in dtypes):
        tol = 1e-8 if dtype == jnp.float64 else 1e-4
        x = _sphere(n, 3, dtype)
        w = jnp.full(n, 1.0 / n, dtype)
        attn = tp.SoftmaxAttention.identity(3, 1.0, backend=tp.kernels.Fast(tol=tol), dtype=dtype)
        first, sec = _timed(lambda: attn.vector_field(x, w, 0.0), repeats)
        plan = attn.kernel_choice(n, n, dtype).plan
        rows.append(("fast", f"Fast(tol={tol:g}), n={n}, {jnp.dtype(dtype).name}",
                     f"{sec:.3g} s ({plan.modes}^3 modes; first call {first:.2g} s)"))
    rows.append(("fast", "peak memory", _gib(_peak_bytes())))


def large_n_section(rows, n, t1):
    from transformer_pde.experiments import REGISTRY

    exp = REGISTRY["large-n"]
    cfg = exp.config_from_mapping({}, source="benchmarks/gpu.py", n=n, t1=t1, dt=0.2, num_saves=2,
                                  backend="auto", num_plotted=min(1000, n))
    t0 = time.perf_counter()
    res = exp.compute(cfg)
    sec = time.perf_counter() - t0
    layers = max(1, round(t1 / 0.2))
    kernel = "fast" if bool(res.arrays["fast_kernel"]) else "exact"
    rows.append(("large-n", f"n={n}, {layers} Euler layers, backend=auto ({kernel})",
                 f"{sec:.3g} s end to end (incl. compile); final overlap "
                 f"{float(res.arrays['overlap'][-1]):.4g}"))
    rows.append(("large-n", "peak memory", _gib(_peak_bytes())))


def markdown(rows) -> str:
    out = ["| section | case | result |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |".replace("\n", " ") for a, b, c in rows]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu" / "results.md",
                   help="markdown table written here")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU (a smoke test, seconds)")
    p.add_argument("--max-seconds", type=float, default=20.0,
                   help="skip an exact case predicted to take longer (one evaluation)")
    args = p.parse_args(argv)

    import jax

    if args.dry_run:
        jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_enable_x64", True)
    import transformer_pde as tp
    from transformer_pde.kernels.platforms import current_platform

    if args.dry_run:
        sizes = dict(ns=[64], dims=[3, 64], block_ns=[64], blocks=[(32, 32)], fast_n=500,
                     fast_dtypes=("float64",), large_n=64, t1=0.2, repeats=1)
    else:
        # the large-n run is float64 (as the experiment): 10⁶ tokens where the NUFFT runs here,
        # 2¹⁸ on the exact kernel (~7e10 pairs a layer)
        nufft = current_platform() in tp.kernels.fast_platforms()
        sizes = dict(ns=[4096, 16384, 65536, 262144], dims=[3, 64], block_ns=[65536, 262144],
                     blocks=[(512, None), (1024, None), (2048, 2048), (4096, 4096), (8192, 4096),
                             (4096, 8192), (8192, 8192), (16384, 4096)],
                     fast_n=10**6, fast_dtypes=("float64", "float32"),
                     large_n=10**6 if nufft else 2**18, t1=1.0, repeats=3)
    rows: list[tuple[str, str, str]] = []
    t_start = time.perf_counter()
    device_section(rows)
    # our kernel alone first, so the peak after it is ours (the peers may materialize n x n)
    blocks_section(rows, sizes["block_ns"], sizes["dims"], sizes["blocks"], sizes["repeats"])
    rows.append(("blocks", "peak memory (our exact kernel only)", _gib(_peak_bytes())))
    exact_section(rows, sizes["ns"], sizes["dims"], sizes["repeats"], args.max_seconds)
    fast_section(rows, sizes["fast_n"], sizes["fast_dtypes"], sizes["repeats"])
    large_n_section(rows, sizes["large_n"], sizes["t1"])
    rows.append(("total", "wall time", f"{time.perf_counter() - t_start:.3g} s"))
    text = (f"# benchmarks/gpu.py{' --dry-run' if args.dry_run else ''}\n\n"
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n" + markdown(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
