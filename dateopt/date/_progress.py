"""DATE's adaptive mode: scale-invariant progress driven by the measured noise scale.

A tuned baseline (batch B0) has a learning-rate schedule lr0(τ) over T0 of its
own steps. At batch B = k·B0 one step is worth r_t baseline steps, with r_t
AdaScale's gain (Johnson et al. 2020, "AdaScale SGD: A User-Friendly Algorithm
for Distributed Training"), computed every step from the gradient noise scale
measured online (McCandlish et al. 2018, `dateopt.date._noise`)::

    r_t   = (tr Σ/B0 + |G|²) / (tr Σ/B + |G|²)        ∈ [1, k]
    lr_t  = ramp_t · r_t^p · lr0(max(τ_t, W))          p = 1 ("linear") or ½ ("sqrt")
    τ_t+1 = τ_t + ramp_t · r_t                         progress, in baseline steps

Training ends when τ reaches T0, so the run chooses its own number of steps:
about T0/k below the noise scale, about T0 far above it.

The warmup is LEGW's (You et al., "Large-Batch Training for LSTM and Beyond",
SC'19): as many steps as the baseline's warmup W, a linear ramp from 0,
ramp_t = min(1, (t+1)/W); it replaces the baseline's own warmup, so lr0 is
read at max(τ, W). A step at a fraction of the target LR is credited that
fraction of its gain.

A growing batch (`batch_sizes=`, a ladder from `batch_ladder`): the run
starts at the ladder's first rung and climbs one rung at a time as the
measured noise scale grows, the way Smith et al. (ICLR 2018, "Don't decay the
learning rate, increase the batch size") and McCandlish et al. (2018, the
critical batch grows in training) suggest, and Pollux (Qiao et al., OSDI
2021) does with AdaScale's gain. Every `growth_interval` steps after the
warmup, the engine moves from rung B to the next rung B' when::

    B · B' ≤ step_price · B_max · B_noise

and never shrinks. The rule prices a step at λ = step_price · B_max examples
and takes the rung that makes the run cheapest: a baseline step of progress
costs (B + λ)/r(B) ∝ B + λ + B_noise + λ·B_noise/B at batch B, smaller at B'
exactly when B·B' ≤ λ·B_noise; its continuous optimum is McCandlish's
B* = √(λ·B_noise). The batch follows the square root of the noise scale, not
the noise scale itself (the evidence: docs/results/engine_rules.md, 'The growth
rule'). Below the top rung the gain and the climb read B_noise × (B_max/B)^α
(`credited_noise`, α = `noise_batch_exponent`, 0.2): at equal progress a smaller
batch's hotter run reads less noise than the largest batch will, so readings taken
as they come would climb late (the evidence: docs/results/engine_rules.md, 'The noise
credit'). It does not climb past `early_rungs` × its first rung, nor to its largest,
before the run has learnt (its smoothed loss 2·`hold_share` below its start,
`dateopt.date._divergence.has_learnt`, when the loss is given as `value=`): a
plateau's noise readings are not resolved, and a gain or a batch taken from them
over-drives the LR. Up to that rung it climbs from its first look, warmup or
not: a batch a few times the baseline's gets off the plateau sooner (the
evidence: docs/results/engine_rules.md, 'The early climb'). Nor does it climb while the divergence watch holds the gain (a
rising loss): a rung is never given back. The gain and
the progress are those of the batch each step really had
(`GradientSqNorms.big_batch_size`), so a loop that follows the engine late
loses nothing. `next_batch_size(opt_state)` is the batch the
engine wants for the next step.

The controller: the divergence watch puts each step in a phase (`loss_phase`:
diverged, hold, plateau or learning) and one table, `PHASE_RULES`, says
for each phase the bound on the gain, whether the noise is measured and where the
batch goes next; the rules below are its rows.

Trust: the progress credits only what a step applied. A step the
divergence guard skipped credits nothing, one whose LR it backed off credits
that share (`lr_multiplier=`, which the guard passes). The gain may rise at
most `gain_rise` per step after its first `warm_in` measurements, and not
at all while the |G|² estimate is ≤ 0 (the noise then swamps the signal, and
the gain would jump to k). Each noise reading is winsorized against the EMAs
(`dateopt.date._noise.clip_readings`), so that one spike cannot triple the
noise scale, and with it the gain, within a growth interval. With the loss as `value=`,
`dateopt.date._divergence` watches the run. A step whose gradient jumps
`horizon` times its expected norm is skipped, so an exploding
gradient never reaches the optimizer's moments; so is a step whose gradient, or the
update the optimizer makes of it, is not finite (with the watch, both count toward
the watch's patience, `horizon` steps). While its loss is on the way up
the noise is not measured and the gain is 1 (the baseline's pace); once the run is
diverged it holds the progress, cuts the LR, and gives up after
`horizon` stalled steps. Every knob named here is a field of `EngineConfig`, or derived
from one.

`adaptive` is a plain optax transformation: any training loop can use it,
passing the step's `GradientSqNorms` as `update(..., grad_sq_norms=...)`, the
way `divergence_guard` takes `value=`.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from dateopt.date._divergence import (
    DIVERGENCE_RULES,
    DivergenceWatchState,
    adaptive_part,
    as_optax_state,
    count_gradient_jump,
    gradient_jump,
    has_learnt,
    init_watch,
    loss_rising,
    update_watch,
)
from dateopt.date._adam_scaling import injected
from dateopt.date._engine_config import EngineConfig, engine_config
from dateopt.date._guard import all_finite
from dateopt.date._noise import (
    GradientSqNorms,
    NoiseScaleState,
    check_batch_sizes,
    gain_from_estimates,
    init_noise_scale,
    noise_scale,
    update_noise_scale,
)
from dateopt.date._recipe import GAIN_RULES
from dateopt.validation import as_int, check_choice, check_range, check_scalar, check_type


class Observation(NamedTuple):
  """What one step showed `adaptive`: all its decisions read (`replay` feeds them back).

  Attributes:
    small_sq, big_sq: the step's squared gradient norms (`GradientSqNorms`; NaN:
      not measured).
    small_batch, big_batch: their batch sizes (int32; small_batch 0: no
      `grad_sq_norms` was given, and big_batch is the batch the engine asked for).
    loss: the loss passed as `value=` (NaN without one).
    lr_share: the share of the LR a divergence guard let the step apply
      (`lr_multiplier=`; 1 without one).
    grads_finite: whether every gradient entry was finite.
    update_finite: whether the inner optimizer's update was finite (True on a
      step that made none).
    seen: the steps the engine has read, this one included: a step a
      `divergence_guard` outside it rejected never reached it, and leaves the
      state, this count with it, as it was.
  """

  small_sq: jax.Array
  big_sq: jax.Array
  small_batch: jax.Array
  big_batch: jax.Array
  loss: jax.Array
  lr_share: jax.Array
  grads_finite: jax.Array
  update_finite: jax.Array
  seen: jax.Array


class AdaptiveState(NamedTuple):
  """State of `adaptive`.

  Attributes:
    inner_state: the wrapped optimizer's state (an `optax.inject_hyperparams`
      state whose `learning_rate` this transformation sets every step).
    progress: τ, the baseline steps covered so far (float32).
    count: steps taken at the large batch (updates applied).
    noise: the gradient-noise-scale EMAs the gain comes from.
    batch_size: the batch the engine asks for at the next step (int32): the
      fixed batch, or the current rung of a growing one.
    gain: the gain the last step applied (bounded; 1 before the first step).
    gain_batch_size: the batch of that step (int32).
    watch: the divergence watch (`dateopt.date._divergence`).
    phase: the index in `PHASES` of the phase the engine is in after its last
      step (`phase`).
    observation: what the last step showed the engine (`Observation`).
  """

  inner_state: Any
  progress: jax.Array
  count: jax.Array
  noise: NoiseScaleState
  batch_size: jax.Array
  gain: jax.Array
  gain_batch_size: jax.Array
  watch: DivergenceWatchState
  phase: jax.Array
  observation: Observation


#: The engine's rules that `adaptive(..., rules_off=...)` switches off, one name each, so that
#: an ablation can measure what each buys (`python -m dateopt.study --ablate`). The last three
#: are the divergence watch's ways into a diverged phase (`dateopt.date._divergence`).
ENGINE_RULES = ("gain_rise_bound", "rising_hold", "early_climb", "credited_noise",
                "winsorized_readings", "signal_horizon", "gradient_jump_skip") + DIVERGENCE_RULES
#: The rules that only a growing batch has: on a fixed batch, one of them off changes nothing.
LADDER_RULES = ("credited_noise", "early_climb")


def check_rules_off(rules_off: Sequence[str]) -> frozenset[str]:
  """`rules_off` as a set of `ENGINE_RULES` names; an unknown name raises ValueError naming it.

  Example:
    >>> sorted(check_rules_off(("rising_hold", "early_climb")))
    ['early_climb', 'rising_hold']
  """
  if isinstance(rules_off, str) or not isinstance(rules_off, (list, tuple, set, frozenset)):
    raise ValueError(f"rules_off must be a sequence of rule names, not {rules_off!r}; "
                     f"allowed: {', '.join(ENGINE_RULES)}.")
  for rule in rules_off:
    check_choice("rules_off", rule, ENGINE_RULES)
  return frozenset(rules_off)


def batch_ladder(base_batch_size: int, max_batch_size: int, *, multiple_of: int = 1
                 ) -> tuple[int, ...]:
  """The rungs of a growing batch: B0 (rounded up to `multiple_of`), doubling, up to the max.

  Every rung is a multiple of `multiple_of` (what the devices, gradient groups
  and accumulation need: `dateopt.train` passes its batch layout's quantum),
  and the last rung is `max_batch_size` itself. The arguments are whole numbers
  (16.0 and numpy integers pass; 16.5 raises ValueError naming it); the rungs are ints.

  Example:
    >>> batch_ladder(32, 2048)
    (32, 64, 128, 256, 512, 1024, 2048)
    >>> batch_ladder(20, 96, multiple_of=8)
    (24, 48, 96)
  """
  base_batch_size = as_int("base_batch_size", base_batch_size, low=1)
  multiple_of = as_int("multiple_of", multiple_of, low=1)
  max_batch_size = as_int("max_batch_size", max_batch_size, low=1)
  if max_batch_size % multiple_of:
    raise ValueError(f"max_batch_size={max_batch_size} must be a multiple of {multiple_of} "
                     f"(the batch layout's quantum).")
  start = -(-base_batch_size // multiple_of) * multiple_of
  check_range("max_batch_size", max_batch_size, low=start)
  rungs = [start]
  while 2 * rungs[-1] < max_batch_size:
    rungs.append(2 * rungs[-1])
  if rungs[-1] != max_batch_size:
    rungs.append(max_batch_size)
  return tuple(rungs)


def wants_next_rung(count, noise_scale_now, *, batch_size, next_batch_size, max_batch_size,
                    warmup_steps: int, step_price: float, growth_interval: int):
  """The growth rule, for Python numbers or jax arrays alike (the engine and the planner).

  After `count` steps: past the warmup, on a multiple of `growth_interval`,
  and with B · B' ≤ step_price · B_max · B_noise, where the next rung B' makes
  a baseline step of progress cheaper than B does, a step priced at
  step_price · B_max examples (a NaN B_noise, before the first measurement,
  never grows).

  Example:
    >>> # B_max = 2048, B_noise = 100: λ·B_noise = 204,800; 256 · 512 = 131,072 fits
    >>> rule = dict(max_batch_size=2048, warmup_steps=80, step_price=1.0, growth_interval=20)
    >>> wants_next_rung(100, 100.0, batch_size=256, next_batch_size=512, **rule)
    True
    >>> wants_next_rung(100, 100.0, batch_size=512, next_batch_size=1024, **rule)
    False
  """
  return ((count >= max(warmup_steps, 1)) & (count % growth_interval == 0)
          & (noise_scale_now * (step_price * max_batch_size)
             >= batch_size * next_batch_size))


def credited_noise(noise_state: NoiseScaleState, batch_size, *, max_batch_size: int,
                   exponent: float) -> NoiseScaleState:
  """The noise readings of rung `batch_size` credited to the largest rung's (arrays).

  tr Σ × (B_max/B)^α, so B_noise × (B_max/B)^α: at equal progress a smaller
  batch's run is hotter, its |G|² larger, and it reads less noise than the
  largest rung will (α = 0.2 ≈ log2 1.15, 1.15× per doubling; the evidence:
  docs/results/engine_rules.md, 'The noise credit'). The top rung, and
  with it a fixed batch, reads as measured; α = 0 turns the credit off.

  Example:
    >>> from dateopt.date._noise import GradientSqNorms, init_noise_scale, update_noise_scale
    >>> s = update_noise_scale(init_noise_scale(), GradientSqNorms(5.0, 2.375, 10, 80), 0.0)
    >>> credited = credited_noise(s, 80, max_batch_size=2560, exponent=0.2)  # × 32^0.2 = × 2
    >>> float(noise_scale(s)), round(float(noise_scale(credited)), 2)
    (15.0, 30.0)
  """
  if not exponent:  # static: as measured, bit for bit
    return noise_state
  factor = batch_credit(jnp.asarray(batch_size, jnp.float32), max_batch_size, exponent)
  return noise_state._replace(trace_ema=noise_state.trace_ema * factor)


def batch_credit(batch_size, max_batch_size, exponent):
  """(B_max/B)^α: what rung B's noise scale is multiplied by (numbers or arrays); with
  B = B0, what a run at B_max reads of the baseline's (`predicted_budget`).

  Example:
    >>> batch_credit(32, 1024, 0.2)  # five doublings at 1.149x each
    2.0
  """
  return (max_batch_size / batch_size) ** exponent


def _climb(batch_size, count, noise_state, ladder, warmup_steps, step_price, growth_interval,
           max_batch_size=None):
  """The next step's batch: one rung up `ladder` when `wants_next_rung`, else the same.

  `max_batch_size` (default: the ladder's last rung) prices the step.
  """
  rungs = jnp.asarray(ladder, jnp.int32)
  position = jnp.searchsorted(rungs, batch_size)
  upper = rungs[jnp.minimum(position + 1, len(ladder) - 1)]
  grow = wants_next_rung(count, noise_scale(noise_state),
                         batch_size=batch_size.astype(jnp.float32),
                         next_batch_size=upper.astype(jnp.float32),
                         max_batch_size=float(max_batch_size or ladder[-1]),
                         warmup_steps=warmup_steps, step_price=step_price,
                         growth_interval=growth_interval)
  return jnp.where(grow, upper, batch_size)


class PhaseRule(NamedTuple):
  """What the engine does in one phase of `PHASE_RULES`.

  Attributes:
    gain: the bound on AdaScale's gain (after its warm-in and rise bound,
      `bounded_gain`): "none"; "no_rise", the last step's gain; "one", the
      baseline's pace.
    measures: whether the step's noise readings enter the EMAs.
    climb: where the batch asked of the next step goes on a ladder: "growth_rule"
      (`wants_next_rung`), "early_rungs" (the growth rule up to `early_rungs` × the
      first rung, below the largest, warmup or not, on the readings as measured), or
      "stay".
  """
  gain: str
  measures: bool
  climb: str


#: The controller's table: the gain, the measurement and the climb in each phase the loss
#: puts a step in (`loss_phase`). LEGW's warmup ramps the LR whatever the phase; a run that
#: is done, or gave up, takes no step. Why each row (docs/results/engine_rules.md):
#: a plateau's noise readings are not resolved, so its batch climbs only to the early rungs
#: ('The early climb'); a rising loss's gradient noise, and a diverged run's, are the run's
#: own ('The rising-loss hold', 'The divergence watch').
PHASE_RULES = {
    "learning": PhaseRule(gain="none", measures=True, climb="growth_rule"),
    "plateau": PhaseRule(gain="none", measures=True, climb="early_rungs"),
    "hold": PhaseRule(gain="one", measures=False, climb="stay"),
    "diverged": PhaseRule(gain="no_rise", measures=False, climb="stay"),
}


def phase_rules(rules_off: frozenset[str] = frozenset()) -> dict[str, PhaseRule]:
  """`PHASE_RULES` less the `rules_off` that are a row's entry: "early_climb" (a plateau's
  batch stays).

  Example:
    >>> phase_rules(frozenset({"early_climb"}))["plateau"]
    PhaseRule(gain='none', measures=True, climb='stay')
  """
  plateau = PHASE_RULES["plateau"]
  if "early_climb" in rules_off:
    plateau = plateau._replace(climb="stay")
  return dict(PHASE_RULES, plateau=plateau)


def loss_phase(watch: DivergenceWatchState, config: EngineConfig,
               rules_off: frozenset[str] = frozenset()) -> jax.Array:
  """The row of `PHASE_RULES` the watch puts a step in, as an index into `PHASES`.

  The first that holds: "diverged" (`dateopt.date._divergence`), "hold" (the
  loss is rising, `loss_rising`), "plateau" (the run has not learnt,
  `has_learnt`), else "learning". A run whose watch has seen no loss is
  learning. "rising_hold" in `rules_off` takes the hold out.

  Example:
    >>> from dateopt.date._divergence import init_watch
    >>> PHASES[int(loss_phase(init_watch(), EngineConfig()))]
    'learning'
  """
  watched = watch.count > 0
  tests = [("diverged", watch.diverged_steps > 0)]
  if "rising_hold" not in rules_off:
    tests.append(("hold", watched & loss_rising(watch, config)))
  tests.append(("plateau", watched & ~has_learnt(watch, config)))
  return jnp.select([held for _, held in tests], [PHASES.index(name) for name, _ in tests],
                    default=PHASES.index("learning")).astype(jnp.int32)


def _by_phase(rules: Mapping[str, PhaseRule], now: jax.Array, entry: str,
              values: Mapping[Any, Any]) -> jax.Array:
  """`values[rule.<entry>]` for the rule of phase `now` (an index into `PHASES`)."""
  chosen = [jnp.asarray(values[getattr(rule, entry)]) for rule in rules.values()]
  return jnp.select([now == PHASES.index(name) for name in rules], chosen, default=chosen[0])


def _early_climb(batch_size, count, noise_state, ladder, config: EngineConfig):
  """One rung up the ladder's first `early_rungs` × B0, below its largest rung, by the
  growth rule priced at the full ladder's maximum, warmup or not; else the same batch."""
  early_ladder = tuple(b for b in ladder[:-1] if b <= config.early_rungs * ladder[0])
  if len(early_ladder) < 2:  # static: no rung to climb to before the run has learnt
    return batch_size
  early = _climb(batch_size, count, noise_state, early_ladder, 0, config.step_price,
                 config.growth_interval, ladder[-1])
  return jnp.where(batch_size < early_ladder[-1], early, batch_size)


def bounded_gain(measured, previous, trusted, *, max_rise: float, batch_ratio=1.0):
  """The gain a step applies: the measured one, risen at most `max_rise` since the last
  step, and not risen at all when the estimate is not `trusted` (Python numbers or arrays).

  `batch_ratio` is this step's batch over the last step's: the gain of a batch
  twice as large may be up to twice as large (a growing batch's new rung).

  Example:
    >>> [bounded_gain(m, 2.0, trusted, max_rise=0.25) for m, trusted in
    ...  [(8.0, True), (8.0, False), (1.5, True)]]
    [2.5, 2.0, 1.5]
    >>> bounded_gain(8.0, 2.0, True, max_rise=0.25, batch_ratio=2.0)
    5.0
  """
  previous = previous * batch_ratio
  cap = previous * (1.0 + max_rise)
  if isinstance(measured, (int, float)):
    return min(measured, cap if trusted else previous)
  return jnp.minimum(measured, jnp.where(trusted, cap, previous))


def _legw_ramp(count, warmup_steps: int) -> jax.Array:
  """LEGW's warmup at engine step `count`: min(1, (count + 1)/W), 1 without a warmup."""
  return (jnp.minimum(1.0, (count + 1).astype(jnp.float32) / warmup_steps)
          if warmup_steps else jnp.float32(1.0))


def _gain_multiplier(gain: jax.Array, gain_rule: str) -> jax.Array:
  return gain if gain_rule == "linear" else jnp.sqrt(gain)


def adaptive(
    make_optimizer: Callable[..., optax.GradientTransformation],
    base_schedule: optax.Schedule,
    *,
    base_batch_size: int,
    batch_size: int,
    base_steps: int,
    warmup_steps: int = 0,
    gain_rule: str = "linear",
    batch_sizes: Sequence[int] | None = None,
    config: EngineConfig | Mapping[str, Any] | None = None,
    measure_every_steps: int = 1,
    watch: bool = True,
    rung_hyperparams: Callable[..., dict] | None = None,
    rules_off: Sequence[str] = (),
) -> optax.GradientTransformationExtraArgs:
  """The baseline's schedule, walked at the pace the measured noise scale allows.

  Args:
    make_optimizer: `make_optimizer(learning_rate) -> GradientTransformation`,
      the baseline's optimizer family (e.g. `lambda learning_rate:
      optax.adam(learning_rate)`); its first argument must be called
      `learning_rate`. It is wrapped in `optax.inject_hyperparams`.
    base_schedule: the baseline's LR schedule, in baseline steps.
    base_batch_size: B0, the batch the baseline was tuned at.
    batch_size: B, the batch this run trains at (≥ B0); with `batch_sizes`,
      the largest (the last rung).
    base_steps: T0, the baseline's number of steps: training is done when
      the progress τ reaches it.
    warmup_steps: W, the baseline's warmup in steps (LEGW keeps it in steps).
    gain_rule: "linear" (lr × r, AdaScale's rule for SGD) or "sqrt" (lr × √r).
    batch_sizes: a growing batch: the ladder of batch sizes, increasing and
      ending at `batch_size` (`batch_ladder`). None: the batch stays at
      `batch_size`.
    config: the engine's knobs, an `EngineConfig` (or a mapping of its fields;
      None: the defaults): its horizon, warm-in, loss bands, gain rise, early
      rungs, the growth rule's step price and the noise credit's exponent.
    measure_every_steps: the loop measures the noise on one step in this many
      (`no_measurement` on the others): the EMAs' horizons stay in steps.
    watch: the divergence watch (`dateopt.date._divergence`): a diverged run is
      held, its LR cut, and given up after `config.patience` (the horizon) stalled
      steps and skipped gradient jumps in all. It needs the loss as `value=`;
      without it, it never fires.
    rung_hyperparams: `fn(k, lr_factor) -> {name: value}`, hyper-parameters of
      `make_optimizer` set at each step from its batch (k = B/B0) and the LR
      factor its gain applied (`dateopt.date._adam_scaling.rung_hyperparams`).
    rules_off: `ENGINE_RULES` switched off, to measure what each buys (an ablation;
      "gain_rise_bound" takes the |G|² ≤ 0 hold with it; the rules of the watch need
      `value=` and `watch`, "credited_noise" and "early_climb" a ladder).
      Default: every rule on.
  Returns:
    A `GradientTransformationExtraArgs` with state `AdaptiveState`. Call
    `update(grads, state, params, grad_sq_norms=sq_norms)` with the step's
    `GradientSqNorms` (`grouped_value_and_grad`, `cross_replica_sq_norms`,
    or `no_measurement` on steps that do not measure); its
    `big_batch_size` is the batch the step had. Without them nothing is
    measured and the gain stays 1: `update` warns at trace time (unless
    `batch_size` is the baseline's). `value=`, the loss, must be a scalar.
    A step whose gradient or update is not finite is skipped: a zero update,
    nothing credited. Once τ ≥ T0 every update is zero: check
    `progress_done(state, base_steps)` to stop. With a growing batch, train
    the next step at `next_batch_size(state)`.

  Example:
    >>> base = optax.cosine_decay_schedule(1e-2, 1000)
    >>> tx = adaptive(lambda learning_rate: optax.adam(learning_rate), base,
    ...               base_batch_size=32, batch_size=512, base_steps=1000)
    >>> params = {"w": jnp.ones(3)}
    >>> state = tx.init(params)
    >>> # |G|² = 1, tr Σ = 320 (B_noise = 320): r = (10 + 1)/(0.625 + 1)
    >>> sq = GradientSqNorms(1 + 320 / 64, 1 + 320 / 512, 64, 512)
    >>> updates, state = tx.update({"w": jnp.ones(3)}, state, params, grad_sq_norms=sq)
    >>> round(float(state.progress), 3)
    6.769
  """
  engine = _engine(base_schedule, base_batch_size=base_batch_size, batch_size=batch_size,
                   base_steps=base_steps, warmup_steps=warmup_steps, gain_rule=gain_rule,
                   batch_sizes=batch_sizes, config=config,
                   measure_every_steps=measure_every_steps, watch=watch, rules_off=rules_off)
  inner, set_step = injected(make_optimizer, rung_hyperparams)

  def init_fn(params):
    return _init_state(engine, inner.init(params))

  def update_fn(updates, state, params=None, *, grad_sq_norms: GradientSqNorms | None = None,
                value=None, lr_multiplier=None, **extra_args):
    return _engine_update(engine, inner, set_step, updates, state, params, extra_args,
                          grad_sq_norms=grad_sq_norms, value=value, lr_multiplier=lr_multiplier)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class _Engine(NamedTuple):
  """`adaptive`'s arguments, checked (the ladder a tuple or None, `off` the rules off)."""
  base_schedule: optax.Schedule
  base_batch_size: int
  batch_size: int
  base_steps: int
  warmup_steps: int
  gain_rule: str
  ladder: tuple[int, ...] | None
  config: EngineConfig
  noise_decay: float  # per measurement
  signal_decay: float | None  # None: the noise decay ("signal_horizon" off)
  noise_batch_exponent: float  # 0 with "credited_noise" off
  watch: bool
  off: frozenset[str]


def _engine(base_schedule: optax.Schedule, *, base_batch_size: int, batch_size: int,
            base_steps: int, warmup_steps: int = 0, gain_rule: str = "linear",
            batch_sizes: Sequence[int] | None = None,
            config: EngineConfig | Mapping[str, Any] | None = None,
            measure_every_steps: int = 1, watch: bool = True,
            rules_off: Sequence[str] = ()) -> _Engine:
  """`adaptive`'s settings checked (an error names the field) and gathered: what `adaptive`
  and `replay` run."""
  _check_adaptive(base_batch_size=base_batch_size, batch_size=batch_size, base_steps=base_steps,
                  warmup_steps=warmup_steps, gain_rule=gain_rule)
  check_type("watch", watch, bool, what="True or False")
  config = engine_config(config, "config")
  ladder = _check_ladder(batch_sizes, base_batch_size, batch_size)
  off = check_rules_off(rules_off)
  noise_decay, signal_decay = config.decays(measure_every_steps)
  return _Engine(base_schedule, base_batch_size, batch_size, base_steps, warmup_steps,
                 gain_rule, ladder, config, noise_decay,
                 None if "signal_horizon" in off else signal_decay,
                 0.0 if "credited_noise" in off else config.noise_batch_exponent, watch, off)


def _init_state(engine: _Engine, inner_state: Any) -> AdaptiveState:
  """The engine before its first step: no progress, the first rung, gain 1."""
  first_batch = jnp.asarray(engine.ladder[0] if engine.ladder else engine.batch_size, jnp.int32)
  nan = jnp.full((), jnp.nan, jnp.float32)
  nothing_seen = Observation(nan, nan, jnp.zeros((), jnp.int32), first_batch, nan,
                             jnp.ones((), jnp.float32), jnp.array(True), jnp.array(True),
                             jnp.zeros((), jnp.int32))
  return AdaptiveState(inner_state, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32),
                       init_noise_scale(), first_batch, jnp.ones((), jnp.float32), first_batch,
                       init_watch(), jnp.asarray(PHASES.index("warmup"), jnp.int32),
                       nothing_seen)


class _Decision(NamedTuple):
  """One step's decision (`_decide`): whether to take it, at what LR, and the engine's state
  after each outcome (their `inner_state` still the one before the step)."""
  take_step: jax.Array  # False: the schedule is covered, the run gave up, or the step is skipped
  learning_rate: jax.Array
  k: Any  # the step's batch over B0, for `rung_hyperparams` (a number on a fixed batch)
  lr_factor: jax.Array  # the gain's multiplier on the LR, for `rung_hyperparams`
  stepped: AdaptiveState  # the step taken
  idle: AdaptiveState  # the step not taken
  rejected: AdaptiveState  # the step taken, but its update not finite: skipped after all


def _engine_update(engine: _Engine, inner, set_step, updates, state: AdaptiveState, params,
                   extra_args, *, grad_sq_norms, value, lr_multiplier):
  """One step of `adaptive`: the engine's decision (`_decide`), then the inner optimizer's
  update at its LR; an update that is not finite is rejected (a zero update, as idle)."""
  _check_update(grad_sq_norms, value, measures=engine.batch_size > engine.base_batch_size)
  decision = _decide(engine, state, grad_sq_norms=grad_sq_norms, loss=value,
                     lr_multiplier=lr_multiplier, grads_finite=all_finite(updates))
  zeros = jax.tree.map(jnp.zeros_like, updates)

  def step():
    inner_state = set_step(state.inner_state, decision.learning_rate, k=decision.k,
                           lr_factor=decision.lr_factor)
    new_updates, new_inner = inner.update(updates, inner_state, params, **extra_args)
    stepped = new_updates, decision.stepped._replace(inner_state=new_inner)
    # An update the optimizer made non-finite (an infinite LR, 0/0) is skipped as well.
    return jax.tree.map(lambda new, old: jnp.where(all_finite(new_updates), new, old),
                        stepped, (zeros, decision.rejected))

  return jax.lax.cond(decision.take_step, step, lambda: (zeros, decision.idle))


def _decide(engine: _Engine, state: AdaptiveState, *, grad_sq_norms, loss, lr_multiplier,
            grads_finite) -> _Decision:
  """The watch and the noise readings, then the gain, the LR, the credit and the next batch:
  everything `adaptive` decides from one step's readings (`Observation`), its inner
  optimizer aside (`replay` runs it on recorded readings)."""
  # The batch over B0 as given (a Python number sets the optimizer's rung hyper-parameters in
  # float64); inside the engine the sizes are fenced arrays like the rest.
  k = _step_batch(engine, state, grad_sq_norms) / engine.base_batch_size
  state, grad_sq_norms, loss, lr_multiplier, grads_finite = _fenced(
      state, grad_sq_norms, loss, lr_multiplier, grads_finite)
  watching = loss is not None and engine.watch  # static
  watch = state.watch
  if watching:
    watch = update_watch(watch, loss, step=state.count, config=engine.config,
                         progress_fraction=state.progress / engine.base_steps,
                         rules_off=engine.off)
  healthy = watch.diverged_steps == 0
  # The row of PHASE_RULES; a step without a loss is not watched: it learns.
  now = (loss_phase(watch, engine.config, engine.off) if watching
         else jnp.int32(PHASES.index("learning")))
  rules = phase_rules(engine.off)
  measures = _by_phase(rules, now, "measures", {True: True, False: False})
  # A non-finite gradient is an explosion's limit: skipped like a jump, before it reaches the
  # inner state (Adam's moments would keep the NaN) or the noise EMAs (its norms may be fine).
  noise, jump = _measure(engine, state.noise, grad_sq_norms, measures & grads_finite)
  step_batch, read = _step_reading(engine, state, noise, grad_sq_norms)
  measured = gain_from_estimates(read, engine.base_batch_size, step_batch)
  settled = _settled_gain(measured, state, (noise.grad_sq_ema > 0) & healthy, step_batch,
                          engine.config, engine.off, healthy)
  gain = _phase_gain(state, rules, now, settled)
  ramp = _legw_ramp(state.count, engine.warmup_steps)
  lr_factor = _gain_multiplier(gain, engine.gain_rule)
  lr = ramp * lr_factor * engine.base_schedule(
      jnp.maximum(state.progress, float(engine.warmup_steps)))
  # Cut only when cut: a multiply by 1.0 could change XLA's fusion and the last bits.
  lr = jnp.where(watch.lr_scale == 1.0, lr, lr * watch.lr_scale)
  next_batch = _next_batch(engine, state, rules, now, noise, read)
  stepped = _stepped(state, watch, noise, ramp=ramp, gain=gain,
                     step_batch=step_batch, next_batch=next_batch, lr_multiplier=lr_multiplier,
                     healthy=healthy, held=measures & (gain < measured))
  seen = _observation(grad_sq_norms, loss, lr_multiplier, grads_finite, state.batch_size,
                      state.observation.seen)
  skip = jump | ~grads_finite
  take_step = ~((state.progress >= engine.base_steps) | watch.gave_up | skip)
  return _Decision(*_fenced(take_step, lr), k, *_fenced(lr_factor, *_outcomes(
      engine, state, stepped, watch, noise, skip, seen, now)))


def _stepped(state: AdaptiveState, watch, noise, *, ramp, gain, step_batch, next_batch,
             lr_multiplier, healthy, held) -> AdaptiveState:
  """The engine after a step taken: the progress credited the share of the LR it applied
  (nothing while diverged), its gain and batch, and `held` counted (the trust rules, not the
  loss, kept the gain below the measured one)."""
  applied = watch.lr_scale if lr_multiplier is None else watch.lr_scale * lr_multiplier
  # The credit's share goes into the gain, not onto the sum: `progress + ramp · gain`
  # keeps the rounding (XLA's fused multiply-add) of an engine without it, bit for bit.
  credited = jnp.where(healthy, jnp.where(applied == 1.0, gain, gain * applied), 0.0)
  return AdaptiveState(
      state.inner_state, state.progress + ramp * credited, state.count + 1, noise, next_batch,
      gain, jnp.asarray(step_batch, jnp.int32),
      watch._replace(gains_held=watch.gains_held + held.astype(jnp.int32)), state.phase,
      state.observation)


def _outcomes(engine: _Engine, state: AdaptiveState, stepped: AdaptiveState, watch, noise,
              skip, seen: Observation, now) -> tuple[AdaptiveState, AdaptiveState,
                                                     AdaptiveState]:
  """(stepped, idle, rejected): the engine after the step taken, not taken (`skip`, done or
  given up: the noise EMAs and the watch move on, a skipped step counts toward the
  patience), and taken but its update not finite (a skipped step); each with its phase (the
  step's phase `now`, as `shown_phase` shows it) and what the step showed it."""
  def idle(skipped):
    counted = (count_gradient_jump(watch, skipped, patience=engine.config.patience)
               if engine.watch else watch)  # static: no watch, no count
    return state._replace(noise=noise, watch=counted)

  def finish(after, update_finite):
    return after._replace(
        phase=shown_phase(after, now, base_steps=engine.base_steps,
                          warmup_steps=engine.warmup_steps),
        observation=seen._replace(update_finite=update_finite))

  return (finish(stepped, jnp.array(True)), finish(idle(skip), jnp.array(True)),
          finish(idle(jnp.array(True)), jnp.array(False)))


def _fenced(*values):
  """`values` through an optimization barrier, the states' `inner_state` around it.

  The engine's arithmetic is then compiled alone, not fused with the model's or
  the optimizer's: XLA contracts a multiply and an add into one fused
  multiply-add where they share a fusion, so the same engine in two programs
  (a train step and `replay`) would round differently in the last bit.
  """
  def strip(value):
    return value._replace(inner_state=None) if isinstance(value, AdaptiveState) else value
  fenced = jax.lax.optimization_barrier(tuple(strip(v) for v in values))
  return tuple(f._replace(inner_state=v.inner_state) if isinstance(v, AdaptiveState) else f
               for f, v in zip(fenced, values))


def _observation(grad_sq_norms, loss, lr_multiplier, grads_finite, asked_batch,
                 seen_before) -> Observation:
  """A step's readings as an `Observation` (NaN, 0 or 1 where one is not given)."""
  nan = jnp.full((), jnp.nan, jnp.float32)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  if grad_sq_norms is None:
    norms = nan, nan, jnp.zeros((), jnp.int32), jnp.asarray(asked_batch, jnp.int32)
  else:
    norms = (f32(grad_sq_norms.small), f32(grad_sq_norms.big),
             jnp.asarray(grad_sq_norms.small_batch_size, jnp.int32),
             jnp.asarray(grad_sq_norms.big_batch_size, jnp.int32))
  return Observation(*norms, nan if loss is None else f32(loss),
                     jnp.ones((), jnp.float32) if lr_multiplier is None else f32(lr_multiplier),
                     jnp.asarray(grads_finite), jnp.array(True), seen_before + 1)


def _step_batch(engine: _Engine, state: AdaptiveState, grad_sq_norms):
  """The batch this step had: the fixed one, else what the norms say, else the one asked for."""
  if not engine.ladder:
    return engine.batch_size
  return state.batch_size if grad_sq_norms is None else grad_sq_norms.big_batch_size


def _step_reading(engine: _Engine, state: AdaptiveState, noise, grad_sq_norms):
  """The batch this step had (`_step_batch`) and the noise reading its gain and climb use
  (`credited_noise` on a ladder)."""
  step_batch = _step_batch(engine, state, grad_sq_norms)
  if not engine.ladder:
    return step_batch, noise
  return step_batch, credited_noise(noise, step_batch, max_batch_size=engine.ladder[-1],
                                    exponent=engine.noise_batch_exponent)


def _phase_gain(state: AdaptiveState, rules, now, settled):
  """The gain the step applies: the settled gain (`_settled_gain`) under the bound its
  phase's rule sets (`PhaseRule.gain`)."""
  bounds = {"none": settled, "no_rise": jnp.minimum(settled, state.gain),
            "one": jnp.ones_like(settled)}
  return _by_phase(rules, now, "gain", bounds)


def _next_batch(engine: _Engine, state: AdaptiveState, rules, now, noise, read):
  """The batch asked of the next step: the same on a fixed batch; on a ladder, where its
  phase's rule climbs (`PhaseRule.climb`): by the growth rule on the credited readings
  `read`, or to the early rungs on the readings as measured (the credit is the batch trend
  of runs that learn; a plateau's readings are not resolved)."""
  batch, count = state.batch_size, state.count + 1
  if not engine.ladder:
    return batch
  climbs = {"growth_rule": _climb(batch, count, read, engine.ladder, engine.warmup_steps,
                                  engine.config.step_price, engine.config.growth_interval),
            "early_rungs": _early_climb(batch, count, noise, engine.ladder, engine.config),
            "stay": batch}
  return _by_phase(rules, now, "climb", climbs)


def _settled_gain(measured, state, trusted, step_batch, config, rules_off, healthy):
  """The first `warm_in` measurements set the gain; then it rises at most `gain_rise` a
  step (`bounded_gain`); with "gain_rise_bound" off, the measured gain on a healthy step (a
  diverged one still does not raise it)."""
  batch_ratio = jnp.asarray(step_batch, jnp.float32) / state.gain_batch_size
  if "gain_rise_bound" in rules_off:
    return jnp.where(healthy, measured, jnp.minimum(measured, state.gain * batch_ratio))
  return jnp.where(state.noise.count < config.warm_in, measured,
                   bounded_gain(measured, state.gain, trusted, max_rise=config.gain_rise,
                                batch_ratio=batch_ratio))


def _measure(engine: _Engine, noise, grad_sq_norms, ok):
  """The noise EMAs after the step's readings, and whether its gradient jumped
  (`gradient_jump`, only with the watch). A step not `ok` (a rising loss, a diverged run, a
  non-finite gradient), or one that jumped, leaves the EMAs as they were. Rules off:
  "gradient_jump_skip" (nothing is a jump), "winsorized_readings" (readings as read)."""
  if grad_sq_norms is None:  # static: either always given or never
    return noise, jnp.array(False)
  config, off = engine.config, engine.off
  jump = (gradient_jump(noise, grad_sq_norms, engine.noise_decay, config=config)
          if engine.watch and "gradient_jump_skip" not in off else jnp.array(False))
  measured = update_noise_scale(
      noise, grad_sq_norms, engine.noise_decay, signal_decay=engine.signal_decay,
      clip=None if "winsorized_readings" in off else config.reading_clip,
      clip_after=config.warm_in)
  return jax.tree.map(lambda new, old: jnp.where(ok & ~jump, new, old), measured, noise), jump


def _check_update(grad_sq_norms, value, *, measures: bool) -> None:
  """`adaptive`'s update arguments, at trace time: a scalar loss, and readings when the
  engine `measures` (its batch is larger than the baseline's: else the gain is 1 anyway)."""
  if value is not None:
    check_scalar("date.adaptive: value=", value, what="the scalar loss")
  if grad_sq_norms is not None:  # where concrete: inside, the engine fences them as arrays
    check_batch_sizes(grad_sq_norms.small_batch_size, grad_sq_norms.big_batch_size)
  if grad_sq_norms is None and measures:
    # A warning, not an error: without readings the engine still trains soundly, at the
    # baseline's pace (tracing an update, a smoke test); what must not pass is the silence.
    warnings.warn(
        "date.adaptive: update() got no grad_sq_norms, so no gradient noise is measured and "
        "the gain stays 1 (the baseline's pace; a growing batch stays at its first rung). "
        "Pass the step's GradientSqNorms as update(..., grad_sq_norms=...): from "
        "date.grouped_value_and_grad or "
        "date.cross_replica_sq_norms, and date.no_measurement on steps that do not measure.",
        UserWarning, stacklevel=3)


def _check_adaptive(*, base_batch_size, batch_size, base_steps, warmup_steps, gain_rule
                    ) -> None:
  """`adaptive`'s numbers and choices, checked: an error names the field and what it allows."""
  as_int("base_batch_size", base_batch_size, low=1)
  as_int("batch_size", batch_size, low=base_batch_size)
  as_int("base_steps", base_steps, low=1)  # before the warmup, whose range it sets
  check_range("warmup_steps", warmup_steps, low=0, high=base_steps, high_inclusive=False)
  check_choice("gain_rule", gain_rule, GAIN_RULES)


def _check_ladder(batch_sizes, base_batch_size, batch_size) -> tuple[int, ...] | None:
  """`batch_sizes` as a tuple of ints, checked: increasing, from ≥ B0 up to `batch_size`.

  Each rung is a whole number (an int, a numpy integer, 64.0), named when it is not.
  """
  if batch_sizes is None:
    return None
  ladder = tuple(as_int(f"batch_sizes[{i}]", b) for i, b in enumerate(batch_sizes))
  if (not ladder or any(not isinstance(b, int) for b in ladder)  # a jax array: not static
      or list(ladder) != sorted(set(ladder)) or ladder[0] < base_batch_size
      or ladder[-1] != batch_size):
    raise ValueError(
        f"batch_sizes must be increasing ints from >= base_batch_size={base_batch_size} to "
        f"batch_size={batch_size} (see batch_ladder); got {batch_sizes!r}.")
  return ladder


#: The engine's phases after a step, as `phase` tells them apart; `date/phase` logs the index
#: (a new phase goes at the end, so that a logged index keeps its name).
PHASES = ("warmup", "plateau", "learning", "hold", "diverged", "done", "gave_up")


def phase(state: AdaptiveState, *, base_steps: int, warmup_steps: int, config: EngineConfig,
          rules_off: frozenset[str] = frozenset()) -> jax.Array:
  """Which of `PHASES` the `adaptive` engine is in after its last step (an int32 index).

  The first that holds: "gave_up" (diverged for the watch's patience: updates
  are zero), "diverged" (a divergence under way: no progress credited, the LR
  cut), "done" (progress has covered `base_steps`), "warmup" (LEGW's ramp,
  engine step < `warmup_steps`), else the phase of `PHASE_RULES` the loss puts
  it in (`loss_phase`): "hold", "plateau" or "learning". A run
  without a loss (`value=`) has no watch: it is in "warmup", "learning" or
  "done".

  Example:
    >>> import optax
    >>> tx = adaptive(lambda learning_rate: optax.sgd(learning_rate),
    ...               optax.constant_schedule(0.1), base_batch_size=32, batch_size=512,
    ...               base_steps=1000, warmup_steps=5)
    >>> PHASES[int(phase(tx.init({"w": jnp.ones(2)}), base_steps=1000, warmup_steps=5,
    ...                  config=EngineConfig()))]
    'warmup'
  """
  return shown_phase(state, loss_phase(state.watch, config, rules_off),
                     base_steps=base_steps, warmup_steps=warmup_steps)


def shown_phase(state: AdaptiveState, now: jax.Array, *, base_steps: int,
                warmup_steps: int) -> jax.Array:
  """`now`, a phase of `PHASE_RULES` (an index into `PHASES`), shown as "gave_up", "done" or
  "warmup" where those hold of `state` (a diverged phase shows as such before "done")."""
  tests = [("gave_up", state.watch.gave_up), ("diverged", now == PHASES.index("diverged")),
           ("done", state.progress >= base_steps), ("warmup", state.count < warmup_steps)]
  return jnp.select([held for _, held in tests], [PHASES.index(name) for name, _ in tests],
                    default=now).astype(jnp.int32)


def progress_done(opt_state: Any, base_steps: int) -> jax.Array:
  """Whether the `adaptive` optimizer somewhere in `opt_state` has covered `base_steps`.

  A `scheduled_batch` optimizer's state is read alike (its examples seen over B0). A state
  without either raises ValueError (`dateopt.date._divergence.adaptive_part`).
  """
  return _batch_engine(opt_state).progress >= base_steps


def next_batch_size(opt_state: Any) -> jax.Array:
  """The batch the `adaptive` optimizer in `opt_state` wants for the next step (int32).

  A fixed-batch engine always says its `batch_size`; a growing one its current
  rung (a state without an `adaptive` optimizer raises ValueError). A loop follows it by
  feeding the next step that many examples:

    >>> tx = adaptive(lambda learning_rate: optax.sgd(learning_rate),
    ...               optax.constant_schedule(0.1), base_batch_size=32,
    ...               batch_size=128, base_steps=100,
    ...               batch_sizes=batch_ladder(32, 128))
    >>> int(next_batch_size(tx.init({"w": jnp.ones(2)})))
    32

  A `scheduled_batch` optimizer's state says its schedule's batch for the next step.
  """
  return _batch_engine(opt_state).batch_size


def _batch_engine(opt_state: Any) -> Any:
  """The state of the `adaptive` or `scheduled_batch` optimizer somewhere in `opt_state`."""
  scheduled = optax.tree.get(as_optax_state(opt_state), "BatchScheduleState")
  return scheduled if scheduled is not None else adaptive_part(opt_state,
                                                               AdaptiveState.__name__)


#: What `replay` gives for each step, the engine's decisions: also what the trainer records.
DECISIONS = ("phase", "gain", "progress", "batch_size", "count", "diverged_steps", "gave_up")


def replay(observations: Sequence[Any], base_schedule: optax.Schedule, *,
           loss_given: bool = True, **settings) -> list[dict[str, Any]]:
  """The engine's decisions, step by step, re-run from what a run's steps showed it.

  `adaptive` decides each step from its `Observation` alone: the squared gradient
  norms, the loss, the guard's LR share and whether the gradient and its update
  were finite. `replay` feeds a run's observations, in order, to the same code
  and returns what it decided after each: `DECISIONS` ("phase" by name of
  `PHASES`, "gain", "progress", "batch_size" asked of the next step, "count",
  "diverged_steps", "gave_up"), "learning_rate", the LR it set
  (or would have set, on a step it did not take), and "step_batch", the batch
  the step had. A step whose `seen` count is the last one's never reached the
  engine (a guard outside it rejected the step): its decisions are the last. Given the settings the run
  had, it reproduces the run's decisions bit for bit (`dateopt.train.replay_run`
  checks a trainer's workdir); given others, it says what they would have
  decided on the same readings, up to the first step where the run would have
  gone elsewhere (later readings depend on what was decided).

  Args:
    observations: one mapping a step with `Observation`'s fields (what
      `AdaptiveState.observation` holds after it) as numbers; a float may be
      the string "nan", "inf" or "-inf" (JSON has none). The trainer writes
      them to `engine.jsonl`.
    base_schedule: the baseline's LR schedule, in baseline steps.
    loss_given: whether the run passed its loss as `value=` (the trainer does):
      without it the divergence watch, and the rules that read the loss, are off.
    **settings: `adaptive`'s other keyword arguments (`base_batch_size`,
      `batch_size`, `base_steps`, `warmup_steps`, `batch_sizes`, `rules_off`,
      ...), but `rung_hyperparams`, which sets the inner optimizer alone.

  Example:
    >>> import optax
    >>> seen = [dict(small_sq=1 + 320 / 64, big_sq=1 + 320 / 512, small_batch=64,
    ...              big_batch=512, loss="nan", lr_share=1.0, grads_finite=True,
    ...              update_finite=True)]
    >>> decided = replay(seen, optax.cosine_decay_schedule(1e-2, 1000), loss_given=False,
    ...                  base_batch_size=32, batch_size=512, base_steps=1000)
    >>> round(decided[0]["progress"], 3), decided[0]["phase"]
    (6.769, 'learning')
  """
  engine = _engine(base_schedule, **settings)
  state = _init_state(engine, None)
  programs: dict[tuple, Callable] = {}
  decided = []
  for seen in observations:
    if "seen" in seen and int(seen["seen"]) == int(state.observation.seen):
      # A step the engine never read (a guard outside it rejected it): nothing changed.
      decided.append(dict(decided[-1]) if decided else dict(
          decisions(state), learning_rate=math.nan, step_batch=int(seen["big_batch"])))
      continue
    sizes = (int(seen["small_batch"]), int(seen["big_batch"]), loss_given)
    if sizes not in programs:  # the batch sizes are static in a trained step: here too
      programs[sizes] = jax.jit(functools.partial(_replay_step, engine, *sizes))
    readings = [jnp.float32(float(seen[name]))
                for name in ("small_sq", "big_sq", "loss", "lr_share")]
    state, lr = programs[sizes](state, *readings, jnp.bool_(seen["grads_finite"]),
                                jnp.bool_(seen["update_finite"]))
    decided.append(dict(decisions(state), learning_rate=float(lr),
                        step_batch=int(seen["big_batch"])))
  return decided


def _replay_step(engine: _Engine, small_batch: int, big_batch: int, has_loss: bool,
                 state: AdaptiveState, small_sq, big_sq, loss, lr_share, grads_finite,
                 update_finite) -> tuple[AdaptiveState, jax.Array]:
  """One recorded step through `_decide`, as `adaptive`'s update takes it (static sizes)."""
  sq_norms = (GradientSqNorms(small_sq, big_sq, small_batch, big_batch) if small_batch
              else None)
  decision = _decide(engine, state, grad_sq_norms=sq_norms, loss=loss if has_loss else None,
                     lr_multiplier=lr_share, grads_finite=grads_finite)
  taken = lambda: jax.tree.map(lambda new, old: jnp.where(update_finite, new, old),
                               decision.stepped, decision.rejected)
  return jax.lax.cond(decision.take_step, taken, lambda: decision.idle), decision.learning_rate


def decisions(state: AdaptiveState) -> dict[str, Any]:
  """The engine's `DECISIONS` after a step, as Python values (the phase by name)."""
  values = {"phase": PHASES[int(state.phase)], "gain": float(state.gain),
            "progress": float(state.progress), "batch_size": int(state.batch_size),
            "count": int(state.count),
            "diverged_steps": int(state.watch.diverged_steps),
            "gave_up": bool(state.watch.gave_up)}
  return {name: values[name] for name in DECISIONS}


def predicted_budget(noise_scales: float | Sequence[float], *, base_batch_size: int,
                     batch_sizes: Sequence[int], base_steps: int, warmup_steps: int = 0,
                     config: EngineConfig | Mapping[str, Any] | None = None,
                     read_at_batch_size: int | None = None,
                     losses: Sequence[float] | None = None) -> dict[str, Any]:
  """Steps, examples and the largest batch of an adaptive run, played out by the engine itself.

  The engine's own step (`_decide`, what `adaptive` and `replay` run) is fed,
  step after step, the readings a run would show it if the noise scale followed
  `noise_scales`: B_noise as a run at the baseline's batch B0 reads it, one
  number or a profile (values at equally spaced points of the baseline's
  progress, e.g. what the baseline logged). A step at rung B reads it
  × (B/B0)^α (α = `config.noise_batch_exponent`), the batch trend that `credited_noise`
  credits up to the largest rung's, as tr Σ/|G|² with tr Σ + |G|² = 1, read exactly. So the
  gain, its settling and rise bound, the LEGW ramp, the growth rule and the
  progress are the engine's, not a copy of them. `losses` (a profile over the
  baseline's progress from its start to its end, read between points by linear
  interpolation) is the loss each step shows the divergence watch: its plateau, hold and early climb then play out too; without
  it the watch is off and the loss is taken to fall from the first step.
  A one-rung ladder is a fixed batch. `read_at_batch_size` (default B0) is the
  batch of the run that read `noise_scales`.

  Returns:
    {"steps", "examples", "examples_vs_baseline", "largest_batch_size", "phase"}:
    "phase" is "done", "gave_up" where the losses made the watch give up, or
    "unfinished" where the run had not covered the baseline's steps in twice their
    number (float32 progress stops growing past 2^24 baseline steps at gain 1).

  Example:
    >>> budget = predicted_budget(1000.0, base_batch_size=100, batch_sizes=(1000,),
    ...                           base_steps=5500, config={"noise_batch_exponent": 0.0})
    >>> budget["steps"], budget["examples_vs_baseline"]
    (1000, 1.8181818181818181)
    >>> # read × 10^0.2 at batch 1,000: B_noise 1,585, gain 16.85/2.585 = 6.52, 5,500/6.52
    >>> predicted_budget(1000.0, base_batch_size=100, batch_sizes=(1000,),
    ...                  base_steps=5500)["steps"]
    844
  """
  config = engine_config(config, "config")
  profile, ladder = _check_budget_inputs(noise_scales, batch_sizes, base_batch_size, base_steps,
                                         warmup_steps)
  read_at = base_batch_size if read_at_batch_size is None else read_at_batch_size
  check_range("read_at_batch_size", read_at, low=1)
  if losses is not None:
    losses = list(losses)
    if not losses:
      raise ValueError("losses must be None or a non-empty sequence of numbers.")
    for value in losses:
      check_range("losses", value, low=0.0, finite=False)
  engine = _engine(_UNIT_SCHEDULE, base_batch_size=base_batch_size, batch_size=ladder[-1],
                   base_steps=base_steps, warmup_steps=warmup_steps,
                   batch_sizes=ladder if len(ladder) > 1 else None, config=config,
                   watch=losses is not None)
  state, rung_steps = _play_out(engine, jnp.asarray(profile, jnp.float32), float(read_at),
                                None if losses is None else jnp.asarray(losses, jnp.float32))
  examples = sum(int(n) * b for n, b in zip(rung_steps, ladder))  # Python ints: no overflow
  ended = ("gave_up" if bool(state.watch.gave_up)
           else "done" if float(state.progress) >= base_steps else "unfinished")
  return {"steps": int(state.count), "examples": examples,
          "examples_vs_baseline": examples / (base_steps * base_batch_size),
          "largest_batch_size": int(state.batch_size), "phase": ended}


def _UNIT_SCHEDULE(count):  # pylint: disable=invalid-name
  """The LR schedule of a play-out: the LR sets nothing the engine decides."""
  del count
  return jnp.float32(1.0)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _play_out(engine: _Engine, profile: jax.Array, read_at: float, losses: jax.Array | None
              ) -> tuple[AdaptiveState, jax.Array]:
  """The engine's steps over the readings `predicted_budget` describes, until its progress
  covers the baseline's steps, it gives up, or it has taken `_play_out_limit` steps: (its
  final state, the steps it took at each rung of its ladder)."""
  ladder = jnp.asarray(engine.ladder or (engine.batch_size,), jnp.int32)

  def reading_at(values, progress):
    point = (progress * len(values) / engine.base_steps).astype(jnp.int32)
    return values[jnp.minimum(point, len(values) - 1)]

  def step(carry):
    state, rung_steps = carry
    batch = state.batch_size.astype(jnp.float32)
    noise = reading_at(profile, state.progress) * (batch / read_at) ** engine.noise_batch_exponent
    # tr Σ + |G|² = 1 and tr Σ/|G|² = B_noise: finite from B_noise = 0 (no noise) to inf
    # (no signal), and a huge reading is a small signal, as in a run.
    trace, signal = noise / (1.0 + noise), 1.0 / (1.0 + noise)
    trace, signal = jnp.where(jnp.isinf(noise), 1.0, trace), jnp.where(jnp.isinf(noise), 0.0,
                                                                       signal)
    measured = batch > 1.0  # one example has no spread to read
    norms = GradientSqNorms(jnp.where(measured, signal + trace, jnp.nan),
                            jnp.where(measured, signal + trace / batch, jnp.nan),
                            jnp.int32(1), state.batch_size)
    loss = None if losses is None else jnp.interp(
        state.progress / engine.base_steps, jnp.linspace(0.0, 1.0, len(losses)), losses)
    decision = _decide(engine, state, grad_sq_norms=norms, loss=loss,
                       lr_multiplier=None, grads_finite=jnp.array(True))
    after = jax.lax.cond(decision.take_step, lambda: decision.stepped, lambda: decision.idle)
    taken = (after.count > state.count).astype(jnp.int32)
    return after, rung_steps + taken * (ladder == state.batch_size).astype(jnp.int32)

  def going(carry):
    state, _ = carry
    return ((state.progress < engine.base_steps) & ~state.watch.gave_up
            & (state.observation.seen < _play_out_limit(engine)))

  return jax.lax.while_loop(going, step, (_init_state(engine, None),
                                          jnp.zeros(ladder.shape, jnp.int32)))


def _play_out_limit(engine: _Engine) -> int:
  """The steps a play-out may take: at gain 1 a run covers the baseline's steps in about
  as many, plus half its warmup; twice that, and the watch's patience, end any other."""
  return 2 * (engine.base_steps + engine.warmup_steps) + 2 * (engine.config.patience
                                                             if engine.watch else 0)


def _check_budget_inputs(noise_scales, batch_sizes, base_batch_size, base_steps, warmup_steps
                         ) -> tuple[list[float], tuple[int, ...]]:
  """`predicted_budget`'s profile (a list of B_noise >= 0) and ladder, checked."""
  profile = [noise_scales] if isinstance(noise_scales, (int, float)) else list(noise_scales)
  if not profile:
    raise ValueError("noise_scales must be a number or a non-empty sequence of numbers.")
  for value in profile:
    check_range("noise_scales", value, low=0.0, finite=False)
  rungs = tuple(batch_sizes)  # a numpy array too: its truth value is ambiguous
  ladder = _check_ladder(rungs, base_batch_size, rungs[-1] if rungs else 0)
  as_int("base_steps", base_steps, low=1)
  check_range("warmup_steps", warmup_steps, low=0, high=base_steps, high_inclusive=False)
  return profile, ladder
