"""``tp.solve``: one thin ``diffrax.diffeqsolve`` over typed states (the only call to it).

``solve(dynamics, state0, t1=..., ...)`` reads like the equation dx_i/dt = v(t, x_i; μ_t): the
state (:mod:`.states`) owns its equations, and every strategy is a value — the diffrax solver,
step-size controller, adjoint and ``SaveAt``, the progress meter, and the stop condition
(:class:`~.events.BlowUp`). Files, chunks and resumable runs belong to the runs layer
(:mod:`transformer_pde.runs`), which calls this.
"""

from __future__ import annotations

import functools
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (
    NonFiniteStateError,
    carry_checks,
    check_int,
    check_scalar,
    cover_finiteness,
    install_check_filter,
    is_concrete,
    runtime_check,
    runtime_checks,
    skipping_checks,
)
from .._programs import SOLVE_RUNNER
from ..models.base import AbstractDynamics, AbstractRetraction
from ..models.switched import AbstractSwitched
from .events import AbstractBlowUp, BlowUp
from .first_step import with_first_step
from .noise import AbstractNoise, brownian_spec, noisy_terms
from .residual import ResidualLayer
from .retracted import Retracted
from .saves import as_time, check_times, inf_from, parse_saveat, saved_array, several_saves, times_known
from .solution import GaussianSolution, Solution, finished, raise_if_failed
from .states import AbstractState, as_state
from .switches import checked_steps, jump_at_switches

MAX_STEPS = 2**31 - 1
"""diffrax counts steps in int32: no solve can ask for more."""

_BLOW_UP = BlowUp()  # the default stop condition (an immutable value)
# the adjoints that take what every solve saves (SaveAt(subs=...): the saves, the state at t1)
# and the blow-up watches; BacksolveAdjoint refuses subs, ImplicitAdjoint saves t1 only
_ADJOINTS = (diffrax.RecursiveCheckpointAdjoint, diffrax.DirectAdjoint, diffrax.ForwardMode)


def solve(
    dynamics,
    state0,
    *,
    t1,
    t0=0.0,
    dt0=None,
    saveat: diffrax.SaveAt | jax.typing.ArrayLike | None = None,
    solver: diffrax.AbstractSolver | ResidualLayer | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    max_steps: int | None = None,
    event: AbstractBlowUp | None = _BLOW_UP,
    progress_meter: diffrax.AbstractProgressMeter | None = None,
    throw: bool = True,
    noise: AbstractNoise | None = None,
    key: jax.Array | None = None,
    brownian_interval: tuple | None = None,
) -> Solution | GaussianSolution:
    """Integrate a state from t0 to t1 under ``dynamics``.

    Args:
        dynamics: an attention (tokens in R^d), ``tp.Sphere(attention)`` or any
            :class:`transformer_pde.models.AbstractDynamics`; an
            :class:`~transformer_pde.solvers.AbstractODE` for a plain pytree state.
        state0: ``tp.Particles(x, weights)`` (a bare ``(n, d)`` array is uniform particles),
            ``tp.Gaussian(mean, cov)`` (the moment ODEs of the Gaussian closure,
            docs: math/gaussian.md#moment-equations: returns a :class:`GaussianSolution`),
            ``tp.Tracers(carrier, z)``, ``tp.Coupled(...)``, ``tp.CircleDensity(rho, sigma)``
            (the Fokker–Planck equation on S¹, pseudo-spectral), or a pytree under an ODE.
        t1, t0: time span; t1 > t0 (depth = time).
        dt0: initial (or constant) step. Euler with constant ``dt0`` is a residual
            Transformer with layer step ``dt0``.
        saveat: ``diffrax.SaveAt(ts=..., fn=...)`` or ``diffrax.SaveAt(t1=True, fn=...)``; an
            array of times is short for ``SaveAt(ts=times)`` (default: ``[t1]``). With
            ``fn(t, x, args)`` the statistic is saved instead of the states (large runs need not
            store every state): ``Solution.stats``; ``x`` is what the state shows (particles on
            their manifold; a tuple for coupled states). Several statistics at their own times:
            ``diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=..., fn=...), ...])`` (each sub as above;
            no ``fn``: the states); ``Solution.ts`` and ``Solution.stats`` are then tuples with
            one entry per sub, in order (one run, one compiled program; not for a Gaussian).
        solver: any diffrax solver (default ``diffrax.Tsit5()``; the state's own where it has a
            stiff part: a ``tp.CircleDensity`` takes an IMEX ``KenCarp4``), or
            :class:`~transformer_pde.ResidualLayer` ``()``: the residual layer, Euler with the
            dynamics' retraction in a scan of layers of step dt0 (particles; what ``tp.layers`` runs).
        stepsize_controller: default constant steps (a ``tp.CircleDensity``: adaptive); pass
            ``diffrax.PIDController(rtol, atol)`` for adaptive steps.
        adjoint: diffrax adjoint for gradients: ``diffrax.RecursiveCheckpointAdjoint()`` (the
            default, reverse mode), ``diffrax.DirectAdjoint()`` or ``diffrax.ForwardMode()`` (for
            ``jax.jacfwd``; few parameters, many outputs). ``BacksolveAdjoint`` and
            ``ImplicitAdjoint`` are refused: they cannot take the saves a solve makes.
        max_steps: step cap (default: exact for constant steps, 100 000 otherwise).
        event: the blow-up watch, :class:`~transformer_pde.BlowUp` by default: the run stops at
            the first step whose state holds a NaN or inf (a Gaussian: tr Σ above a threshold)
            and reports its time (``Solution.nonfinite_time``, ``GaussianSolution.blowup_time``);
            particles then raise :class:`~transformer_pde.NonFiniteStateError` naming the time
            unless ``throw=False``. :class:`~transformer_pde.BlowUpAtSaves` checks at the save
            times only and does not stop the run (cheaper to compile; constant steps). ``None``
            watches nothing.
        progress_meter: a diffrax progress meter (e.g. ``diffrax.TqdmProgressMeter()``),
            updated from inside jit; default none.
        throw: raise if the solve fails; otherwise inspect ``Solution.result``. The program
            itself holds no check (a host callback, which JAX's persistent compilation cache
            never keeps): it reports a failure as ``Solution.result`` and a blow-up as its time,
            raised after it ran with diffrax's message (``eqx.EquinoxRuntimeError``) or
            :class:`~transformer_pde.NonFiniteStateError`; under your own ``jit``/``vmap`` the
            same errors are raised inside that program (``eqx.error_if``).
        noise: :class:`~transformer_pde.Noise` ``(σ)``: independent noise on every token,
            dX_i = Γ dt + σ(t) dB_i (on the sphere σP⊥_{X_i} ∘ dB_i, generator (σ²/2)Δ_S;
            docs: math/noise.md#independent-noise, :mod:`~transformer_pde.solvers.noise`). The solver must be an SDE
            solver (default then ``diffrax.Euler()``: with ``dt0 = h`` one step is the noisy residual
            layer); an ODE solver such as Tsit5 is refused. A ``tp.Gaussian`` takes noise as
            Σ' += σ²I (an ODE: no key, default solver Tsit5); a state that takes no noise (not a
            :class:`~transformer_pde.solvers.AbstractNoisyState`) is refused, named.
            :class:`~transformer_pde.CommonNoise` ``(g)``: one Brownian motion shared by every
            token, σ(t) g(X) dW (random heads: ``tp.CommonNoiseSDE``; particles only).
        key: the PRNG key of the run's Brownian path (required with noise): the same key gives
            the same path, and gradients follow it. Constant steps draw it on the grid of dt0
            (``tp.BrownianGrid()``, one draw per token and step), adaptive steps and the SRK
            solvers from a virtual Brownian tree (``tp.BrownianTree()``). For strong comparisons
            across step sizes give the runs one path: ``tp.Noise(σ, path=tp.BrownianGrid(dt=h))``
            with h the smallest step (steps multiples of h), or ``tp.BrownianTree(tol=...)``
            below it.
            The SRK solvers (SPaRK, ShARK, ...) draw a tree with space-time Lévy area, whose path
            differs from the plain tree of Euler/Heun/EulerHeun for the same key: compare runs
            path by path within one of these two families.
        brownian_interval: ``(T0, T1) ⊇ [t0, t1]``, the interval of the Brownian tree (default
            ``(t0, t1)``): runs cut into pieces pass the whole interval so every piece sees the
            same path (:func:`transformer_pde.runs.solve_checkpointed` does).

    The compiled program depends only on shapes and the static configuration, so repeated
    calls with new values (x0, parameters, t1) do not recompile; ``solve`` works under
    ``jax.vmap`` and ``jax.grad``.

    Example:
        ```python
        import diffrax, jax.numpy as jnp, jax.random as jr, transformer_pde as tp

        x0 = tp.uniform_sphere(jr.key(0), n=64, d=3)            # tokens are rows: (n, d)
        attn = tp.SoftmaxAttention.identity(d=3, beta=4.0)
        sol = tp.solve(tp.Sphere(attn), x0, t1=2.0, dt0=0.1, saveat=jnp.linspace(0, 2, 5))
        sol.ts.shape, sol.xs.shape                              # (5,), (5, 64, 3)
        stats = tp.solve(tp.Sphere(attn), x0, t1=2.0, dt0=0.1, saveat=diffrax.SaveAt(
            ts=jnp.linspace(0, 2, 5), fn=lambda t, x, args: jnp.mean(x @ x.T))).stats   # (5,), no states kept
        ```
    """
    if event is not None and not isinstance(event, AbstractBlowUp):
        raise ValueError(f"event must be tp.BlowUp(...), tp.BlowUpAtSaves(...) or None, got {event!r}")
    if progress_meter is not None and not isinstance(progress_meter, diffrax.AbstractProgressMeter):
        raise ValueError(f"progress_meter must be a diffrax progress meter such as "
                         f"diffrax.TqdmProgressMeter(), got {progress_meter!r}")
    check_scalar(t0, "t0")
    check_scalar(t1, "t1")
    if isinstance(solver, ResidualLayer):  # the residual layer steps in a scan of its own
        return solver.run(dynamics, state0, t0=t0, t1=t1, dt0=dt0, saves=parse_saveat(saveat),
                          several=several_saves(saveat), noise=noise, key=key, throw=throw,
                          diffrax_options=dict(stepsize_controller=stepsize_controller, adjoint=adjoint,
                                               max_steps=max_steps, progress_meter=progress_meter,
                                               brownian_interval=brownian_interval))
    if isinstance(dynamics, AbstractSwitched):
        # the part that holds on [t0, t1] checks the state: a run that starts after the switch
        # (a resumed chunk) starts from the second part's states, not the first's
        dynamics = dynamics.part_on(t0, t1)
    state = as_state(dynamics, state0).prepare(dynamics)
    if isinstance(dynamics, AbstractDynamics):  # a field defined from some time on (LNScaling) names its start
        dynamics.check_time(t0, "t0")
    dtype = state.dtype
    saves = parse_saveat(saveat)
    several = several_saves(saveat)
    if several or saves[0][1] is not None:
        state.check_statistics()
    ts = tuple(check_times(t0, t1, dt0, save_ts, dtype) for save_ts, _ in saves)
    fn = tuple(f for _, f in saves)
    if noise is None and (key is not None or brownian_interval is not None):
        raise ValueError("key and brownian_interval are for noisy runs: pass noise=tp.Noise(sigma) too")
    if noise is not None and not isinstance(noise, AbstractNoise):
        raise ValueError(f"noise must be tp.Noise(sigma), tp.CommonNoise(...) or None, got {noise!r}")
    shape = None
    if noise is not None:
        noise.check(state, dynamics, t0, dtype)
        shape = noise.brownian_shape(state, dynamics)
    # a noisy run is an SDE where the state takes a Brownian path (a Gaussian's noise is Σ' += σ²I)
    sde = bool(jax.tree_util.tree_leaves(shape))
    solver = (diffrax.Euler() if sde else state.default_solver()) if solver is None else solver
    if not isinstance(solver, diffrax.AbstractSolver):
        raise ValueError(f"solver must be a diffrax solver such as diffrax.Tsit5(), got {solver!r}")
    if stepsize_controller is None:
        stepsize_controller = state.default_controller()
    brownian = None
    if sde:
        brownian = brownian_spec(noise, shape, key, brownian_interval, state, dynamics, solver,
                                 stepsize_controller, t0, t1, dt0, dtype)
    if dt0 is None and isinstance(stepsize_controller, diffrax.ConstantStepSize):
        raise ValueError("dt0 is required with constant step sizes (pass dt0=..., or an adaptive "
                         "stepsize_controller such as diffrax.PIDController)")
    if event is not None:
        event.check_controller(stepsize_controller)
    stepsize_controller, dt0 = jump_at_switches(dynamics, stepsize_controller, t0, t1, dt0, dtype)
    if max_steps is None:
        max_steps = default_max_steps(t0, t1, dt0, stepsize_controller)
    check_int(max_steps, "max_steps", minimum=1, maximum=None)
    if max_steps > MAX_STEPS:
        raise ValueError(f"max_steps={max_steps} exceeds {MAX_STEPS} (diffrax counts steps in int32)")
    if adjoint is None:
        adjoint = diffrax.RecursiveCheckpointAdjoint() if brownian is None else brownian.kind.default_adjoint()
    if not isinstance(adjoint, _ADJOINTS):
        why = (": a solve saves through SaveAt(subs=...) (its saves and the state at t1), which the others "
               "cannot take" if isinstance(adjoint, diffrax.AbstractAdjoint) else "")
        raise ValueError(f"adjoint must be diffrax.RecursiveCheckpointAdjoint(), diffrax.DirectAdjoint() or "
                         f"diffrax.ForwardMode(), got {adjoint!r}{why}")
    criterion = None if event is None else state.resolve(event)
    t0a, t1a = as_time(t0, "t0", dtype), as_time(t1, "t1", dtype)
    if not (is_concrete(t0) and is_concrete(t1)):  # the concrete case was refused above
        t1a = runtime_check(t1a, ~(t1a > t0a), "solve: must have t1 > t0 (time runs forward)")
    # the default save (saveat None: [t1]) is t1 itself, in range and in order by construction: no
    # check (under a caller's trace it is a tracer, and a check is a host callback)
    ts = tuple(times if given is None or times_known(given, t0, t1) else _check_traced_times(times, t0a, t1a)
               for times, (given, _) in zip(ts, saves))
    args = (dynamics, state, t0a, t1a,
            None if dt0 is None else jnp.asarray(check_scalar(dt0, "dt0", positive=True), dtype), ts, fn, solver,
            stepsize_controller, adjoint, int(max_steps), progress_meter or diffrax.NoProgressMeter(),
            event, criterion, noise, brownian, several,
            # a constant σ was checked above (Noise.check): the program need not check it again
            noise is not None and not noise.time_dependent and is_concrete(noise.sigma))
    runner, sol = SOLVE_RUNNER.get(), None
    # the runs layer keeps the program between processes (None: it cannot); a progress meter is a
    # host callback, which no kept program can hold (not traced twice to find that out)
    if runner is not None and progress_meter is None:
        sol = runner(_solve_program, args)
    if sol is None:
        sol = _solve(*args)
    if throw:  # the program reports a failure as its result code: raised here, after it ran
        sol = _raise_if_failed(sol)
    if throw and event is not None and isinstance(sol, Solution):
        sol = _raise_if_nonfinite(sol, event, noise is not None)
    return sol


def _raise_if_failed(sol):
    """Raise the failure a solve program reported as its result code (``Solution.result``: steps
    exhausted, a step size too small, ...), with diffrax's message: an ``eqx.EquinoxRuntimeError``
    now when the result is concrete (:func:`~.solution.raise_if_failed`), through ``eqx.error_if``
    under an outer ``jit``/``vmap`` (raised while that program runs). A blow-up is reported by its
    time, not here. Returns ``sol``."""
    result = sol.result
    code, = jax.tree.leaves(result)  # an enumeration item is a pytree of its index
    if is_concrete(code):
        raise_if_failed(result)
        return sol
    return runtime_checks(sol, ~finished(result), code, _result_messages())


@functools.cache
def _result_messages() -> tuple[str, ...]:
    """diffrax's messages of its result codes, by index (what ``RESULTS[item]`` says of each)."""
    like = jax.tree.structure(diffrax.RESULTS.successful)
    return tuple(diffrax.RESULTS[jax.tree.unflatten(like, [np.array(i, np.int32)])]
                 for i in range(len(diffrax.RESULTS)))


def _check_traced_times(ts, t0, t1):
    """Save times within [t0, t1] and in order, for times or a span traced by the caller, as diffrax
    checked them (the program drops diffrax's own checks of the times, see :func:`_solve`); times
    and a span given as values are checked before the program (``check_times``, even under a
    caller's trace)."""
    ts = runtime_check(ts, jnp.any(ts[1:] < ts[:-1]), "saveat.ts must be increasing or decreasing.")
    return runtime_check(ts, jnp.any((ts > t1) | (ts < t0)), "saveat.ts must lie between t0 and t1.")


def _solve_program(dynamics, state, t0, t1, dt0, ts, fn, solver, controller, adjoint, max_steps, meter,
                   watch, criterion, noise, brownian, several, sigma_checked):
    """The program of a solve. It holds no host callback (JAX's persistent cache keeps no program
    that does): diffrax runs with ``throw=False`` and reports a failure as the result code that
    :func:`_raise_if_failed` raises after the program; its check of dt0 is never made (dt0 goes to
    the controller, :func:`~.first_step.with_first_step`) and its checks of the save times and of
    the Brownian tree's times are left out (:data:`_DIFFRAX_TIME_CHECKS`), ``solve`` having checked
    the same before the program."""
    with skipping_checks(_DIFFRAX_TIME_CHECKS):
        return _program(dynamics, state, t0, t1, dt0, ts, fn, solver, controller, adjoint, max_steps, meter,
                        watch, criterion, noise, brownian, several, sigma_checked)


# a kept program collecting its checks (runs/reported_checks.py) carries those traced in it out of this jit
_solve = carry_checks(eqx.filter_jit, _solve_program)


def _program(dynamics, state, t0, t1, dt0, ts, fn, solver, controller, adjoint, max_steps, meter,
             watch, criterion, noise, brownian, several, sigma_checked):
    term = state.term(dynamics)
    if noise is not None:
        term = noisy_terms(dynamics, state, noise, brownian, sigma_checked)
    controller = checked_steps(controller, t0, t1)
    if state.retracts(dynamics):
        if isinstance(adjoint, diffrax.DirectAdjoint):
            solver = _bounded_stages(solver)
        solver = Retracted(solver, _StateRetraction(state, dynamics))
    blown_up = None if watch is None else (lambda y: state.blown_up(criterion, y))
    check = None if watch is None else watch.save_check(blown_up)
    # the extra save at t1 records where the run actually stopped (the event time, or t1)
    # a watched run's statistic flags a non-finite input instead of checking it (a host callback)
    flag_input = tuple(watch is not None and f is not None for f in fn)
    saveat = diffrax.SaveAt(subs=[*(diffrax.SubSaveAt(ts=times, fn=_saver(state, dynamics, f, check, flag))
                                    for times, f, flag in zip(ts, fn, flag_input)),
                                  diffrax.SubSaveAt(t1=True, fn=_final_saver(state, check))])
    event = None if watch is None else watch.stop_event(blown_up)
    with warnings.catch_warnings():
        # a Retracted SDE solver is its wrapped solver's kind (check_sde_solver checked that one)
        warnings.filterwarnings("ignore", message=".*not marked as converging to either the Itô")
        # diffrax pre-fills every save buffer with inf, an integer statistic's too, where the cast
        # has no value to give: integer saves after a stop are not inf (BlowUpAtSaves says so)
        warnings.filterwarnings("ignore", message="invalid value encountered in cast", category=RuntimeWarning)
        if dt0 is not None:  # given to diffeqsolve, dt0 would be checked there (a host callback)
            controller = with_first_step(controller, dt0)
        sol = diffrax.diffeqsolve(term, solver, t0, t1, None, state.y, saveat=saveat,
                                  stepsize_controller=controller, adjoint=adjoint, max_steps=max_steps,
                                  throw=False, event=event, progress_meter=meter)
    save_ts, saved, (t_end, final, *final_flag) = tuple(sol.ts[:-1]), tuple(sol.ys[:-1]), sol.ys[-1]
    stop_time, result = None, sol.result
    if watch is not None:
        stop_time = jnp.where(result == diffrax.RESULTS.event_occurred, t_end[0], jnp.inf)
    if check is None and any(flag_input):
        # a statistic's input held NaN or inf: inf there, and the run reports the first such save
        # unless it stopped on a blow-up (that time stays the end of the step where it occurred)
        flags = tuple(x[1] if flag else None for x, flag in zip(saved, flag_input))
        saved = tuple(x[0] if flag else x for x, flag in zip(saved, flag_input))
        first = functools.reduce(jnp.minimum, [jnp.min(jnp.where(f, times, jnp.inf))
                                               for times, f in zip(save_ts, flags) if f is not None])
        saved = tuple(v if f is None else inf_from(jnp.min(jnp.where(f, times, jnp.inf)), times, v)
                      for times, v, f in zip(save_ts, saved, flags))
        stop_time = jnp.where(jnp.isfinite(stop_time), stop_time, first)
        result = diffrax.RESULTS.where(jnp.isfinite(stop_time) & (result == diffrax.RESULTS.successful),
                                       diffrax.RESULTS.event_occurred, result)
    if check is not None:  # the saves' flags: the first flagged save (or t1), and inf from it on
        saved, flags = tuple(v for v, _ in saved), tuple(f for _, f in saved)
        for times, flag in zip(save_ts, flags):
            stop_time = jnp.minimum(stop_time, jnp.min(jnp.where(flag, times, jnp.inf)))
        stop_time = jnp.minimum(stop_time, jnp.where(final_flag[0][0], t_end[0], jnp.inf))
        saved = tuple(inf_from(stop_time, times, v) for times, v in zip(save_ts, saved))
        result = diffrax.RESULTS.where(jnp.isfinite(stop_time) & (result == diffrax.RESULTS.successful),
                                       diffrax.RESULTS.event_occurred, result)
    final = (t_end[0], jax.tree.map(lambda a: a[0], final))
    if not several:
        save_ts, saved = save_ts[0], saved[0]
    return state.solution(save_ts, saved, several or fn[0] is not None, stop_time, final,
                          sol.stats["num_accepted_steps"], result, criterion)


_DIFFRAX_TIME_CHECKS = ("saveat.ts must be increasing or decreasing.", "saveat.ts must lie between t0 and t1.",
                        "Cannot evaluate VirtualBrownianTree outside of its range [t0, t1].",
                        "t0 must be strictly less than t1")
"""The messages of diffrax's checks of the times that the program leaves out
(:func:`~transformer_pde._checks.skipping_checks`): ``solve`` checks t1 > t0 and the save times before
the program (:func:`~.saves.check_times`, :func:`_check_traced_times`), and the Brownian interval
holds [t0, t1] (``brownian_spec``: the tree's interval is not empty, diffrax steps within it, the
grid's bridges evaluate their unit tree at fractions in [0, 1]). No public way leaves them out:
diffrax checks the save times after scaling them by the direction of time, a traced value, so
they are traced even when given as NumPy arrays, unless t0 and t1 are constants of the program
(then a new t1, a sweep's or a chunk's, would be a new program); a virtual Brownian tree checks
every time it evaluates, through no unchecked public method."""
install_check_filter()  # once, on import: before anything is traced


def _saver(state, dynamics, fn, check, flag_input=False):
    """diffrax's ``fn(t, y, args)`` for one save: the state's value (saves interpolate between
    steps and dense output may leave the manifold: the state maps them), or ``fn`` of it; with a
    ``check`` (:meth:`AbstractBlowUp.save_check`), the pair (that, ``check(y)``); with
    ``flag_input``, the pair (that, whether the value ``fn`` read held NaN or inf)."""
    def save(t, y, args):
        v = state.value(dynamics, y, t)
        if check is not None or flag_input:
            # this save's own flag covers its tokens: statistics need not check them for NaN
            # again (a flagged save is set to inf, so nothing computed from them is kept)
            cover_finiteness(jax.tree_util.tree_leaves(v))
        out = v if fn is None else jax.tree.map(saved_array, fn(t, v, args))
        if check is not None:
            return out, check(y)
        if flag_input:
            return out, ~jnp.all(jnp.asarray([jnp.all(jnp.isfinite(a)) for a in jax.tree_util.tree_leaves(v)
                                              if jnp.issubdtype(a.dtype, jnp.inexact)]))
        return out

    return save


def _final_saver(state, check):
    """The save at t1: the time and what the solution keeps of the state (and ``check(y)``)."""
    return lambda t, y, args: (t, state.final_value(y), *(() if check is None else (check(y),)))


def _bounded_stages(solver):
    """A Runge–Kutta solver's stages as a bounded loop, as ``DirectAdjoint`` sets them itself on a
    bare solver: it cannot set them through :class:`Retracted`, which reads its solver's."""
    if isinstance(solver, (diffrax.AbstractRungeKutta, diffrax.AbstractSRK)) and solver.scan_kind is None:
        return eqx.tree_at(lambda s: s.scan_kind, solver, "bounded", is_leaf=lambda v: v is None)
    return solver


class _StateRetraction(AbstractRetraction):
    """A state's step retraction under a dynamics, for :class:`Retracted`."""

    state: AbstractState
    dynamics: object

    def retract_step(self, y, t0, t1):
        return self.state.retract_step(self.dynamics, y, t0, t1)


def _raise_if_nonfinite(sol: Solution, watch: AbstractBlowUp, noisy: bool = False) -> Solution:
    """Report a non-finite state with its time: an error naming it when concrete,
    ``eqx.error_if`` under an outer ``jit``/``vmap`` (where the time cannot be formatted)."""
    bad_t = sol.nonfinite_time
    if is_concrete(bad_t):
        t = np.asarray(bad_t)
        if np.ndim(t) == 0 and not np.isfinite(t):
            _raise_if_saves_nonfinite(sol)
        if np.ndim(t) == 0 and np.isfinite(t):
            raise NonFiniteStateError(
                f"solve: the state became non-finite (NaN or inf) at t = {float(t):.6g} ({watch.time_found()}). "
                "Typical causes: "
                "finite-time blow-up of the dynamics, or a step dt0 too large for the parameters "
                f"(beta, token norms{', the noise σ' if noisy else ''}). Pass throw=False to get the partial Solution "
                "(Solution.nonfinite_time, saves after it are inf).")
        return sol
    # one check threaded through every output (states, statistics, times), so a jit that keeps
    # any of them keeps the check: a caller who reads only .xs (or a tp.sweep of one number) still
    # gets it (one check, not one per output: each costs tracing and compiling)
    bad = jnp.any(jnp.isfinite(bad_t))
    msg = ("solve: the state became non-finite (NaN or inf) during the run; rerun with "
           "throw=False and read Solution.nonfinite_time for the time it appeared")
    guarded = runtime_check((sol.ts, sol.xs, sol.stats), bad, msg)
    return eqx.tree_at(lambda s: (s.ts, s.xs, s.stats), sol, guarded, is_leaf=lambda v: v is None)


def _raise_if_saves_nonfinite(sol: Solution) -> None:
    """The watch looks at the integrated state; a save holds what the state shows there (its
    retraction, an interpolant between steps): NaN or inf in a saved state of a run that stayed
    finite is reported too, never handed back silently."""
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(sol.xs)
              if jnp.issubdtype(a.dtype, jnp.inexact) and is_concrete(a)]  # traced (jvp, grad): its tangent's run
    for a in leaves:
        bad = ~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1) if a.ndim else ~np.isfinite(a)
        if np.any(bad):
            k = int(np.argmax(bad))
            times = np.ravel(np.asarray(sol.ts))
            when = f" at t = {float(times[k]):.6g}" if k < times.size else ""
            raise NonFiniteStateError(
                f"solve: a saved state holds NaN or inf{when} though the integrated state stayed finite: "
                "what a save shows (the state mapped onto its manifold, or interpolated between steps) is "
                "not finite there (a token at the origin of the sphere's retraction, a step too large for the "
                "parameters or the noise)")


def default_max_steps(t0, t1, dt0, controller):
    if isinstance(controller, diffrax.StepTo):
        return len(controller.ts) - 1  # exactly the steps of the given grid
    if isinstance(controller, diffrax.ConstantStepSize) and dt0 is not None and all(
        is_concrete(v) for v in (t0, t1, dt0)
    ):
        steps = np.ceil((float(t1) - float(t0)) / float(dt0) * (1 + 1e-6)) + 1
        if not steps <= MAX_STEPS:
            raise ValueError(f"dt0={float(dt0):.6g} over [t0, t1] = [{float(t0):.6g}, {float(t1):.6g}] "
                             f"needs {steps:.4g} constant steps, more than {MAX_STEPS} (diffrax counts "
                             "steps in int32); use a larger dt0 or an adaptive stepsize_controller")
        steps = int(steps)
        # round up to a power of two: a new horizon reuses the compiled program
        return min(MAX_STEPS, max(16, 1 << (steps - 1).bit_length()))
    return 100_000


__all__ = ["MAX_STEPS", "solve"]
