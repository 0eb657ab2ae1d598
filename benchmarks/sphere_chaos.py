"""Propagation of chaos on S² against the spectral PDE (issue 40 item 5): ‖μ^n_t − ρ_t‖_{H^{−2}} vs n.

Tokens start i.i.d. from the smooth law ρ0 ∝ exp(a·x₃ + b·x₁) (against the uniform probability) and
move by ``tp.Sphere(attention)``, Q = K = V = I, β = ``--beta``, for four cases: SA and USA
(``tp.UnnormalizedAttention``, shift 0), each noiseless and with independent noise σ = ``--sigma``
on every token. The reference ρ_t is ``tp.SphereDensity`` (with the same σ) at degree ``--degree``,
checked by ``tp.solve_density`` (spatial error against degree 2L plus time-step error, max over the
saves; one checked solve per save time, so each time's error is reported; aimed below 1e-8 at t = 1).
A time whose reference error is not far below the distances is not a measurement: read the
``pde`` rows before the slopes (the noiseless density sharpens, and degree 12 does not resolve
it at t = 2, nor USA's at t = 1).

Particles (every seed of one n in one vmapped, compiled solve):
- noiseless: Tsit5 at constant step h = ``--dt`` (0.125); its step error is measured at the
  smallest n against h/2 (the H^{−2} distance between the two runs' measures, same seeds);
- noisy: Euler–Maruyama at h = ``--dt-noise`` and h/2 on one Brownian path per seed
  (``tp.BrownianGrid(dt=h/2)``), Richardson-extrapolated in the coefficients, 2μ̂_{h/2} − μ̂_h
  (weak order 2; the coefficients are linear in the measure). The plain h/2 distances are saved
  too.
The kernel is exact (``tp.kernels.Exact()``) below n = 2^``--log2-fast`` and the NUFFT kernel
(``tp.kernels.Fast(tol=--fast-tol)``) from there on. At the first fast n the run with seed 0 is
repeated with the exact kernel and the H^{−2} distance between the two is reported beside the
sampling distance; at every fast n the fast kernel's a-posteriori field bound on the initial
tokens is reported (``attn.kernel_report``).

The distance is the H^{−2} norm from the Y_lm coefficients ((1/n)Σ conj Y_lm(x_i) for the tokens,
``sphere_harmonics.negative_sobolev``), truncated at the PDE's degree; the left-out tail,
(1/n)Σ_{l>L}(2l+1)(1 + l(l+1))^{−2}, is reported relative to the mean square. For each case and
time the slope of log distance against log n is fitted with a bootstrap interval over the seeds
(``tp.statistics.fit_rate``); the prediction is −1/2. A bias check: the seeds' pooled coefficients
against the PDE, bias² = ‖mean_s μ̂_s − ρ̂‖² − var/S, as a fraction of the mean square distance
(the step, kernel and PDE errors show here; chaos's own bias is O(1/n²) of it).
The same starts at t = 0 (against ρ0's own coefficients) get the same fit and bias check (``t0``),
and each time's slope minus the t = 0 slope is fitted with the seeds paired (``minus_t0``: the line
of the seeds' mean log(d_t / d_0) against ln n, ``tp.statistics.fit_log_law``), which tells what the
dynamics do to the slope apart from the draw of the starts. ``--paired-from DIR`` adds those paired
rows to a finished run (DIR/paired.json; the run's own flags; the starts are recomputed and checked).

Coverage of the 95 % interval (``--coverage-reps`` R): at t = 0 the tokens are i.i.d. from ρ0,
so the whole procedure (same n's, same number of seeds, same degree, same fit) is repeated R
times on fresh samples; the target is the slope fitted to all R·S seeds pooled (and −1/2 is
counted too). The measured coverage is that of the interval for laws of this shape.

Default size (n = 32..512, degree 12, all four cases, coverage with 200 repetitions): 5 minutes
of CPU (user + sys), 19 minutes of wall on the 2-core box shared at load 12-18:

    python benchmarks/sphere_chaos.py --out benchmarks/results/sphere_chaos_default

Larger (the second table in benchmarks/README.md; the coverage study at this size costs about
20x the default's, so it is left to the default's):

    python benchmarks/sphere_chaos.py --cases sa,usa-noisy --log2-n-min 8 --log2-n-max 12 --log2-fast 11 \
        --degree 28 --coverage-reps 0 --out benchmarks/results/sphere_chaos

and the same with 64 seeds, one case per process (the third table; seeds 0-15 are the run above's,
bit for bit), 23 minutes of CPU:

    for c in sa usa-noisy; do python benchmarks/sphere_chaos.py --cases $c --log2-n-min 8 --log2-n-max 12 \
        --log2-fast 11 --degree 28 --coverage-reps 0 --seeds 64 --out benchmarks/results/sphere_chaos_64seeds/$c; done

With ``--out``, each finished n of a case is kept in OUT/per_n/CASE_nN.json (its seeds' distances, the
checks, the flags); ``--resume`` reuses those (refused under other flags) and runs the rest, so an
interrupted large run loses only the n in progress; ``--seed-batch B`` solves the seeds B at a time
(the same numbers, a bounded memory); ``--fit-from OUT`` refits the kept n's of the flags' range
(e.g. the top octaves alone) without rerunning. Larger n ("Larger n" in benchmarks/README.md, SA
noiseless, 16 seeds, n = 2^8 .. 2^17, 26 minutes of CPU; run first to 2^16, then resumed to 2^17):

    python benchmarks/sphere_chaos.py --cases sa --log2-n-min 8 --log2-n-max 17 --log2-fast 11 --degree 28 \
        --coverage-reps 0 --seeds 16 --out benchmarks/results/sphere_chaos_large/sa --resume
    python benchmarks/sphere_chaos.py --cases sa --log2-n-min 12 --log2-n-max 17 --log2-fast 11 --degree 28 \
        --seeds 16 --fit-from benchmarks/results/sphere_chaos_large/sa

Extend such a run by raising --log2-n-max with --resume over the same --log2-n-min: the exact-kernel
check runs at the run's first fast n (kept there), and a run starting at a large n would run it there
(the exact kernel costs n^2).

Add seeds to such a run with ``--first-seed F``: it runs seeds F .. F+S−1 (S = ``--seeds``), seed k
drawing the same starts (rng([n, k])) and, with noise, the same Brownian key (``seed_keys``: key k of
``split(key(n), F+S)``, which is key k of every longer split under JAX's default partitionable
threefry) as in any run from seed 0 holding k; every call over the seeds is padded to a multiple of 8
rows (``padded``: a call of 2 or 4 rows rounds differently, 1e-17), so its numbers are bit for bit those
of one run of F+S seeds (checked: seeds 14, 15 of the committed 16-seed runs at n = 256, 512, SA and
USA noisy, rerun with --first-seed 14 --seeds 2; the 16-seed run reruns to its committed numbers).
A run from seed 0 draws exactly what it always drew. Its n's are kept beside the first
run's, as OUT/per_n/CASE_nN_seedsF-L.json (L = F+S−1; the whole-run files as sphere_chaos_seedsF-L.json
and distances_seedsF-L.npz), and ``--fit-from`` with ``--seeds`` S' fits seeds 0 .. S'−1 pooled from the
ranges kept for each n (CASE_nN.json holds 0 .. its --seeds − 1), refusing ranges that overlap, leave
a gap, or were run under other flags; every n of the fit must have those S' seeds (the bootstrap
resamples S' seeds at every n). 16 more seeds at the top octaves of the run above, then their fit:

    python benchmarks/sphere_chaos.py --cases sa --log2-n-min 13 --log2-n-max 19 --log2-fast 11 --degree 28 \
        --coverage-reps 0 --seeds 16 --first-seed 16 --out benchmarks/results/sphere_chaos_large/sa --resume
    python benchmarks/sphere_chaos.py --cases sa --log2-n-min 13 --log2-n-max 19 --log2-fast 11 --degree 28 \
        --seeds 32 --fit-from benchmarks/results/sphere_chaos_large/sa    # fit_n8192-524288_seeds0-31.json

(``--first-seed 16 --seeds 16 --fit-from`` fits the new seeds alone.)

The four cases at a glance (the figure in benchmarks/README.md), drawn from their fits (nothing rerun;
``@1``: USA noiseless to t = 1, where its reference is resolved):

    D=benchmarks/results/sphere_chaos_large
    python benchmarks/sphere_chaos.py --out $D/chaos.png --figure-from \
        $D/sa/fit_n256-1048576.json,$D/usa/fit_n256-262144.json@1,$D/sa-noisy/fit_n256-131072.json,$D/usa-noisy-h4/fit_n256-131072.json

The cost of one fast-kernel field evaluation at large n (what n = 2^20 would cost per step):

    python benchmarks/sphere_chaos.py --time-fast 14,16,18,20
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import diffrax
import equinox as eqx
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import transformer_pde as tp  # noqa: E402
from transformer_pde.solvers import sphere_harmonics as sh  # noqa: E402

A, B = 1.0, 0.5  # ρ0 ∝ exp(A x₃ + B x₁)
ATTENTIONS = {"sa": tp.SoftmaxAttention, "usa": tp.UnnormalizedAttention}


def rho0(x):
    return np.exp(A * x[..., 2] + B * x[..., 0])


def sample(rng, n):
    """n i.i.d. points of ρ0 by rejection from the uniform law (acceptance ρ0 / max ρ0)."""
    top = np.exp(np.hypot(A, B))
    out = []
    while sum(len(o) for o in out) < n:
        x = rng.normal(size=(2 * n, 3))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out.append(x[rng.random(2 * n) < rho0(x) / top])
    return np.concatenate(out)[:n]


def rho0_coefficients(degree):
    """ρ0's own Y_lm coefficients ``(L+1, L+1)`` complex: the reference of the starts at t = 0."""
    c0 = tp.SphereDensity(rho0, degree=degree).coefficients  # (2, L+1, L+1): Re, Im
    return np.asarray(jax.lax.complex(c0[0], c0[1]))


def starts(n, seeds, size):
    """The initial tokens ``(S, size, 3)`` and weights ``(S, size)`` of the seeds in the range ``seeds``:
    seed k of size n draws from rng([n, k]), whatever the range; rows past n are the north pole with
    weight 0 (they move but act on nothing), so every n up to ``size`` runs one compiled program."""
    x = np.stack([sample(np.random.default_rng([int(n), k]), int(n)) for k in seeds])
    x = np.concatenate([x, np.tile([0.0, 0.0, 1.0], (len(seeds), size - n, 1))], 1)
    w = np.concatenate([np.full((len(seeds), n), 1.0 / n), np.zeros((len(seeds), size - n))], 1)
    return jnp.asarray(x), jnp.asarray(w)


def seed_keys(seed, seeds):
    """The Brownian keys of the seeds in the range ``seeds``: ``split(key(seed), seeds.stop)[seeds.start:]``,
    so a run of seeds 0..S-1 keeps the keys it always had (``split(key(seed), S)``). Seed k's key is the
    same in every range holding k only where key k of ``split`` depends on k alone: threefry with
    ``jax_threefry_partitionable`` (the default since JAX 0.5; the original threefry split mixes the
    counters of k and k + S), so a range not starting at 0 is refused without it."""
    if seeds.start > 0 and not (jax.config.jax_threefry_partitionable
                                and jax.config.jax_default_prng_impl == "threefry2x32"):
        raise ValueError(f"--first-seed {seeds.start} with noise needs the partitionable threefry PRNG (seed k's key "
                         f"then depends on k alone); got jax_default_prng_impl={jax.config.jax_default_prng_impl!r}, "
                         f"jax_threefry_partitionable={jax.config.jax_threefry_partitionable}")
    return jax.random.split(jax.random.key(seed), seeds.stop)[seeds.start:]


@eqx.filter_jit
def coefficients(xs, ws, degree):
    """μ̂ of every seed and save, ``(S, T, L+1, L+1)``, from tokens ``(S, T, n, 3)``, weights ``(S, n)``."""
    return jax.vmap(lambda x, w: jax.vmap(lambda y: sh.empirical_coefficients(y, degree, w, chunk=1024))(x))(xs, ws)


@eqx.filter_jit
def noiseless(dyn, x0s, ws, ts, h):
    return jax.vmap(lambda x, w: tp.solve(dyn, tp.Particles(x, w), t1=ts[-1], dt0=h, saveat=ts).xs)(x0s, ws)


@eqx.filter_jit
def noisy(dyn, x0s, ws, keys, ts, sigma, h, cell):
    noise = tp.Noise(sigma, path=tp.BrownianGrid(dt=cell))
    return jax.vmap(lambda x, w, k: tp.solve(dyn, tp.Particles(x, w), t1=ts[-1], dt0=h, saveat=ts, noise=noise,
                                             key=k).xs)(x0s, ws, keys)


def padded(solve, *per_seed):
    """``solve(*per_seed)`` with the seeds' rows padded to a multiple of 8 (the last repeated) and cut back,
    but for one row: XLA's CPU code for a call of 2 or 4 rows rounds differently from the same rows among
    8, 16 or 64 (1e-17 apart, measured; 16 against 64 rows agree bit for bit), so without the padding a
    seed's numbers would depend on how many seeds its run has. 16 or 64 seeds are not padded (the numbers
    runs always had); one row is left alone (the exact-kernel check of one seed: 8 rows would cost 8x)."""
    rows = per_seed[0].shape[0]
    pad = 0 if rows == 1 else -rows % 8
    return solve(*(jnp.concatenate([b, jnp.repeat(b[-1:], pad, 0)]) for b in per_seed))[:rows]


def batched(solve, batch, *per_seed):
    """``solve(*per_seed)`` over the seeds ``batch`` at a time (0: all in one call), to bound the memory at
    large n, each call ``padded``; the arrays in ``per_seed`` have the seeds first. The seeds are
    independent, so a batch is the same program on fewer rows."""
    seeds = per_seed[0].shape[0]
    size = seeds if batch == 0 else batch
    return jnp.concatenate([padded(solve, *(b[k:k + size] for b in per_seed)) for k in range(0, seeds, size)])


def particle_coefficients(dyn, x0s, ws, ts, sigma, a, degree, seed, seeds):
    """(μ̂ used for the distance, μ̂ plain) ``(S, T, L+1, L+1)`` each, of the seeds in the range ``seeds``
    (their starts ``x0s``, ``ws``; with noise, their keys ``seed_keys(seed, seeds)``)."""
    if sigma == 0.0:
        c = seed_coefficients(batched(lambda x, w: noiseless(dyn, x, w, ts, a.dt), a.seed_batch, x0s, ws), ws, degree)
        return c, c
    keys = seed_keys(seed, seeds)
    h = a.dt_noise
    coarse = seed_coefficients(batched(lambda x, w, k: noisy(dyn, x, w, k, ts, sigma, h, h / 2), a.seed_batch,
                                       x0s, ws, keys), ws, degree)
    fine = seed_coefficients(batched(lambda x, w, k: noisy(dyn, x, w, k, ts, sigma, h / 2, h / 2), a.seed_batch,
                                     x0s, ws, keys), ws, degree)
    return 2 * fine - coarse, fine


def h2(c, ref, s):
    return np.asarray(sh.negative_sobolev(c, ref, s))


def seed_coefficients(xs, ws, degree):
    """``coefficients``, ``padded``: each seed's μ̂ whatever the number of seeds in the call."""
    return padded(lambda x, w: coefficients(x, w, degree), xs, ws)


def seed_h2(c, ref, s):
    """``h2`` of each seed's coefficients ``c`` ``(S, ...)``, ``padded`` (the reduction over few rows rounds
    differently too)."""
    return padded(lambda x: h2(x, ref, s), jnp.asarray(c))


def bias_over_mean_square(c, ref, dist, s):
    """bias² = ‖mean_s μ̂_s − ref‖² − var/S over the mean square distance, per save: c ``(S, T, ...)``,
    ref ``(T, ...)``, dist ``(T, S)``."""
    seeds = c.shape[0]
    pooled = np.asarray(c).mean(0)
    var = np.sum(h2(c, pooled[None], s) ** 2, 0) / (seeds - 1)
    return (h2(pooled, ref, s) ** 2 - var / seeds) / np.mean(dist ** 2, 1)


def fit_rows(ns, dist, ts, tail, s_fit):
    rows = []
    for j, t in enumerate(ts):
        fit = tp.statistics.fit_rate(ns, dist[j], level=0.95, num_bootstrap=4000)
        rows.append({"t": float(t), "slope": fit.slope, "slope_ci95": list(fit.slope_ci),
                     "covers_-1/2": bool(fit.slope_ci[0] <= -0.5 <= fit.slope_ci[1]),
                     "mean_distance": dist[j].mean(1).tolist(),
                     "tail_over_mean_square": (tail / ns / np.mean(dist[j] ** 2, 1)).tolist()})
    return rows


def paired_rows(ns, dist, dist0, ts):
    """slope(t) − slope(0) with the seeds paired: the line of the mean log ratio log(d_t / d_0) of each
    seed against ln n (the slopes are fitted to mean logs, so this is exactly their difference), its
    interval from resampling the seeds (each seed keeps its own start)."""
    fits = [tp.statistics.fit_log_law(ns, np.log(dist[j] / dist0[0]), num_bootstrap=4000) for j in range(len(ts))]
    return [{"t": float(t), "slope_minus_t0": f.slope, "ci95": list(f.slope_ci),
             "covers_0": bool(f.slope_ci[0] <= 0.0 <= f.slope_ci[1])} for t, f in zip(ts, fits)]


def start_distances(a, ns):
    """The t = 0 distances ``(1, N, S)`` of the starts of every n, as run_case computes them."""
    ref0 = rho0_coefficients(a.degree)[None]
    dist0 = np.zeros((1, len(ns), a.seeds))
    for i, n in enumerate(ns):
        x0s, ws = starts(n, _seed_range(a), max(int(n), 2**a.log2_pad))
        dist0[:, i] = seed_h2(seed_coefficients(x0s[:, None], ws, a.degree), ref0[None], a.s).T
    return dist0


def paired_from(a, ts, ns, run):
    """``--paired-from DIR``: the paired rows of a finished run (its distances.npz; the starts' distances
    recomputed and checked against the run's own t = 0 means), written to DIR/paired.json (with
    ``--first-seed F``, the files of that seed range: distances_seedsF-L.npz, paired_seedsF-L.json)."""
    tag = _seed_tag(a)
    out = json.loads((run / f"sphere_chaos{tag}.json").read_text())
    if out["ns"] != ns.tolist() or out["seeds"] != a.seeds or out["degree"] != a.degree:
        raise ValueError(f"--paired-from {run}: its ns, seeds, degree {out['ns'], out['seeds'], out['degree']} differ "
                         f"from these flags' {ns.tolist(), a.seeds, a.degree}")
    dists, dist0 = np.load(run / f"distances{tag}.npz"), start_distances(a, ns)
    rows = {}
    for case in out["cases"]:
        if not np.allclose(dist0[0].mean(1), case["t0"]["mean_distance"], rtol=1e-12, atol=0):
            raise ValueError(f"--paired-from {run}: the recomputed starts do not match the run's ({case['case']})")
        rows[case["case"]] = paired_rows(ns, dists[case["case"]], dist0, ts)
    (run / f"paired{tag}.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))


def _seed_range(a):
    return range(a.first_seed, a.first_seed + a.seeds)


def _seed_tag(a, always=False):
    """The file-name tag of a run's seed range: none for seeds 0..S-1 (the names runs always had) unless
    ``always``, else ``_seedsF-L`` (F..L inclusive), so a run adding seeds writes beside the first run,
    never over it."""
    return "" if a.first_seed == 0 and not always else f"_seeds{a.first_seed}-{a.first_seed + a.seeds - 1}"


def _flags(a, name, n):
    """What one n's distances depend on: a kept n is reused only under the same flags."""
    return {"case": name, "n": int(n), "first_seed": a.first_seed, "seeds": a.seeds, "beta": a.beta,
            "sigma": a.sigma, "degree": a.degree, "s": a.s, "dt": a.dt, "dt_noise": a.dt_noise, "times": a.times,
            "log2_fast": a.log2_fast, "log2_pad": a.log2_pad, "fast_tol": a.fast_tol}  # not --seed-batch: same numbers


def _kept_flags(kept):
    """A kept n's flags; files kept before --first-seed existed hold seeds 0..S-1."""
    return {"first_seed": 0, **kept["flags"]}


def _kept_path(out, name, n, a):
    return None if out is None else out / "per_n" / f"{name}_n{int(n)}{_seed_tag(a)}.json"


def _read_kept(path, a, name, n):
    """One finished n (``--resume``), refused when it was run under other flags."""
    kept = json.loads(path.read_text())
    if _kept_flags(kept) != _flags(a, name, n):
        raise ValueError(f"--resume: {path} was run with {kept['flags']}, not these flags' {_flags(a, name, n)}")
    return kept


def _pooled_seeds(run, a, name, n):
    """The kept files of one n in run/per_n whose seed ranges tile the flags' ``--first-seed`` ..
    ``--first-seed + --seeds - 1``, in seed order: [(seed range, path, kept)]. Refused (ValueError naming
    the files) when a kept range of this n was run under other flags (its seed range aside), two kept
    ranges overlap, a range straddles the wanted one's ends, or some wanted seeds are kept nowhere."""
    want, files = _seed_range(a), []
    pattern = re.compile(rf"{re.escape(name)}_n{int(n)}(_seeds(\d+)-(\d+))?\.json")
    mine = {k: v for k, v in _flags(a, name, n).items() if k not in ("first_seed", "seeds")}
    for path in sorted((run / "per_n").glob(f"{name}_n{int(n)}*.json")):
        if pattern.fullmatch(path.name) is None:
            continue
        kept = json.loads(path.read_text())
        flags = _kept_flags(kept)
        first, count = flags.pop("first_seed"), flags.pop("seeds")
        if flags != mine:
            raise ValueError(f"--fit-from: {path} was run with {kept['flags']}, not these flags' {mine} "
                             f"(seed range aside)")
        files.append((range(first, first + count), path, kept))
    files.sort(key=lambda f: f[0].start)
    for (r1, p1, _), (r2, p2, _) in zip(files, files[1:]):
        if r2.start < r1.stop:
            raise ValueError(f"--fit-from: {p1} (seeds {r1.start}..{r1.stop - 1}) and {p2} (seeds "
                             f"{r2.start}..{r2.stop - 1}) overlap; keep one of them")
    used = [f for f in files if f[0].start < want.stop and want.start < f[0].stop]
    at = want.start
    for r, path, _ in used:
        if r.start > at:
            raise ValueError(f"--fit-from: seeds {at}..{r.start - 1} of {name} n={int(n)} are kept in no file of "
                             f"{run / 'per_n'} (the fit wants seeds {want.start}..{want.stop - 1})")
        if r.start < want.start or r.stop > want.stop:
            raise ValueError(f"--fit-from: {path} holds seeds {r.start}..{r.stop - 1}, across an end of the fit's "
                             f"seeds {want.start}..{want.stop - 1}")
        at = r.stop
    if at < want.stop:
        raise ValueError(f"--fit-from: seeds {at}..{want.stop - 1} of {name} n={int(n)} are kept in no file of "
                         f"{run / 'per_n'} (the fit wants seeds {want.start}..{want.stop - 1})")
    return used


def one_n(a, ts, n, sigma, exact, fast, ref_c, ref0, check_step, check_exact):
    """The distances of one n (every seed), as plain lists: kept on disk as each n finishes."""
    t1 = time.perf_counter()
    seeds = _seed_range(a)
    x0s, ws = starts(n, seeds, max(int(n), 2**a.log2_pad))
    dyn = fast if n >= 2**a.log2_fast else exact
    c, c_plain = particle_coefficients(dyn, x0s, ws, jnp.asarray(ts), sigma, a, a.degree, int(n), seeds)
    dist, plain = seed_h2(c, ref_c[None], a.s).T, seed_h2(c_plain, ref_c[None], a.s).T  # (T, S)
    bias = bias_over_mean_square(c, ref_c, dist, a.s)
    start = seed_coefficients(x0s[:, None], ws, a.degree)
    dist0 = seed_h2(start, ref0[None], a.s).T
    bias0 = bias_over_mean_square(start, ref0, dist0, a.s)[0]
    step_check = fast_row = None
    if check_step and sigma == 0.0:  # Tsit5's step error: the same seeds at h/2
        half_step = lambda x, w: noiseless(dyn, x, w, jnp.asarray(ts), a.dt / 2)  # noqa: E731
        half = coefficients(batched(half_step, a.seed_batch, x0s, ws), ws, a.degree)
        step = h2(c, half, a.s)  # (S, T)
        step_check = {"n": int(n), "step_over_distance": (step.mean(0) / dist.mean(1)).tolist()}
    if dyn is fast:
        report = fast.dynamics.kernel_report(x0s[0], ws[0])
        fast_row = {"n": int(n), "max_field_bound": report.max_avg_bound, "max_lse_bound": report.max_lse_bound}
        if check_exact:  # the first fast n: the run's first seed again with the exact kernel
            ce, _ = particle_coefficients(exact, x0s[:1], ws[:1], jnp.asarray(ts), sigma, a, a.degree, int(n),
                                          seeds[:1])
            fast_row["fast_vs_exact_over_distance"] = (h2(c[:1], ce, a.s)[0] / dist.mean(1)).tolist()
    return {"dist": dist.tolist(), "plain": plain.tolist(), "bias": bias.tolist(), "dist0": dist0[0].tolist(),
            "bias0": float(bias0), "step_check": step_check, "fast_row": fast_row,
            "seconds": time.perf_counter() - t1}


def fit_from(a, ts, ns, tail, cases, run):
    """``--fit-from DIR``: the fits over this run's n range (the flags' ``--log2-n-min/max``, e.g. the top
    octaves alone) from the n's kept in DIR/per_n, nothing rerun; with each n's mean log(d_t / d_0) over
    the seeds and its standard error (where the paired shift comes from). The seeds are the flags'
    ``--first-seed`` F .. F + ``--seeds`` − 1 at every n, pooled from the seed ranges kept for that n
    (CASE_nN.json and CASE_nN_seedsF-L.json, see ``_pooled_seeds``); every n has the same seeds, since
    the bootstrap resamples S seeds at each n from an (N, S) array (a range kept at some n's only is
    refused at the others: fit those n's alone). Written to DIR/fit_nLO-HI.json when each n's seeds come
    from its one CASE_nN.json (what runs wrote before seed ranges), else to DIR/fit_nLO-HI_seedsF-L.json."""
    rows, pooled = {}, False
    for name in cases:
        used = [_pooled_seeds(run, a, name, n) for n in ns]
        pooled |= any(len(u) > 1 for u in used)
        dist = np.stack([np.concatenate([np.asarray(k["dist"]) for _, _, k in u], 1) for u in used], 1)  # (T, N, S)
        dist0 = np.stack([np.concatenate([np.asarray(k["dist0"]) for _, _, k in u]) for u in used])[None]  # (1, N, S)
        ratio = np.log(dist / dist0)
        rows[name] = {"times": fit_rows(ns, dist, ts, tail, a.s), "t0": fit_rows(ns, dist0, [0.0], tail, a.s)[0],
                      "minus_t0": paired_rows(ns, dist, dist0, ts),
                      "mean_log_ratio": ratio.mean(2).tolist(),
                      "mean_log_ratio_stderr": (ratio.std(2, ddof=1) / np.sqrt(a.seeds)).tolist(),
                      "seeds_per_n": [dist.shape[2]] * len(ns),
                      "files": [[path.name for _, path, _ in u] for u in used]}
    out = {"ns": ns.tolist(), "seeds": a.seeds, "first_seed": a.first_seed, "degree": a.degree, "cases": rows}
    (run / f"fit_n{ns[0]}-{ns[-1]}{_seed_tag(a, always=pooled)}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


def references(attention, sigma, a, ts):
    """The PDE's checked solves, one per save time (each time's own error: solve_density reports the max
    over saves), and their coefficients ``(T, L+1, L+1)`` complex."""
    pde_dyn = tp.Sphere(attention.identity(3, a.beta))
    refs = [tp.solve_density(pde_dyn, tp.SphereDensity(rho0, sigma, degree=a.degree), t1=float(t), saveat=np.array([t]),
                             tol=1e-8, stepsize_controller=diffrax.PIDController(rtol=1e-11, atol=1e-13), throw=False)
            for t in ts]
    return refs, np.concatenate([np.asarray(jax.lax.complex(r.solution.xs[:, 0], r.solution.xs[:, 1])) for r in refs])


def run_case(name, a, ts, ns, tail):
    attention, sigma = ATTENTIONS[name.split("-")[0]], (a.sigma if name.endswith("-noisy") else 0.0)
    t0 = time.perf_counter()
    refs, ref_c = references(attention, sigma, a, ts)
    pde_s = time.perf_counter() - t0
    ref0 = rho0_coefficients(a.degree)[None]  # for the starts at t = 0
    exact = tp.Sphere(attention.identity(3, a.beta, backend=tp.kernels.Exact()))
    fast = tp.Sphere(attention.identity(3, a.beta, backend=tp.kernels.Fast(tol=a.fast_tol)))
    dist = np.zeros((len(ts), len(ns), a.seeds))
    plain = np.zeros_like(dist)
    bias = np.zeros((len(ts), len(ns)))
    dist0, bias0 = np.zeros((1, len(ns), a.seeds)), np.zeros(len(ns))  # the same starts at t = 0
    fast_rows, step_check, seconds = [], None, []
    first_fast = next((n for n in ns if n >= 2**a.log2_fast), None)
    for i, n in enumerate(ns):
        kept = _kept_path(a.out, name, n, a)
        if a.resume and kept is not None and kept.exists():
            r = _read_kept(kept, a, name, n)
        else:
            r = one_n(a, ts, n, sigma, exact, fast, ref_c, ref0, check_step=i == 0, check_exact=n == first_fast)
            if kept is not None:
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(json.dumps({"flags": _flags(a, name, n), "seed_batch": a.seed_batch, **r}, indent=1))
        dist[:, i], plain[:, i], bias[:, i] = r["dist"], r["plain"], r["bias"]
        dist0[0, i], bias0[i] = r["dist0"], r["bias0"]
        if r["step_check"] is not None:
            step_check = r["step_check"]
        if r["fast_row"] is not None:
            fast_rows.append(r["fast_row"])
        seconds.append(r["seconds"])
        print(f"{name} n={n}: {seconds[-1]:.1f} s, mean distance {dist[:, i].mean(1).round(5).tolist()}", flush=True)
    return {"case": name, "sigma": sigma, "times": fit_rows(ns, dist, ts, tail, a.s),
            "plain_times": fit_rows(ns, plain, ts, tail, a.s) if sigma else None,
            "bias_over_mean_square": bias.tolist(), "t0": fit_rows(ns, dist0, [0.0], tail, a.s)[0],
            "bias_over_mean_square_t0": bias0.tolist(), "minus_t0": paired_rows(ns, dist, dist0, ts),
            "step_check": step_check, "fast_kernel": fast_rows,
            "pde": [{"t": float(t), "resolution_error": r.resolution_error, "spatial_error": r.spatial_error,
                     "time_error": r.time_error, "mass_error": r.mass_error, "resolved_to_1e-8": r.resolved}
                    for t, r in zip(ts, refs)], "pde_s": pde_s, "seconds_per_n": seconds}, dist, plain


def coverage(a, ns, rho_c):
    """Coverage of fit_rate's 95 % interval at t = 0 (i.i.d. tokens), R repetitions of S seeds."""
    R, S = a.coverage_reps, a.seeds
    dist = np.zeros((len(ns), R * S))
    for i, n in enumerate(ns):
        rng = np.random.default_rng([int(n), 10**6])
        for r in range(R):
            x = jnp.asarray(np.stack([sample(rng, int(n)) for _ in range(S)]))[:, None]
            c = coefficients(x, jnp.full((S, int(n)), 1.0 / n), a.degree)[:, 0]
            dist[i, r * S:(r + 1) * S] = h2(c, rho_c[None], a.s)
    target = tp.statistics.fit_rate(ns, dist, num_bootstrap=1).slope
    cis = np.array([tp.statistics.fit_rate(ns, dist[:, r * S:(r + 1) * S], num_bootstrap=4000, seed=r).slope_ci
                    for r in range(R)])
    inside = (cis[:, 0] <= target) & (target <= cis[:, 1])
    return {"reps": R, "seeds": S, "target_slope": target, "coverage_95": float(inside.mean()),
            "coverage_95_stderr": float(np.sqrt(inside.mean() * (1 - inside.mean()) / R)),
            "covers_-1/2": float(np.mean((cis[:, 0] <= -0.5) & (-0.5 <= cis[:, 1])))}


def figure_panels(fit_files) -> list:
    """``(case, ns, rows)`` of each case of each ``FILE[@T]`` (the times above T left out)."""
    panels = []
    for item in fit_files:
        f, _, t_max = item.partition("@")
        fit = json.loads(Path(f).read_text())
        for name, rows in fit["cases"].items():
            rows = {**rows, "times": [r for r in rows["times"] if not t_max or r["t"] <= float(t_max)]}
            panels.append((name, np.asarray(fit["ns"], float), rows))
    return panels


def figure(fit_files, path: Path):
    """``--figure-from F1,F2,...``: one panel per case of each fit file (``fit_n*.json``, written by
    ``--fit-from``): the seeds' mean H^{−2} distance against n for the starts (t = 0) and at every time,
    each time's fitted slope with its 95 % interval (the line drawn with that slope through the centre
    of its points), and n^{−1/2} through the starts'. ``F@T`` draws the times up to T only (a time whose
    reference is not resolved is not a measurement: USA noiseless at t = 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = figure_panels(fit_files)
    cols = 2 if len(panels) > 2 else len(panels)
    rows_of = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_of, cols, figsize=(5.2 * cols, 4.3 * rows_of), squeeze=False, layout="constrained")
    for ax in axes.flat[len(panels):]:
        ax.set_axis_off()
    for ax, (name, ns, rows) in zip(axes.flat, panels):
        for k, row in enumerate([rows["t0"], *rows["times"]]):
            md = np.asarray(row["mean_distance"])
            lo, hi = row["slope_ci95"]
            centre = np.exp(np.mean(np.log(md))) * np.exp(row["slope"] * (np.log(ns) - np.mean(np.log(ns))))
            label = (f"t = {row['t']:g}" + (" (starts)" if k == 0 else "")
                     + f": {row['slope']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
            ax.loglog(ns, md, "o", ms=4, color=f"C{k}", label=label)
            ax.loglog(ns, centre, "-", lw=0.8, color=f"C{k}")
        d0 = np.asarray(rows["t0"]["mean_distance"])
        ax.loglog(ns, np.exp(np.mean(np.log(d0))) * (ns / np.exp(np.mean(np.log(ns)))) ** -0.5, "k--", lw=0.8,
                  label="n^(−1/2)")
        ax.set_xlabel("n (tokens)")
        ax.set_ylabel("mean ‖μⁿ_t − ρ_t‖ in H^(−2)")
        title = {"sa": "SA", "usa": "USA", "sa-noisy": "SA with noise", "usa-noisy": "USA with noise"}[name]
        ax.set_title(f"{title}: n = 2^{int(np.log2(ns[0]))} … 2^{int(np.log2(ns[-1]))}, {rows['seeds_per_n'][0]} seeds",
                     fontsize=10)
        ax.legend(fontsize=7, title="slope [95 %]", title_fontsize=7)
        ax.grid(True, which="both", lw=0.3)
    fig.suptitle("Propagation of chaos on S² against the spectral PDE (β = 1, ρ0 ∝ exp(x₃ + x₁/2))")
    tp.plot.save_figure(fig, path, trim=False)
    print(f"figure: {path}")


def time_fast(a, log2s):
    """CPU and wall seconds of one field evaluation (SA, fast kernel) at each n = 2^k, k in ``log2s``:
    a Tsit5 step is 6 of them, a noisy Euler step 1 plus the draws."""
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, a.beta, backend=tp.kernels.Fast(tol=a.fast_tol)))
    field = eqx.filter_jit(lambda x: dyn.velocity(x))
    rows = []
    for k in log2s:
        x = jnp.asarray(sample(np.random.default_rng(k), 2**k))
        field(x).block_until_ready()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(3):
            field(x).block_until_ready()
        rows.append({"n": 2**k, "cpu_s": (time.process_time() - cpu) / 3, "wall_s": (time.perf_counter() - wall) / 3})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2-n-min", type=int, default=5)
    p.add_argument("--log2-n-max", type=int, default=9)
    p.add_argument("--log2-fast", type=int, default=10, help="the fast (NUFFT) kernel from n = 2^this on")
    p.add_argument("--log2-pad", type=int, default=9,
                   help="n below 2^this is padded to it (zero weights): one compiled program for those n")
    p.add_argument("--fast-tol", type=float, default=1e-10)
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--first-seed", type=int, default=0,
                   help="run seeds F .. F+S-1 (S = --seeds), each bit for bit as in a run from seed 0; kept as "
                        "OUT/per_n/CASE_nN_seedsF-L.json, beside the first run's files (--fit-from pools the ranges)")
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--degree", type=int, default=12)
    p.add_argument("--s", type=float, default=2.0)
    p.add_argument("--dt", type=float, default=0.125)
    p.add_argument("--dt-noise", type=float, default=0.05)
    p.add_argument("--times", type=str, default="0.5,1,2")
    p.add_argument("--cases", type=str, default="sa,usa,sa-noisy,usa-noisy")
    p.add_argument("--coverage-reps", type=int, default=200)
    p.add_argument("--out", type=Path, default=None,
                   help="the results; with it each finished n of a case is kept in OUT/per_n/CASE_nN.json")
    p.add_argument("--resume", action="store_true",
                   help="reuse the n's already kept in OUT/per_n (run under the same flags) instead of rerunning them")
    p.add_argument("--seed-batch", type=int, default=0,
                   help="solve the seeds this many at a time (0: all in one vmapped solve) to bound memory at large "
                        "n; a call is padded to a multiple of 8 seeds (1 is not padded: row by row, which may round "
                        "differently)")
    p.add_argument("--paired-from", type=Path, default=None,
                   help="only add the paired slope(t) - slope(0) rows to the finished run in this folder "
                        "(give the run's own flags)")
    p.add_argument("--fit-from", type=Path, default=None,
                   help="only refit the n's of --log2-n-min..max kept in this run folder's per_n "
                        "(give the run's flags)")
    p.add_argument("--figure-from", type=str, default=None,
                   help="only draw the fits in these fit_n*.json files (comma-separated; one panel per case) "
                        "into --out (a .png path)")
    p.add_argument("--time-fast", type=str, default=None,
                   help="only time one fast-kernel field evaluation at n = 2^k for these k (e.g. 14,16,18,20)")
    a = p.parse_args(argv)
    if a.figure_from is not None:
        if a.out is None or a.out.suffix != ".png":
            raise ValueError(f"--figure-from draws into --out FIGURE.png (got --out {a.out})")
        figure(a.figure_from.split(","), a.out)
        return
    if a.time_fast is not None:
        rows = time_fast(a, [int(k) for k in a.time_fast.split(",")])
        if a.out is not None:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / "fast_field_seconds.json").write_text(json.dumps(rows, indent=1))
        return
    cases = a.cases.split(",")
    bad = [c for c in cases if c.removesuffix("-noisy") not in ATTENTIONS]
    if bad or a.seeds < 2 or a.first_seed < 0 or a.log2_n_max <= a.log2_n_min:
        raise ValueError(f"--cases must name sa, usa, sa-noisy, usa-noisy (got {bad}); --seeds >= 2 (got {a.seeds}); "
                         f"--first-seed >= 0 (got {a.first_seed}); --log2-n-max > --log2-n-min, a slope needs two "
                         f"particle counts (got {a.log2_n_min} .. {a.log2_n_max})")
    ts = np.array([float(t) for t in a.times.split(",")])
    ns = 2 ** np.arange(a.log2_n_min, a.log2_n_max + 1)
    ls = np.arange(a.degree + 1, 20 * a.degree)
    tail = np.sum((2 * ls + 1) * (1 + ls * (ls + 1.0)) ** -a.s)
    if a.paired_from is not None:
        paired_from(a, ts, ns, a.paired_from)
        return
    if a.fit_from is not None:
        fit_from(a, ts, ns, tail, cases, a.fit_from)
        return
    start = time.perf_counter()
    rows, dists = [], {}
    for name in cases:
        row, dist, plain = run_case(name, a, ts, ns, tail)
        rows.append(row)
        dists[name], dists[name + "_plain"] = dist, plain
    out = {"ns": ns.tolist(), "seeds": a.seeds, "first_seed": a.first_seed, "beta": a.beta, "degree": a.degree,
           "s": a.s, "dt": a.dt, "dt_noise": a.dt_noise, "log2_fast": a.log2_fast, "fast_tol": a.fast_tol,
           "cases": rows, "cases_s": time.perf_counter() - start, "devices": str(jax.devices())}
    tag = _seed_tag(a)  # a run adding seeds writes beside the first run's files
    if a.out is not None:  # the cases are kept before the coverage study starts
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"sphere_chaos{tag}.json").write_text(json.dumps(out, indent=1))
        np.savez(a.out / f"distances{tag}.npz", **dists)
    t0 = time.perf_counter()
    cov = coverage(a, ns, rho0_coefficients(a.degree)) if a.coverage_reps else None
    out.update(coverage_t0=cov, coverage_s=time.perf_counter() - t0, total_s=time.perf_counter() - start)
    print(json.dumps(out, indent=1))
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"sphere_chaos{tag}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
