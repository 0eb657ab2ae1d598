"""Bad inputs: every public entry point rejects them with an error naming the value.

``BAD_INPUTS`` below is the documented list (rendered in ``docs/bad_inputs.md`` by
``tests/fuzz/make_bad_inputs.py``, after the fuzz harness's table; a test keeps the two in sync). Each case is a thunk that must raise ``exc`` with a message matching
``match`` (the offending value and what was expected). Cases run outside ``jit`` (concrete
values, ``ValueError``); the ``jit``/traced layer (``eqx.error_if``) and run-time NaNs
(``NonFiniteStateError`` with the time) are tested separately below.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import cli
from transformer_pde._io import lock_directory
from transformer_pde.experiments import get as get_experiment
from transformer_pde.runs import Checkpoint, solve_checkpointed

ROOT = Path(__file__).resolve().parents[1]

E3 = jnp.eye(3)
X = tp.normalize(jnp.asarray(np.random.default_rng(0).normal(size=(5, 3))))
SA = tp.SoftmaxAttention.identity(3, 1.0)
SPH = tp.Sphere(SA)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    what: str
    thunk: object
    match: str
    exc: type = ValueError


def _nan_at(a, idx):
    a = np.array(a, dtype=float)
    a[idx] = np.nan
    return a


def _cli_error(argv, tmp_path=None):
    def run():
        args = [a.replace("{tmp}", str(tmp_path)) if tmp_path else a for a in argv]
        cli.main(args)
    return run


BAD_INPUTS = [
    # --- tokens -----------------------------------------------------------------------------
    Case("x-1d", "tokens given as a 1-D array", lambda: SA.velocity(jnp.ones(3)),
         r"x must have shape \(n, d\).*got shape \(3,\)"),
    Case("x-3d", "tokens with an extra batch axis", lambda: SA.velocity(jnp.ones((2, 4, 3))),
         r"x must have shape \(n, d\).*\(2, 4, 3\)"),
    Case("x-empty", "no tokens", lambda: SA.velocity(jnp.ones((0, 3))),
         r"at least one token.*\(0, 3\)"),
    Case("x-nan", "a NaN token coordinate", lambda: SA.velocity(_nan_at(np.ones((4, 3)), (2, 1))),
         r"x must be finite, but x\[2, 1\] = nan"),
    Case("x-inf", "an infinite token coordinate",
         lambda: SA.velocity(np.where(np.eye(4, 3) > 0, np.inf, 0.0)), r"x must be finite.*inf"),
    Case("x-complex", "complex tokens", lambda: SA.velocity(jnp.ones((4, 3), jnp.complex64)),
         r"x must be a real floating array, got dtype complex64"),
    Case("x-string", "tokens that are not numbers", lambda: SA.velocity(np.array([["a", "b", "c"]])),
         r"x must be a real floating array, got dtype <U1"),
    Case("x-dim", "token dimension differs from the attention's",
         lambda: SA.velocity(jnp.ones((4, 5))), r"x has dimension d=5 but the dynamics act on d=3"),
    Case("sphere-off", "tokens off the unit sphere for tp.Sphere",
         lambda: SPH.velocity(2 * X), r"x must lie on the unit sphere, but \|x\[0\]\| = 2"),
    Case("sphere-d1", "tp.Sphere on d = 1",
         lambda: tp.Sphere(tp.SoftmaxAttention.identity(1)).velocity(jnp.ones((3, 1))),
         r"needs d >= 2, got d=1"),
    Case("queries-dim", "field queries of the wrong dimension",
         lambda: SA.field(jnp.ones((2, 4)), X), r"queries has dimension d=4 but the dynamics act on d=3"),
    # --- weights ----------------------------------------------------------------------------
    Case("w-shape", "weights of the wrong length", lambda: SA.velocity(X, jnp.ones(4) / 4),
         r"weights must have shape \(5,\) to match 5 tokens, got shape \(4,\)"),
    Case("w-negative", "a negative weight",
         lambda: SA.velocity(X, jnp.array([0.5, 0.6, -0.1, 0.0, 0.0])),
         r"weights must be non-negative, but weights\[2\] = -0.1"),
    Case("w-sum", "weights not summing to one", lambda: SA.velocity(X, jnp.ones(5) / 4),
         r"weights must sum to 1 .*sum to 1.25"),
    Case("w-nan", "a NaN weight", lambda: SA.velocity(X, _nan_at(np.ones(5) / 5, 3)),
         r"weights must be finite, but weights\[3\] = nan"),
    # --- times ------------------------------------------------------------------------------
    Case("t1-le-t0", "t1 before t0", lambda: tp.solve(SA, X, t0=1.0, t1=0.5, dt0=0.1),
         r"Must have t1 > t0, got t0=1.0 and t1=0.5"),
    Case("t1-nan", "t1 is NaN", lambda: tp.solve(SA, X, t1=float("nan"), dt0=0.1),
         r"t1 must be finite, got nan"),
    Case("t0-inf", "t0 is infinite", lambda: tp.solve(SA, X, t0=-np.inf, t1=1.0, dt0=0.1),
         r"t0 must be finite, got -inf"),
    Case("dt0-zero", "zero step", lambda: tp.solve(SA, X, t1=1.0, dt0=0.0), r"dt0 must be > 0, got 0"),
    Case("dt0-negative", "negative step", lambda: tp.solve(SA, X, t1=1.0, dt0=-0.1),
         r"dt0 must be > 0, got -0.1"),
    Case("dt0-missing", "constant steps without dt0", lambda: tp.solve(SA, X, t1=1.0),
         r"dt0 is required with constant step sizes"),
    Case("saveat-order", "decreasing save times",
         lambda: tp.solve(SA, X, t1=1.0, dt0=0.1, saveat=jnp.array([0.5, 0.2])),
         r"saveat times must be non-decreasing, got \[0.5 0.2\]"),
    Case("saveat-range", "save time beyond t1",
         lambda: tp.solve(SA, X, t1=1.0, dt0=0.1, saveat=jnp.array([0.5, 2.0])),
         r"saveat times must lie in \[t0, t1\] = \[0.0, 1.0\], got \[0.5, 2.0\]"),
    Case("saveat-2d", "save times as a matrix",
         lambda: tp.solve(SA, X, t1=1.0, dt0=0.1, saveat=jnp.ones((2, 2))),
         r"saveat must be a non-empty 1-D array of times, got shape \(2, 2\)"),
    Case("saveat-nan", "a NaN save time",
         lambda: tp.solve(SA, X, t1=1.0, dt0=0.1, saveat=jnp.array([0.1, jnp.nan])),
         r"saveat must be finite"),
    Case("t-vector", "velocity at a vector of times", lambda: SA.velocity(X, t=jnp.ones(2)),
         r"t must be a scalar, got shape \(2,\)"),
    Case("max-steps", "max_steps < 1", lambda: tp.solve(SA, X, t1=1.0, dt0=0.1, max_steps=0),
         r"max_steps must be >= 1, got 0"),
    Case("saveat-fn-callable", "a SaveAt statistic that is not a function",
         lambda: tp.solve(SA, X, t1=1.0, dt0=0.1, saveat=diffrax.SaveAt(t1=True, fn=3)),
         r"SaveAt fn must be a callable fn\(t, y, args\), got 3"),
    Case("saveat-steps", "a SaveAt of every step (not supported: saves are at chosen times)",
         lambda: tp.solve(SA, X, t1=1.0, dt0=0.1, saveat=diffrax.SaveAt(steps=True)),
         r"solve takes diffrax.SaveAt\(ts=..., fn=...\)"),
    Case("dynamics-type", "solve of something that is not a dynamics",
         lambda: tp.solve(lambda x: x, X, t1=1.0, dt0=0.1),
         r"dynamics must be an attention or tp.Sphere\(attention\) \(a tp.AbstractDynamics of tokens\), got function"),
    Case("layers-zero", "zero layers", lambda: tp.layers(SA, X, 0, 0.1), r"num_layers must be >= 1, got 0"),
    Case("layers-step", "negative layer step", lambda: tp.layers(SA, X, 3, -0.1),
         r"step must be > 0, got -0.1"),
    Case("layers-save", "save_every not dividing num_layers",
         lambda: tp.layers(SA, X, 5, 0.1, save_every=2),
         r"save_every=2 must be >= 1 and divide num_layers=5"),
    # --- attention parameters ---------------------------------------------------------------
    Case("qk-shape", "Q and K of different shapes",
         lambda: tp.SoftmaxAttention(jnp.ones((2, 3)), E3, E3),
         r"Q and K must both have shape \(k, d\), got Q \(2, 3\) and K \(3, 3\)"),
    Case("v-square", "V not square",
         lambda: tp.L2Attention(E3, E3, jnp.ones((3, 2))),
         r"V must be square with shape \(3, 3\).*got V \(3, 2\)"),
    Case("beta-nan", "beta is NaN", lambda: tp.SoftmaxAttention(E3, E3, E3, float("nan")),
         r"SoftmaxAttention.beta must be finite, got nan"),
    Case("beta-vector", "beta is a vector", lambda: tp.SoftmaxAttention(E3, E3, E3, jnp.ones(3)),
         r"SoftmaxAttention.beta must be a scalar, got shape \(3,\)"),
    Case("q-nan", "a NaN entry in Q", lambda: tp.SoftmaxAttention(_nan_at(np.eye(3), (1, 2)), E3, E3),
         r"SoftmaxAttention.Q must be finite, but SoftmaxAttention.Q\[1, 2\] = nan"),
    Case("eps-zero", "Sinkhorn epsilon = 0", lambda: tp.SinkhornAttention(E3, E3, E3, 1.0, epsilon=0.0),
         r"SinkhornAttention.epsilon must be > 0, got 0"),
    Case("eps-negative", "Sinkhorn epsilon < 0",
         lambda: tp.SinkhornAttention(E3, E3, E3, 1.0, epsilon=-1.0), r"epsilon must be > 0, got -1"),
    Case("sinkhorn-threshold", "Sinkhorn threshold <= 0",
         lambda: tp.SinkhornAttention(E3, E3, E3, threshold=0.0), r"threshold must be > 0, got 0"),
    Case("sinkhorn-iters", "Sinkhorn max_iterations = 0",
         lambda: tp.SinkhornAttention(E3, E3, E3, max_iterations=0), r"max_iterations must be >= 1, got 0"),
    Case("sigmoid-bias", "infinite sigmoid bias",
         lambda: tp.SigmoidAttention(E3, E3, E3, 1.0, float("inf")),
         r"SigmoidAttention.bias must be finite, got inf"),
    Case("usa-shift", "NaN shift of unnormalized attention",
         lambda: tp.UnnormalizedAttention(E3, E3, E3, shift=float("nan")),
         r"UnnormalizedAttention.shift must be finite, got nan"),
    Case("mha-w", "multi-head output maps of the wrong shape",
         lambda: tp.MultiHeadAttention(jnp.ones((2, 1, 3)), jnp.ones((2, 1, 3)), jnp.ones((2, 1, 3)),
                                       jnp.ones((2, 3, 2))),
         r"W must have shape \(H, d, k_v\) = \(2, 3, 1\), or \(3, 1\) for one map shared by the heads, "
         r"got \(2, 3, 2\)"),
    Case("mha-split", "heads not dividing d",
         lambda: tp.MultiHeadAttention.split(E3, E3, E3, 2), r"num_heads=2 must divide d=3"),
    Case("key-block", "a streaming key block of 0", lambda: tp.kernels.Streaming(key_block=0),
         r"Streaming.key_block must be >= 1, got 0"),
    Case("layout", "an exact backend given a number for its layout", lambda: tp.kernels.Exact(64),
         r"Exact.layout must be an exact-kernel layout"),
    Case("pwc-dt", "PiecewiseConstant with dt <= 0",
         lambda: tp.PiecewiseConstant(jnp.ones((2, 3, 3)), 0.0, 0.0),
         r"PiecewiseConstant.dt must be > 0, got 0"),
    Case("pwc-values", "PiecewiseConstant with no layer axis",
         lambda: tp.PiecewiseConstant(jnp.asarray(1.0)),
         r"leading layer axis of length >= 1, got shape \(\)"),
    Case("sphere-sphere", "a sphere of a sphere", lambda: tp.Sphere(SPH),
         r"Sphere\(Sphere\(...\)\): the dynamics already lives on a manifold"),
    Case("sphere-wrap", "a sphere of something that is not a dynamics", lambda: tp.Sphere(E3),
         r"Sphere wraps a dynamics such as SoftmaxAttention, got ArrayImpl"),
    Case("uniform-sphere", "uniform_sphere with n = 0",
         lambda: tp.uniform_sphere(jax.random.key(0), 0, 3), r"n must be >= 1, got 0"),
    # --- Gaussians --------------------------------------------------------------------------
    Case("cov-asym", "non-symmetric covariance",
         lambda: tp.Gaussian(jnp.zeros(2), jnp.array([[1.0, 0.5], [0.0, 1.0]])),
         r"Gaussian.cov must be symmetric, but max\|cov - cov.T\| = 0.5"),
    Case("cov-not-pd", "indefinite covariance",
         lambda: tp.Gaussian(jnp.zeros(2), jnp.array([[1.0, 2.0], [2.0, 1.0]])),
         r"Gaussian.cov must be positive definite, but its smallest eigenvalue is -1"),
    Case("cov-shape", "covariance of the wrong size", lambda: tp.Gaussian(jnp.zeros(2), E3),
         r"Gaussian.cov must have shape \(2, 2\) to match mean, got \(3, 3\)"),
    Case("mean-2d", "mean given as a matrix", lambda: tp.Gaussian(E3, E3),
         r"Gaussian.mean must have shape \(d,\), got \(3, 3\)"),
    Case("mean-nan", "NaN in the mean", lambda: tp.Gaussian(_nan_at(np.zeros(3), 0), E3),
         r"Gaussian.mean must be finite, but Gaussian.mean\[0\] = nan"),
    Case("gaussian-dim", "Gaussian of the wrong dimension for the attention",
         lambda: tp.solve(SA, tp.Gaussian(jnp.zeros(2), jnp.eye(2)), t1=1.0, dt0=0.1),
         r"Gaussian has dimension 2 but the dynamics act on d=3"),
    Case("gaussian-statistics", "SaveAt statistics with a Gaussian state",
         lambda: tp.solve(SA, tp.Gaussian(jnp.zeros(3), E3), t1=1.0, dt0=0.1,
                          saveat=diffrax.SaveAt(t1=True, fn=lambda t, y, args: y)),
         r"statistics apply to particles; a Gaussian solve saves the moments"),
    Case("gaussian-closure", "a Gaussian under a variant with no closure",
         lambda: tp.solve(tp.SigmoidAttention(E3, E3, E3), tp.Gaussian(jnp.zeros(3), E3), t1=1.0, dt0=0.1),
         r"SigmoidAttention has no Gaussian closure"),
    # --- checkpointed solves ----------------------------------------------------------------
    Case("ckpt-every", "checkpoint every 0 save intervals", lambda: Checkpoint("/tmp/unused-ckpt", every=0),
         r"checkpoint every must be an integer >= 1 .*got 0"),
    Case("ckpt-saveat", "a checkpointed solve without save times",
         lambda: solve_checkpointed(SA, X, t1=1.0, dt0=0.1, saveat=None), r"needs explicit save times"),
    Case("ckpt-saveat-t1", "a checkpointed solve saving only at t1",
         lambda: solve_checkpointed(SA, X, t1=1.0, dt0=0.1, saveat=diffrax.SaveAt(t1=True)),
         r"needs explicit save times"),
    Case("ckpt-saveat-subs", "a checkpointed solve given several saves",
         lambda: solve_checkpointed(SA, X, t1=1.0, dt0=0.1, saveat=diffrax.SaveAt(
             subs=[diffrax.SubSaveAt(ts=[0.5, 1.0]), diffrax.SubSaveAt(t1=True)])),
         r"takes one save, not SaveAt\(subs"),
    Case("ckpt-saveat-late", "a checkpointed solve's save time after t1",
         lambda: solve_checkpointed(SA, X, t1=1.0, dt0=0.1, saveat=[0.5, 2.0]),
         r"saveat times must lie in \[t0, t1\]"),
    # --- experiment configs built in Python (checked like the command line's) -------------
    Case("config-list-nan", "NaN inside a list option of a config built in Python",
         lambda: get_experiment("metastability").config(theta0=(float("nan"), 1.0)),
         r"option theta0: item 0 \(nan\) must not be NaN"),
    Case("config-list-inf", "inf inside a list option (make_config)",
         lambda: get_experiment("metastability").make_config(theta0=(1.0, float("inf"))),
         r"option theta0: item 1 \(inf\) must be finite"),
    Case("config-inf", "inf for a float option of a config built in Python",
         lambda: get_experiment("clustering").config(t1=float("inf")), r"option t1 must be finite, got inf"),
    Case("config-int-range", "an integer option beyond int32",
         lambda: get_experiment("clustering").make_config(n=2**40),
         r"option n must lie in \[-2\*\*31, 2\*\*31\), got 1099511627776"),
]

# --- experiments and the command line (SystemExit(2), one line on stderr, no traceback) -----
# "{tmp}" is the directory the cli_dir fixture fills: TOML_FILES, and the run directories of
# RUN_DIRS (a "complete" clustering run there has metadata and whatever data.npz it lists).
CLI_BAD_INPUTS = [
    Case("cli-no-command", "no command at all", [], r"the following arguments are required: command"),
    Case("cli-run-no-name", "run without an experiment", ["run"],
         r"run needs an experiment NAME or --resume DIR; available: .*clustering"),
    Case("cli-list-extra", "an argument list does not take", ["list", "extra"], r"unrecognized arguments: extra"),
    Case("cli-unknown-experiment", "an experiment that does not exist", ["run", "nope"],
         r"unknown experiment 'nope'; available: .*clustering"),
    Case("cli-unknown-option", "an option the experiment does not have", ["run", "clustering", "--nope", "1"],
         r"unrecognized arguments: --nope 1"),
    Case("cli-option-type", "a non-integer for an integer option", ["run", "clustering", "--n", "abc"],
         r"argument --n: invalid int value: 'abc'"),
    Case("cli-option-value", "an option value the experiment rejects",
         ["run", "clustering", "--models", "XYZ"], r"models must be a comma-separated subset of .*got 'XYZ'"),
    Case("cli-option-nan", "NaN for a float option", ["run", "clustering", "--beta", "nan"],
         r"option beta must not be NaN"),
    Case("cli-option-inf", "inf for a float option", ["run", "clustering", "--t1", "inf"],
         r"option t1 must be finite, got inf"),
    Case("cli-option-overflow", "a float that overflows to inf", ["run", "clustering", "--beta", "1e999"],
         r"option beta must be finite, got inf"),
    Case("cli-int-range", "an integer option beyond int32 (a size no run could allocate)",
         ["run", "clustering", "--n", "3000000000"], r"option n must lie in \[-2\*\*31, 2\*\*31\), got 3000000000"),
    Case("cli-list-nan", "NaN inside a list option", ["run", "metastability", "--theta0", "nan,1"],
         r"option theta0: item 0 \(nan\) must not be NaN"),
    Case("cli-list-inf", "inf inside a list option", ["run", "metastability", "--theta0", "1,inf"],
         r"option theta0: item 1 \(inf\) must be finite"),
    Case("cli-list-empty-item", "an empty item in a list option", ["run", "metastability", "--theta0", "1,,2"],
         r"option theta0 must be a comma-separated list of float, got '1,,2'"),
    Case("cli-seed", "a negative seed", ["run", "clustering", "--seed", "-1"],
         r"option seed must be an integer in \[0, 2\*\*32\), got -1"),
    Case("cli-checkpoint-every", "--checkpoint-every 0", ["run", "clustering", "--checkpoint-every", "0"],
         r"expected an integer >= 1, got 0"),
    Case("toml-missing", "a config file that does not exist",
         ["run", "clustering", "--config", "{tmp}/missing.toml"],
         r"config file .*missing.toml' does not exist"),
    Case("toml-directory", "a directory given as the config file",
         ["run", "clustering", "--config", "{tmp}"], r"config file .* is a directory"),
    Case("toml-syntax", "a config file that is not TOML",
         ["run", "clustering", "--config", "{tmp}/syntax.toml"], r"is not valid TOML"),
    Case("toml-binary", "a binary file (not UTF-8) given as the config file",
         ["run", "clustering", "--config", "{tmp}/binary.toml"], r"binary.toml' is not valid TOML"),
    Case("toml-unknown-key", "unknown keys in a config file",
         ["run", "clustering", "--config", "{tmp}/unknown.toml"], r"unknown key\(s\) \['betta', 'nn'\]"),
    Case("toml-type", "a string where the config expects an integer",
         ["run", "clustering", "--config", "{tmp}/type.toml"], r"option n must be an integer, got '12'"),
    Case("toml-inf", "inf for a float option in a config file",
         ["run", "clustering", "--config", "{tmp}/inf.toml"], r"option beta must be finite, got inf"),
    Case("toml-list-nan", "NaN inside a list option in a config file",
         ["run", "metastability", "--config", "{tmp}/list_nan.toml"],
         r"option theta0: item 0 \(nan\) must not be NaN"),
    Case("toml-experiment", "a config file written for another experiment",
         ["run", "clustering", "--config", "{tmp}/other.toml"],
         r"is for experiment 'other', not 'clustering'"),
    Case("toml-no-experiment", "run --config FILE whose file names no experiment",
         ["run", "--config", "{tmp}/type.toml"], r"names no experiment; use transformer-pde run NAME"),
    # --- output directories --------------------------------------------------------------------
    Case("out-is-file", "--out naming a file", ["run", "clustering", "--out", "{tmp}/a_file"],
         r"output path .*a_file' exists and is not a directory"),
    Case("out-under-file", "--out below a file (the directory cannot be created)",
         ["run", "clustering", "--out", "{tmp}/a_file/run"],
         r"cannot create the output directory .*a_file/run' \(Not a directory\)"),
    Case("out-unwritable", "--out where the lock file cannot be written",
         ["run", "clustering", "--out", "{tmp}/unwritable"],
         r"cannot write in the output directory .*unwritable' \(Is a directory\)"),
    Case("out-busy", "--out that another run holds", ["run", "clustering", "--out", "{tmp}/busy"],
         r"busy' is in use by another run \(pid \d+.*\); wait for it to end, or choose another"),
    Case("run-over-unfinished", "a fresh run with other options into a directory holding an unfinished run",
         ["run", "clustering", "--seed", "5", "--out", "{tmp}/unfinished"],
         r"holds an unfinished run \(killed while running\) with other options \(seed=0 there, 5 here\); "
         r"continue it with --resume"),
    Case("run-over-failed-other-experiment", "a run of another experiment into a failed run's directory",
         ["run", "kde-modes", "--out", "{tmp}/failed"],
         r"holds an unfinished run \(failed\) with other options \(it is a run of 'clustering', not 'kde-modes'\)"),
    Case("run-other-chunking", "the same run into an unfinished run's directory with another chunk length",
         ["run", "clustering", "--checkpoint-every", "3", "--out", "{tmp}/failed"],
         r"with other options \(checkpoint_every=10 there, 3 here\)"),
    # --- resume ----------------------------------------------------------------------------
    Case("resume-missing", "--resume of a directory without a run", ["run", "--resume", "{tmp}/none"],
         r"no run there \(metadata.json is missing\)"),
    Case("resume-file", "--resume of a file", ["run", "--resume", "{tmp}/a_file"], r"a_file' is not a directory"),
    Case("resume-options", "--resume with changed options",
         ["run", "--resume", "{tmp}/unfinished", "--n", "3"],
         r"--resume continues a run with its saved options; remove --n"),
    Case("resume-truncated-metadata", "--resume of a run whose metadata.json is cut short",
         ["run", "--resume", "{tmp}/truncated_meta"], r"metadata.json is unreadable \(JSONDecodeError"),
    Case("resume-metadata-not-object", "--resume of a run whose metadata.json is not an object",
         ["run", "--resume", "{tmp}/list_meta"],
         r"metadata.json is not the metadata of a run: a JSON object was expected, found list"),
    Case("resume-metadata-experiment", "--resume of a run whose metadata names an unknown experiment",
         ["run", "--resume", "{tmp}/unknown_meta"], r"unknown experiment 'nope'"),
    Case("resume-metadata-status", "--resume of a run whose metadata has an unknown status",
         ["run", "--resume", "{tmp}/status_meta"], r"unknown status 'paused'"),
    Case("resume-other-checkpoints", "--resume whose checkpoints another run wrote (metadata edited)",
         ["run", "--resume", "{tmp}/edited"],
         r"checkpoints in .* were written by another run \(seed=1 there, 0 here\)"),
    # --- plot --------------------------------------------------------------------------------
    Case("plot-missing", "plot of a directory that does not exist", ["plot", "{tmp}/none"],
         r"none' holds no run \(metadata.json is missing; the directory does not exist\)"),
    Case("plot-no-run", "plot of a directory without a run", ["plot", "{tmp}/empty"],
         r"holds no run \(metadata.json is missing\)"),
    Case("plot-unfinished", "plot of an unfinished run", ["plot", "{tmp}/unfinished"],
         r"is not complete \(status 'running'\); finish it with --resume"),
    Case("plot-no-data", "plot of a complete run whose data.npz is gone", ["plot", "{tmp}/no_data"],
         r"holds no data.npz, though its metadata says the run is complete"),
    Case("plot-truncated-data", "plot of a run whose data.npz is cut short", ["plot", "{tmp}/truncated"],
         r"truncated/data.npz is unreadable \(BadZipFile"),
    Case("plot-garbage-data", "plot of a run whose data.npz is not an archive", ["plot", "{tmp}/garbage"],
         r"garbage/data.npz is unreadable \(ValueError: not an archive of arrays"),
    Case("plot-corrupt-member", "plot of a run whose data.npz has a damaged member",
         ["plot", "{tmp}/bitflip"], r"bitflip/data.npz is unreadable \((BadZipFile: Bad CRC-32|error: Error)"),
    Case("plot-missing-array", "plot of a run whose data.npz lacks an array the figures need",
         ["plot", "{tmp}/missing_array"],
         r"cannot draw the figures of .*missing_array' from its saved data.npz \(KeyError: 'xs_SA'\)"),
    Case("plot-out-file", "plot --out naming a file", ["plot", "{tmp}/missing_array", "--out", "{tmp}/a_file"],
         r"output path .*a_file' exists and is not a directory"),
    Case("plot-extra", "plot with an extra argument", ["plot", "{tmp}/none", "extra"],
         r"unrecognized arguments: extra"),
]

TOML_FILES = {
    "syntax.toml": "n = = 3\n",
    "unknown.toml": "nn = 3\nbetta = 2.0\nbeta = 1.0\n",
    "type.toml": 'n = "12"\n',
    "other.toml": 'experiment = "other"\nn = 12\n',
    "inf.toml": "beta = inf\n",
    "list_nan.toml": "theta0 = [nan, 1.0]\n",
}


def _npz(arrays) -> bytes:
    from transformer_pde._io import npz_bytes

    return npz_bytes(arrays)


def _bitflipped_npz() -> bytes:
    data = bytearray(_npz({"ts": np.linspace(0.0, 1.0, 4000)}))
    data[len(data) // 2] ^= 0xFF  # inside the compressed member
    return bytes(data)


def _meta(status, **extra) -> str:
    import json

    return json.dumps({"experiment": "clustering", "status": status, "config": {}, **extra})


# run directories: file name -> content (str or bytes); a directory is created for each
RUN_DIRS = {
    "unfinished": {"metadata.json": _meta("running")},
    "failed": {"metadata.json": _meta("failed", checkpoint_every=10)},
    "truncated_meta": {"metadata.json": _meta("failed")[:25]},
    "list_meta": {"metadata.json": "[1, 2]"},
    "unknown_meta": {"metadata.json": '{"experiment": "nope", "status": "failed", "config": {}}'},
    "status_meta": {"metadata.json": _meta("paused")},
    "edited": {"metadata.json": _meta("interrupted", checkpoint_every=10),
               "checkpoints/run.json": '{"experiment": "clustering", "config": {"seed": 1}, '
                                       '"checkpoint_every": 10}'},
    "no_data": {"metadata.json": _meta("complete")},
    "truncated": {"metadata.json": _meta("complete"), "data.npz": lambda: _npz({"ts": np.zeros(100)})[:-30]},
    "garbage": {"metadata.json": _meta("complete"), "data.npz": b"not an archive at all"},
    "bitflip": {"metadata.json": _meta("complete"), "data.npz": _bitflipped_npz},
    "missing_array": {"metadata.json": _meta("complete"), "data.npz": lambda: _npz({"ts": np.zeros(3)})},
    "empty": {},
    "unwritable": {".lock/x": ""},  # the lock file's name is taken by a directory
    "busy": {},
}


@pytest.mark.package_errors
@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c.id for c in BAD_INPUTS])
def test_bad_input_raises_clear_error(case):
    with pytest.raises(case.exc, match=case.match):
        case.thunk()


@pytest.fixture
def cli_dir(tmp_path):
    for name, text in TOML_FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.toml").write_bytes(b"n = 3\n\xff\xfe\x00beta")
    (tmp_path / "a_file").write_text("a file, not a directory\n")
    for run, files in RUN_DIRS.items():
        (tmp_path / run).mkdir()
        for name, content in files.items():
            path = tmp_path / run / name
            path.parent.mkdir(parents=True, exist_ok=True)
            content = content() if callable(content) else content
            (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    with lock_directory(tmp_path / "busy"):  # held for the whole test, as by another run
        yield tmp_path


def assert_one_line_error(err: str, match: str) -> None:
    """What the command line prints for a refused command: one line, the cause, no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err
    assert re.search(match, lines[0]), lines[0]


@pytest.mark.parametrize("case", CLI_BAD_INPUTS, ids=[c.id for c in CLI_BAD_INPUTS])
def test_cli_bad_input_exits_with_clear_message(case, cli_dir, capsys):
    with pytest.raises(SystemExit) as info:
        _cli_error(case.thunk, cli_dir)()
    assert info.value.code == 2
    assert_one_line_error(capsys.readouterr().err, case.match)
    # nothing ran: no run directory appeared beside the fixture's
    assert not (cli_dir / "runs").exists()


def test_documented_list_is_complete():
    doc = (ROOT / "docs" / "bad_inputs.md").read_text()
    ids = [c.id for c in BAD_INPUTS + CLI_BAD_INPUTS]
    assert len(ids) == len(set(ids)) and len(ids) >= 30
    missing = [i for i in ids if f"`{i}`" not in doc]
    assert not missing, f"docs/bad_inputs.md lacks {missing}; regenerate it (see its header)"


def render_doc() -> str:
    """The text of docs/bad_inputs.md (``python tests/test_validation.py`` rewrites it)."""
    lines = ["# Bad inputs and the errors they give", "",
             "Every row is a test case in `tests/test_validation.py` (generated from its tables "
             "with `python tests/test_validation.py`). Concrete bad values raise `ValueError` "
             "naming the value and what was expected; inside `jit` the same checks become "
             "`eqx.error_if`; a NaN/inf produced during a run raises `NonFiniteStateError` "
             "naming the time it appeared (or, with `throw=False`, is reported in "
             "`Solution.nonfinite_time` and `Solution.result`). Command-line mistakes (options, "
             "config files, output and run directories, damaged files) exit with status 2 and "
             "one line on stderr, never a traceback (`--debug` adds it), and nothing is run. A "
             "run that fails once started exits 1 with one line naming the cause, and its "
             "directory is marked \"failed\" for `--resume` (`tests/cli/test_cli_reliability.py`).", "",
             "| id | bad input | error (regular expression the message matches) |",
             "|---|---|---|"]
    for c in BAD_INPUTS + CLI_BAD_INPUTS:
        exc = "" if c.exc is ValueError else f"{c.exc.__name__}: "
        lines.append(f"| `{c.id}` | {c.what} | {exc}`{c.match.replace('|', chr(92) + '|')}` |")
    lines += ["", "## Silent failures, by root cause (`tests/test_reliability.py`)", "",
              "Cases where a value was once returned silently (NaN, inf, garbage, a mixed run), each "
              "with several tests in `tests/test_reliability.py`:", ""] + [f"- {r}" for r in RELIABILITY]
    return "\n".join(lines) + "\n"


RELIABILITY = [
    "**Checks that vanish under jit / vmap / sweeps**: a run that turns non-finite raises whichever "
    "output a jitted caller keeps (`.xs`, `.final`, `SaveAt(fn=)` statistics) and inside `tp.sweep` "
    "(β = inf); the sphere's unit-norm check holds under jit.",
    "**Values checked in one dtype, stored in another**: β = 1e39 is refused when it overflows float32; "
    "finite tokens whose scores overflow the dtype raise (concrete and under jit) instead of giving NaN.",
    "**Checkpoint identity**: a SHA-256 fingerprint of the dynamics (parameters to the bit, static "
    "configuration), x0, weights, solver, controller, dt0 and saves: another β, a permuted x0, other "
    "weights, solver, controller, dt0 or value matrix cannot resume a checkpoint.",
    "**Diagnostics validate**: NaN tokens and thresholds in the cluster counts (8 equal tokens with one "
    "NaN coordinate were 2 clusters), cluster-mass weights; indefinite or non-finite covariances in "
    "`bures_wasserstein`; an "
    "unconverged Sinkhorn divergence raises (`throw=False` to accept it); Sinkhorn weights "
    "(negative, unnormalized, NaN).",
    "**Integer arguments**: step counts beyond diffrax's int32 (dt0 = 1e-30, max_steps = 2**40); "
    "non-integer num_layers, save_every, max_steps, Sinkhorn max_iterations.",
    "**float32 Gaussian closure near its blow-up**: reported as a blow-up at t* (adaptive steps), "
    "not as max_steps.",
    "**Half precision**: float16/bfloat16 unit tokens are accepted by the sphere at a tolerance "
    "fitted to the dtype; off-sphere ones are refused.",
]


# --- the traced layer and run-time failures --------------------------------------------------

def test_traced_weights_use_error_if():
    f = eqx.filter_jit(lambda w: SA.velocity(X, w))
    with pytest.raises(eqx.EquinoxRuntimeError, match="weights must be finite and non-negative"):
        f(jnp.array([0.5, 0.6, -0.1, 0.0, 0.0]))
    with pytest.raises(eqx.EquinoxRuntimeError, match="weights must sum to 1"):
        f(jnp.ones(5) / 4)
    with pytest.raises(eqx.EquinoxRuntimeError, match="x must be finite"):
        eqx.filter_jit(lambda x: SA.velocity(x))(_nan_at(np.ones((5, 3)), (0, 0)))


def _blowup_time(beta, r0):
    """One token, x' = e^{β|x|²} x (unnormalized attention on R^d, w = 1): u = |x|² obeys
    u' = 2u e^{βu}, which reaches ∞ at T = ∫_{u0}^∞ du / (2u e^{βu}) = E1(β u0) / 2."""
    from scipy.special import exp1

    return 0.5 * exp1(beta * r0**2)


@pytest.mark.slow
def test_blowup_reported_with_its_time():
    usa = tp.UnnormalizedAttention.identity(2, 1.0)
    x0 = jnp.array([[1.0, 0.0]])
    T = _blowup_time(1.0, 1.0)
    with pytest.raises(tp.NonFiniteStateError, match=r"non-finite \(NaN or inf\) at t = 0\.1") as info:
        tp.solve(usa, x0, t1=1.0, dt0=1e-3, saveat=jnp.linspace(0, 1, 11))
    t_reported = float(re.search(r"at t = ([0-9.e+-]+)", str(info.value)).group(1))
    assert T <= t_reported <= T + 0.01  # explicit RK lags the true blow-up by O(dt)-ish
    sol = tp.solve(usa, x0, t1=1.0, dt0=1e-3, saveat=jnp.linspace(0, 1, 11), throw=False)
    assert sol.result == diffrax.RESULTS.event_occurred and not sol.succeeded
    assert float(sol.nonfinite_time) == pytest.approx(t_reported, rel=1e-5)
    assert np.isfinite(sol.xs[1]).all() and np.isinf(sol.xs[2:]).all()
    # a finite run reports no time
    # (x0 = 0.1: T = E1(0.01)/2 ≈ 2.0 > t1; same shapes, so no recompilation)
    ok = tp.solve(usa, 0.1 * x0, t1=1.0, dt0=1e-3, saveat=jnp.linspace(0, 1, 11))
    assert np.isinf(ok.nonfinite_time) and ok.succeeded
    # under vmap (traced): eqx.error_if, pointing to throw=False for the time
    with pytest.raises(eqx.EquinoxRuntimeError, match="became non-finite"):
        jax.vmap(lambda b: tp.solve(tp.UnnormalizedAttention.identity(2, b), x0, t1=1.0,
                                    dt0=1e-3).xs)(jnp.array([0.5, 1.0]))
    # the discrete Transformer reports the first non-finite layer
    with pytest.raises(tp.NonFiniteStateError, match=r"by layer \d+"):
        tp.layers(usa, x0, 200, 0.01)
    # a checkpointed run stops and pads with inf, like diffrax
    sol = solve_checkpointed(usa, x0, t1=1.0, dt0=1e-3, saveat=jnp.linspace(0, 1, 11), every=2,
                             throw=False)
    assert float(sol.nonfinite_time) == pytest.approx(t_reported, rel=1e-5)
    assert np.isinf(sol.xs[2:]).all() and np.isfinite(sol.xs[:2]).all()


@pytest.mark.slow
def test_blowup_at_saves_reports_the_first_save_time_after_the_blowup():
    """BlowUpAtSaves: the closed-form blow-up T = E1(1)/2 ≈ 0.1097 of x' = e^{|x|²} x is seen at
    the first save time after it, over every save (two save grids here: 0.15 of the second comes
    before 0.2 of the first), and at t1 when no save follows; the saves before it are the states
    a per-step BlowUp run saves."""
    usa = tp.UnnormalizedAttention.identity(2, 1.0)
    x0 = jnp.array([[1.0, 0.0]])
    T = _blowup_time(1.0, 1.0)
    ts, ts2 = jnp.linspace(0, 1, 11), jnp.array([0.05, 0.15, 0.5])
    watch = tp.BlowUpAtSaves()
    kw = dict(t1=1.0, dt0=1e-3, throw=False)
    step = tp.solve(usa, x0, saveat=ts, **kw)
    sol = tp.solve(usa, x0, saveat=ts, event=watch, **kw)
    first = float(ts[np.searchsorted(np.asarray(ts), T)])
    assert float(sol.nonfinite_time) == first == 0.2 and float(step.nonfinite_time) < first
    assert sol.result == diffrax.RESULTS.event_occurred and not sol.succeeded
    np.testing.assert_array_equal(sol.xs[:2], step.xs[:2])
    assert np.isinf(sol.xs[2:]).all()
    two = tp.solve(usa, x0, saveat=diffrax.SaveAt(subs=[
        diffrax.SubSaveAt(ts=ts, fn=lambda t, x, args: jnp.sum(x**2)), diffrax.SubSaveAt(ts=ts2)]),
        event=watch, **kw)
    assert float(two.nonfinite_time) == pytest.approx(0.15)
    assert np.isfinite(two.stats[0][:2]).all() and np.isinf(two.stats[0][2:]).all()
    assert np.isfinite(two.stats[1][0]).all() and np.isinf(two.stats[1][1:]).all()
    # only the state at t1 sees it: t1 is reported
    late = tp.solve(usa, x0, saveat=jnp.array([0.0, 0.05]), event=watch, **kw)
    assert float(late.nonfinite_time) == 1.0 and np.isfinite(late.xs).all()
    with pytest.raises(tp.NonFiniteStateError, match=r"at t = 0\.2 \(the first save time.*BlowUpAtSaves"):
        tp.solve(usa, x0, t1=1.0, dt0=1e-3, saveat=ts, event=watch)
    # a statistic that checks its tokens leaves a flagged save to the watch (its own check would
    # stop the run first, with "x must be finite" and no time; unwatched, it does). Two equal
    # tokens blow up at the same T; with one, the count would not depend on x (check compiled out)
    count = diffrax.SaveAt(ts=ts, fn=lambda t, x, args: tp.diagnostics.cluster_count(
        x, 0.5, metric=tp.diagnostics.Euclidean()))
    with pytest.raises(tp.NonFiniteStateError, match=r"at t = 0\.2 "):
        tp.solve(usa, jnp.concatenate([x0, x0]), t1=1.0, dt0=1e-3, saveat=count, event=watch)
    with pytest.raises(eqx.EquinoxRuntimeError, match="x must be finite"):
        tp.solve(usa, jnp.concatenate([x0, x0]), t1=1.0, dt0=1e-3, saveat=count, event=None)
    with pytest.raises(eqx.EquinoxRuntimeError, match="became non-finite"):
        jax.vmap(lambda b: tp.solve(tp.UnnormalizedAttention.identity(2, b), x0, t1=1.0, dt0=1e-3,
                                    event=watch).xs)(jnp.array([0.5, 1.0]))
    # a finite run: nothing reported, the states of an unwatched run
    ok = tp.solve(usa, 0.1 * x0, saveat=ts, event=watch, **kw)
    free = tp.solve(usa, 0.1 * x0, saveat=ts, event=None, **kw)
    assert np.isinf(ok.nonfinite_time) and ok.succeeded
    np.testing.assert_allclose(ok.xs, free.xs, rtol=1e-14)
    with pytest.raises(ValueError, match="BlowUpAtSaves watches constant-step runs.*PIDController"):
        tp.solve(usa, x0, saveat=ts, event=watch, t1=1.0, dt0=1e-3,
                 stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6))


def test_gaussian_blowup_at_saves_is_the_save_after_the_step_blowup():
    """A Gaussian's Riccati blow-up (softmax, β = 1, Σ0 = I, t* ≈ 0.5): the per-save watch reports
    the first save time at or after the per-step watch's time, and inf saves from there."""
    ts = jnp.linspace(0.0, 3.0, 7)
    kw = dict(t1=3.0, dt0=1e-3, saveat=ts, throw=False)
    g0 = tp.Gaussian(jnp.zeros(2), jnp.eye(2))
    step = tp.solve(tp.SoftmaxAttention.identity(2, 1.0), g0, **kw)
    sol = tp.solve(tp.SoftmaxAttention.identity(2, 1.0), g0, event=tp.BlowUpAtSaves(), **kw)
    t_step = float(step.blowup_time)
    assert 0 < t_step < 3.0
    assert float(sol.blowup_time) == float(ts[np.searchsorted(np.asarray(ts), t_step)])
    reached = np.asarray(ts) < float(sol.blowup_time)
    np.testing.assert_array_equal(sol.covs[reached], step.covs[reached])
    assert np.isinf(sol.covs[~reached]).all() and bool(sol.blew_up)


def _runtime_checks(f, *args) -> int:
    """How many eqx.error_if checks f traces into its program (each a cond and a callback)."""
    return sum(e.primitive.name == "jit" and e.params["name"] == "branched_error_if_impl"
               for e in jax.make_jaxpr(f)(*args).jaxpr.eqns)


def test_a_checked_array_is_not_checked_again_but_what_is_derived_from_it_is():
    from transformer_pde._checks import check_points

    x = jnp.ones((4, 2))
    assert _runtime_checks(lambda x: check_points(x, "a"), x) == 1
    assert _runtime_checks(lambda x: check_points(check_points(x, "a"), "b"), x) == 1
    assert _runtime_checks(lambda x: check_points(check_points(x, "a")[1:], "b"), x) == 2
    with pytest.raises(eqx.EquinoxRuntimeError, match="a must be finite"):
        eqx.filter_jit(lambda x: check_points(check_points(x, "a"), "b"))(x.at[0, 0].set(jnp.nan))
    # one matrix given as Q, K and V is checked once; three matrices three times
    eye = jnp.eye(3)
    assert _runtime_checks(lambda m: tp.SoftmaxAttention(m, m, m, 1.0).score_matrix(), eye) == 1
    assert _runtime_checks(lambda m: tp.SoftmaxAttention(m, 2 * m, m + 1, 1.0).score_matrix(), eye) == 3
    with pytest.raises(eqx.EquinoxRuntimeError, match="SoftmaxAttention.Q must be finite"):
        eqx.filter_jit(lambda m: tp.SoftmaxAttention(m, m, m, 1.0).score_matrix())(eye.at[1, 1].set(jnp.inf))
    # a solve's start on the sphere: once for NaN, once for the unit norms (the weights it makes
    # itself are not checked)
    sphere = tp.Sphere(SA)
    assert _runtime_checks(lambda x: tp.Particles(x).prepare(sphere).y, X) == 2
    with pytest.raises(eqx.EquinoxRuntimeError, match="must lie on the unit sphere"):
        eqx.filter_jit(lambda x: tp.Particles(x).prepare(sphere).y)(2 * X)


def test_sinkhorn_nonconvergence_is_a_result_not_nan():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(6, 3)))
    attn = tp.SinkhornAttention(E3, E3, E3, 1.0, epsilon=0.05, max_iterations=3, throw=False)
    pot = attn.potentials(x)
    assert not bool(pot.converged) and int(pot.n_iters) == 3 and float(pot.error) > attn.threshold
    assert np.isfinite(attn.velocity(x)).all()
    strict = tp.SinkhornAttention(E3, E3, E3, 1.0, epsilon=0.05, max_iterations=3)
    with pytest.raises(eqx.EquinoxRuntimeError, match="Sinkhorn attention did not converge in "
                                                      "max_iterations=3"):
        strict.velocity(x)


if __name__ == "__main__":  # docs/bad_inputs.md is written by the fuzz harness's script, this table in it
    import runpy

    runpy.run_path(str(ROOT / "tests" / "fuzz" / "make_bad_inputs.py"), run_name="__main__")


def test_the_suite_checks_types_at_run_time():
    """conftest.py's jaxtyping hook is on for the package: a wrong type at an annotated entry point
    is caught by the checker, and shapes are checked against each other (n of x and of weights)."""
    import jaxtyping

    attn = tp.SoftmaxAttention.identity(3, 1.0)
    x = tp.uniform_sphere(jax.random.key(0), 5, 3)
    with pytest.raises(jaxtyping.TypeCheckError, match="num_layers"):
        tp.layers(tp.Sphere(attn), x, 2.5, 0.1)
    with pytest.raises(jaxtyping.TypeCheckError, match="weights"):
        attn.velocity(x, jnp.full((4,), 0.25))
    with pytest.raises(ValueError, match="rank_promotion"):
        jnp.ones(3) + jnp.ones((2, 3))


def test_half_precision_weight_tolerance():
    """Weights off by 10% are no probability measure in float16 either (4√eps was 0.125 there);
    weights rounded to float16 or normalized in it pass (issue 37 part 9)."""
    from transformer_pde._checks import check_weights, weight_tolerance

    assert weight_tolerance(jnp.float64) == pytest.approx(4 * np.sqrt(np.finfo(np.float64).eps))  # unchanged
    assert weight_tolerance(jnp.float32) == pytest.approx(4 * np.sqrt(np.finfo(np.float32).eps))
    assert weight_tolerance(jnp.float16) == pytest.approx(4 * 2.0**-10)
    off = np.array([0.4, 0.4, 0.3], np.float16)  # sums to 1.0999
    with pytest.raises(ValueError, match=r"weights must sum to 1 .* 1\.09"):
        check_weights(off, 3, jnp.float16)
    with pytest.raises(Exception, match="weights must sum to 1"):
        jax.block_until_ready(eqx.filter_jit(lambda w: check_weights(w, 3, jnp.float16))(jnp.asarray(off)))
    n = 1000
    w = np.random.default_rng(0).random(n).astype(np.float16)
    check_weights((w / w.sum()).astype(np.float16), n, jnp.float16)  # normalized in float16
    check_weights(np.full(n, 1 / n), n, jnp.float16)  # 1/n rounded to float16 (all down or up)
    wb = jnp.asarray(np.random.default_rng(1).random(n), jnp.bfloat16)
    jax.block_until_ready(eqx.filter_jit(lambda w: check_weights(w, n, jnp.bfloat16))(wb / jnp.sum(wb)))
