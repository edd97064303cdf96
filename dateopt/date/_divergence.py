"""DATE's divergence watch: a diverged adaptive run is held, its LR cut, and stopped if it stays.

Why the engine needs its own watch: once a model diverges, its gradients look
like noise, the measured noise scale soars, AdaScale's gain goes to k, and
the progress races to the baseline's total: the run "finishes" with a broken
model (the evidence: docs/results/engine_rules.md, 'The divergence watch'). The
divergence guard cannot see it: the loss rises over tens of steps, not as a
spike, and at chance level it stops rising at all.

The watch reads the step's loss (`value=`, as `divergence_guard` does), with the
bands of its `EngineConfig` (h the horizon, w the warm-in). It keeps `start`, the
smaller of the first loss and the mean of the first w losses (each capped at twice
the first, so a run that blows up in its first steps cannot lift it); `ema`, an
exponential mean of the loss (decay `loss_decay`, a 2w-step span; the first losses
weighted equally, each loss capped at four times the start so that one wild batch
cannot trip a rule); `fast`, the same over w/2 steps (`fast_decay`); and `best`,
the lowest `ema` so far.

A loss on its way up: once the run has learnt (best ≤ (1 − 2·hold_share) · start,
`has_learnt`) and `fast` has given back `hold_share` of it (`loss_rising`),
`adaptive` takes no noise measurement, walks at gain 1 (the baseline's pace)
and does not grow the batch. A growing batch also waits until the run
`has_learnt` to climb past its early rungs.

A step is diverged when, w losses in, one of these holds::

  relapse      the run had learnt and has climbed back half the way:
               ema − best ≥ ½ · (start − best)
  blow-up      ema ≥ 2 · start
  no learning  the progress covers a quarter of the baseline's steps, h losses
               are in, and the loss never fell below (1 − hold_share) · start

A diverged run is healthy again once its loss has fallen below (1 − hold_share) ·
start and is back near its best, ema − best ≤ ¼ · (start − best), below the
blow-up level: the gap between ½ and ¼ keeps a run at the threshold from
flapping. While diverged, the engine credits no progress and does not raise the
gain. The LR scale halves at once, and then every w diverged steps unless `fast`
fell by more than climb_share/3 · start in those steps (floor 2^-(h/w)): a run that
is recovering keeps the LR it recovers at. Healthy steps win the scale back, ×2
per 2w steps. A diverged step is stalled when `fast` has not fallen that far
since the last look, or `ema` is still at the blow-up level (or it is the first of
a divergence, or its loss is not finite). After h stalled steps and skipped
gradient jumps in all (a run that keeps relapsing counts every time) the engine
gives up for good: every update is zero, and `gave_up(opt_state)` says so.

`gradient_jump` (a gradient h² × its expected squared norm, h times in norm) is
the watch's third test: `adaptive` skips such a step (`count_gradient_jump`),
as it does a step whose gradient or update is not finite, and a run whose
gradients keep exploding is stopped by the same patience: its skipped steps
never move its loss, so it could neither diverge by the loss rules nor end
(the evidence: docs/results/engine_rules.md, 'The gradient-jump skip'). The
thresholds sit where a healthy run does not reach them (the evidence:
docs/results/engine_rules.md, 'The divergence watch'); where nothing fires, the
engine's arithmetic is that of an engine without the watch, bit for bit.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dateopt.date._engine_config import EngineConfig
from dateopt.date._guard import LossMoments, init_loss_moments, track_loss
from dateopt.date._noise import corrected_estimates

#: The watch's ways into a diverged phase, each of which `update_watch(rules_off=...)` can
#: switch off: a learnt run that gives back half its gains, a loss at twice its start, and a
#: run with no learning by a quarter of the schedule (`EngineConfig`).
DIVERGENCE_RULES = ("relapse", "blow_up", "no_learning")


class DivergenceWatchState(NamedTuple):
  """The watch's part of `AdaptiveState`.

  Attributes:
    loss: the running moments of the (capped) loss at `EngineConfig.loss_decay`
      (`dateopt.date._guard.track_loss`, the divergence guard's tracker): `count`,
      the losses seen, and `ema`, their mean, read it.
    fast_loss: the same at `EngineConfig.fast_decay`; `fast`, its mean, for `loss_rising`.
    initial: the first finite loss (the initial parameters').
    first: the mean of the first `warm_in` losses, each capped at 2 × `initial`.
    best: lowest `ema` once `first` is known.
    diverged_steps: diverged steps in a row (0: healthy).
    diverged_total: diverged steps in all.
    stalled_total: diverged steps in all whose loss was not falling: the
      engine gives up at `patience`.
    checked: `fast` at the last look (every `warm_in` diverged steps).
    diverged_at: the engine step at which the first divergence began; -1: never.
    divergences: divergences so far (each one a run of diverged steps).
    holds: steps so far whose loss was rising (`loss_rising`): no noise
      measurement, gain 1.
    gradient_jumps: steps skipped by `adaptive` for a `gradient_jump`, or for a
      gradient or update that is not finite (the limit of an explosion).
    gains_held: healthy, steady steps whose gain `adaptive` kept below the measured
      one (its rise bounded, or held on a |G|² estimate ≤ 0).
    lr_scale: the factor on the LR, 1 until a divergence cuts it.
    gave_up: the run stayed diverged for `patience` steps; updates are zero.
  """

  loss: LossMoments
  fast_loss: LossMoments
  initial: jax.Array
  first: jax.Array
  best: jax.Array
  diverged_steps: jax.Array
  diverged_total: jax.Array
  stalled_total: jax.Array
  checked: jax.Array
  diverged_at: jax.Array
  divergences: jax.Array
  holds: jax.Array
  gradient_jumps: jax.Array
  gains_held: jax.Array
  lr_scale: jax.Array
  gave_up: jax.Array

  @property
  def count(self) -> jax.Array:
    """The losses seen."""
    return self.loss.count

  @property
  def ema(self) -> jax.Array:
    """The running mean of the loss (a 2w-step span)."""
    return self.loss.mean

  @property
  def fast(self) -> jax.Array:
    """The faster running mean of the loss (a w/2-step span)."""
    return self.fast_loss.mean


def init_watch() -> DivergenceWatchState:
  zero_f, zero_i = jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
  return DivergenceWatchState(init_loss_moments(), init_loss_moments(), zero_f, zero_f,
                              jnp.full((), jnp.inf, jnp.float32),
                              zero_i, zero_i, zero_i, zero_f,
                              jnp.full((), -1, jnp.int32), zero_i, zero_i,
                              zero_i, zero_i,
                              jnp.ones((), jnp.float32), jnp.zeros((), jnp.bool_))


def _judge(was_diverged, count, start, ema, best, progress_fraction, config: EngineConfig,
           rules_off=frozenset()) -> jax.Array:
  """Whether the step is diverged: a rule meets a healthy run, or a diverged one has not
  recovered (see the module docstring); a rule in `rules_off` never meets it."""
  learnt = _learnt(start, best, config)
  moved = best <= config.stall_drop * start
  give_back = ema - best
  blown_up = ema >= config.blow_up * start
  no_learning = ((progress_fraction >= config.stall_progress) & (count >= config.horizon)
                 & ~moved & ("no_learning" not in rules_off))
  relapse = (learnt & (give_back >= config.relapse * (start - best))
             & ("relapse" not in rules_off))
  enters = relapse | (blown_up & ("blow_up" not in rules_off)) | no_learning
  stays = ~moved | (give_back > config.recovered * (start - best)) | blown_up
  return (count >= config.warm_in) & jnp.where(was_diverged, stays, enters)


def update_watch(state: DivergenceWatchState, loss: jax.Array, *, step: jax.Array,
                 progress_fraction: jax.Array, config: EngineConfig,
                 rules_off: frozenset[str] = frozenset()) -> DivergenceWatchState:
  """The watch after the loss of engine step `step` (its count before the step).

  A non-finite loss counts as diverged and leaves the statistics alone. `config` sets the
  bands (`EngineConfig`); `rules_off`: `DIVERGENCE_RULES` that never declare the run
  diverged (an ablation).

  Example:
    >>> watch = init_watch()
    >>> for loss in [2.3] * 10 + [0.5] * 100 + [2.0] * 40:   # learnt, then relapsed
    ...   watch = update_watch(watch, jnp.float32(loss), step=watch.count,
    ...                        progress_fraction=jnp.float32(0.1), config=EngineConfig())
    >>> int(watch.diverged_at), int(watch.diverged_steps) > 0, bool(watch.gave_up)
    (127, True, False)
  """
  loss = jnp.asarray(loss, jnp.float32)
  finite = jnp.isfinite(loss)
  count = state.count + finite.astype(jnp.int32)
  keep = lambda new, old: jnp.where(finite, new, old)
  initial = jnp.where(finite & (state.count == 0), loss, state.initial)
  opening = jnp.minimum(loss, config.blow_up * initial)  # one of the first losses, capped
  first = jnp.where(finite & (count <= config.warm_in),
                    state.first + (opening - state.first) / jnp.maximum(count, 1), state.first)
  # Then one wild batch moves the mean by at most (1 − loss_decay) · 2 · blow_up · first.
  capped = jnp.where(state.count >= config.warm_in,
                     jnp.minimum(loss, 2.0 * config.blow_up * state.first), opening)
  slow_loss = track_loss(state.loss, capped, config.loss_decay, take=finite)
  fast_loss = track_loss(state.fast_loss, capped, config.fast_decay, take=finite)
  ema, fast = slow_loss.mean, fast_loss.mean
  best = keep(jnp.where(count >= config.warm_in, jnp.minimum(state.best, ema), state.best),
              state.best)
  start = jnp.minimum(first, initial)  # a run that diverges at once cannot lift it
  diverged = ~finite | _judge(state.diverged_steps > 0, count, start, ema, best,
                             progress_fraction, config, rules_off)
  starts = diverged & (state.diverged_steps == 0)
  look = diverged & (state.diverged_steps % config.warm_in == 0)
  # Above the blow-up level a wild loss "falls" by chance half the time: not a recovery.
  falling = (fast < state.checked - config.fall_share * start) & (ema < config.blow_up * start)
  stalled = diverged & (starts | ~finite | ~falling)
  cut = look & stalled
  # A healthy run's scale stays exactly 1.0 (min(1.0 × growth, 1.0)).
  lr_scale = jnp.where(cut, jnp.maximum(state.lr_scale * 0.5, config.min_lr_scale),
                       jnp.where(diverged, state.lr_scale,
                                 jnp.minimum(state.lr_scale * 2.0 ** (1.0 / config.recovery_steps),
                                             1.0)))
  diverged_steps = jnp.where(diverged, state.diverged_steps + 1, 0)
  diverged_total = state.diverged_total + diverged.astype(jnp.int32)
  stalled_total = state.stalled_total + stalled.astype(jnp.int32)
  return DivergenceWatchState(
      slow_loss, fast_loss, initial, first, best, diverged_steps, diverged_total, stalled_total,
      jnp.where(look, fast, state.checked),
      jnp.where(starts & (state.divergences == 0), jnp.asarray(step, jnp.int32),
                state.diverged_at),
      state.divergences + starts.astype(jnp.int32),
      state.holds + _rising(count, start, fast, best, config).astype(jnp.int32),
      state.gradient_jumps, state.gains_held,
      lr_scale,
      state.gave_up | _out_of_patience(stalled_total, state.gradient_jumps, config.patience))


def count_gradient_jump(state: DivergenceWatchState, jump: jax.Array, *,
                        patience: int) -> DivergenceWatchState:
  """The watch after a step that `adaptive` skipped (`jump`) or not: skipped steps count
  toward the patience with the stalled ones."""
  jumps = state.gradient_jumps + jnp.asarray(jump, jnp.int32)
  return state._replace(gradient_jumps=jumps, gave_up=state.gave_up | _out_of_patience(
      state.stalled_total, jumps, patience))


def _out_of_patience(stalled_total, gradient_jumps, patience: int) -> jax.Array:
  """The give-up rule: stalled steps and skipped gradient jumps, counted together."""
  return stalled_total + gradient_jumps >= patience


def gradient_jump(noise: Any, sq_norms: Any, noise_decay: float, *, config: EngineConfig
                  ) -> jax.Array:
  """Whether the step's |G_B|² exceeds `config.gradient_jump` (h²) × the EMAs' |G|² + tr Σ / B.

  The EMAs are bias-corrected (they start at 0); before `config.warm_in` measurements,
  or with a non-positive expectation, nothing is a jump.

  Example:
    >>> from dateopt.date._noise import GradientSqNorms, init_noise_scale, update_noise_scale
    >>> noise = init_noise_scale()
    >>> for _ in range(10):
    ...   noise = update_noise_scale(noise, GradientSqNorms(5.0, 2.375, 10, 80), 0.99)
    >>> bool(gradient_jump(noise, GradientSqNorms(5e4, 2.4e4, 10, 80), 0.99, config=EngineConfig()))
    True
    >>> bool(gradient_jump(noise, GradientSqNorms(50.0, 24.0, 10, 80), 0.99, config=EngineConfig()))
    False
  """
  grad_sq, trace = corrected_estimates(noise, noise_decay)
  expected = grad_sq + trace / jnp.asarray(sq_norms.big_batch_size, jnp.float32)
  return ((noise.count >= config.warm_in) & (expected > 0)
          & (jnp.asarray(sq_norms.big, jnp.float32) > config.gradient_jump * expected))


def _learnt(start, best, config: EngineConfig) -> jax.Array:
  return best <= config.learnt * start


def _rising(count, first, ema, best, config: EngineConfig) -> jax.Array:
  return ((count >= config.warm_in) & _learnt(first, best, config)
          & (ema - best > config.hold_share * (first - best)))


def _start(state: DivergenceWatchState) -> jax.Array:
  """The loss the run's gains are measured from (as `update_watch` takes it)."""
  return jnp.minimum(state.first, state.initial)


def loss_rising(state: DivergenceWatchState, config: EngineConfig) -> jax.Array:
  """Whether the run had learnt and its loss (a w/2-step mean) has given back more than
  `config.hold_share` of it.

  A loss on its way up makes the gradient look like noise before any rule
  fires, and a gain read from it would speed the climb (the evidence:
  docs/results/engine_rules.md, 'The rising-loss hold'): `adaptive` then does not
  measure the noise, and walks at the baseline's pace (gain 1) until the loss is back.
  """
  return _rising(state.count, _start(state), state.fast, state.best, config)


def has_learnt(state: DivergenceWatchState, config: EngineConfig) -> jax.Array:
  """Whether the run's smoothed loss has fallen to `config.learnt` × its start (`warm_in`
  losses in).

  `adaptive` grows the batch past its early rungs only then: a plateau's noise
  readings are not resolved (the evidence: docs/results/engine_rules.md, 'The early
  climb').

    >>> watch = init_watch()
    >>> for loss in [2.3] * 10 + [1.5] * 40:
    ...   watch = update_watch(watch, jnp.float32(loss), step=watch.count,
    ...                        progress_fraction=jnp.float32(0.1), config=EngineConfig())
    >>> bool(has_learnt(watch, EngineConfig()))
    True
  """
  return (state.count >= config.warm_in) & _learnt(_start(state), state.best, config)


def as_optax_state(state: Any) -> Any:
  """`state` as the plain optax pytree of arrays the readers of DATE's state look through.

  An optax state comes back as it is. A Flax nnx `Optimizer` gives its
  `opt_state`, and every nnx `Variable` in it (an `Optimizer`'s `OptState`
  and `OptArray` leaves) its value (`nnx.as_pure`): the optax NamedTuples
  stay, so `optax.tree.get(..., "AdaptiveState")` finds the engine in either.
  (`nnx.state(optimizer)` does not keep them: it turns them into dicts.)
  flax is never imported here unless the program already has.

  Example:
    >>> import optax
    >>> from flax import nnx
    >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)
    >>> type(optimizer.opt_state[0].trace["kernel"]).__name__
    'OptVariable'
    >>> type(as_optax_state(optimizer)[0].trace["kernel"]).__name__
    'ArrayImpl'
  """
  if "flax.nnx" not in sys.modules:  # then no nnx object exists: nothing to unwrap
    return state
  from flax import nnx  # already loaded; flax stays an optional dependency
  if isinstance(state, nnx.Optimizer):
    state = state.opt_state
  is_variable = lambda x: isinstance(x, nnx.Variable)
  if not any(map(is_variable, jax.tree.leaves(state, is_leaf=is_variable))):
    return state
  if hasattr(nnx, "as_pure"):
    return nnx.as_pure(state)
  return jax.tree.map(lambda v: v.value if is_variable(v) else v, state, is_leaf=is_variable)


def adaptive_part(opt_state: Any, name: str) -> Any:
  """The part `name` (`"AdaptiveState"`, `"DivergenceWatchState"`) of the `adaptive`
  engine's state somewhere in `opt_state`: what every reader of the engine's state
  looks it up with, so that each one fails alike on a state without the engine.

  `opt_state` is an optax state, or a Flax nnx `Optimizer` or its `opt_state`
  (`as_optax_state`).

  Raises:
    ValueError: `opt_state` holds no such part (a plain optax optimizer's state).
  """
  part = optax.tree.get(as_optax_state(opt_state), name)
  if part is None:
    raise ValueError(f"opt_state holds no dateopt.date.adaptive state ({name}): pass the state "
                     f"of the optimizer date.adaptive or date.scheduled_batch (or date.build of "
                     f"an adaptive or batch-schedule recipe) made; with Flax nnx, the "
                     f"nnx.Optimizer or its opt_state.")
  return part


def _watch(opt_state: Any) -> DivergenceWatchState:
  return adaptive_part(opt_state, DivergenceWatchState.__name__)


def diverged(opt_state: Any) -> jax.Array:
  """Whether the `adaptive` engine in `opt_state` judged its last step diverged.

  While it is, the engine holds the progress and cuts the LR; a loop should
  not save a checkpoint then (the last one saved is the last healthy state).
  """
  return _watch(opt_state).diverged_steps > 0


def gave_up(opt_state: Any) -> jax.Array:
  """Whether the `adaptive` engine in `opt_state` stopped for good: the run stayed diverged.

  Its updates are zero from then on. Stop the loop, report it as failed, and
  keep the last checkpoint saved while `diverged` was False.

    >>> import optax
    >>> from dateopt.date._progress import adaptive
    >>> tx = adaptive(lambda learning_rate: optax.sgd(learning_rate),
    ...               optax.constant_schedule(0.1), base_batch_size=8, batch_size=8,
    ...               base_steps=100)
    >>> bool(gave_up(tx.init({"w": jnp.ones(2)})))
    False
  """
  return _watch(opt_state).gave_up
