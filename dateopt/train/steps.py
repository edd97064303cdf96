"""Train state, loss, and the jit-able train and eval steps (flax examples/imagenet shape).

Example:
  >>> state = create_train_state(model, tx, example_inputs, seed=0)
  >>> step = functools.partial(train_step, model=model, tx=tx, num_classes=10, seed=0)
  >>> state, metrics = jax.jit(step)(state, batch)
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dateopt import date
from dateopt.train import accumulation, engine_log
from dateopt.date import _batch_schedules as batch_schedules_lib
from dateopt.date import _builder as builder_lib
from dateopt.date import _noise as noise_lib


@flax.struct.dataclass
class TrainState:
  """Everything a run needs to resume: the step, weights, BN statistics, optimizer.

  `examples_seen` counts the training examples the steps took (int32): a
  growing batch's data position; `last_batch_size` is the batch of the last
  step taken (0 before the first).
  """

  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any
  examples_seen: jax.Array
  last_batch_size: jax.Array


def create_train_state(model, tx: optax.GradientTransformation, example_inputs: jax.Array,
                       *, seed: int) -> TrainState:
  """Initialises the model and the optimizer from `seed`."""
  variables = model.init({"params": jax.random.key(seed), "dropout": jax.random.key(seed + 1)},
                         example_inputs, train=False)
  params = variables["params"]
  return TrainState(step=jnp.zeros([], jnp.int32), params=params,
                    batch_stats=variables.get("batch_stats", {}), opt_state=tx.init(params),
                    examples_seen=jnp.zeros([], jnp.int32),
                    last_batch_size=jnp.zeros([], jnp.int32))


def cross_entropy(logits: jax.Array, labels: jax.Array, num_classes: int, *,
                  label_smoothing: float = 0.0) -> jax.Array:
  """Per-example (or per-token) cross-entropy, with optional label smoothing."""
  logits = logits.astype(jnp.float32)
  if label_smoothing == 0.0:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
  return optax.softmax_cross_entropy(logits, targets)


def apply_model(model, params, batch_stats, *, inputs, train: bool, rng=None):
  """Logits, and the new batch statistics when training a model that has them."""
  variables = {"params": params}
  if batch_stats:
    variables["batch_stats"] = batch_stats
  rngs = {"dropout": rng} if rng is not None else None
  if train and batch_stats:
    logits, updated = model.apply(variables, inputs, train=True, mutable=["batch_stats"],
                                  rngs=rngs)
    return logits, updated["batch_stats"]
  return model.apply(variables, inputs, train=train, rngs=rngs), batch_stats


def _loss_fn(model, num_classes, label_smoothing):
  """loss(params, batch, batch_stats) -> (mean loss, (new batch stats, accuracy))."""

  def loss_fn(params, batch, batch_stats):
    # The dropout key travels in the batch (one per group), so gradient groups
    # (vmapped slices of the batch) draw different dropout masks.
    rng = batch["rng"][0]
    logits, new_stats = apply_model(model, params, batch_stats, inputs=batch["inputs"],
                                    train=True, rng=rng)
    loss = jnp.mean(cross_entropy(logits, batch["labels"], num_classes,
                                  label_smoothing=label_smoothing))
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["labels"])
    return loss, (new_stats, accuracy)

  return loss_fn


def _gradients(loss_fn, params, batch, batch_stats, grad_groups: int,
               measure: jax.Array | None, grad_accum_steps: int = 1, leaf_scales=None):
  """(loss, aux), grads, and the noise scale's squared norms (None when not measured).

  With `grad_groups > 1` the gradient is taken per group of the batch
  (`date.per_group_value_and_grad`), which gives the squared norms at group
  and full batch size. `measure` takes that path only on the steps that
  measure, and the plain gradient with `noise_lib.no_measurement` on the others,
  so the grouping's cost is paid 1 step in N. A Python bool (the trainer's,
  a static argument) picks the path while tracing: two programs. A traced
  bool gives one program with a `lax.cond`, which XLA:CPU runs far slower: it
  does not parallelise computations nested in control flow (a ResNet's step
  measured 6x slower on 2 cores).
  With `grad_accum_steps` k > 1 either path runs over k micro-batches in a
  scan and averages their outputs (`accumulation.mean_over_microbatches`);
  each micro-batch holds 1/k of every group, so the group gradients, and the
  norms taken from them after the scan, are the full batch's. `leaf_scales`
  (`builder_lib.noise_leaf_scales`) measures the norms of the optimizer's step instead.
  """
  accumulate = lambda fn: accumulation.mean_over_microbatches(fn, grad_accum_steps)
  plain_fn = accumulate(jax.value_and_grad(loss_fn, has_aux=True))
  if grad_groups <= 1:
    return (*plain_fn(params, batch, batch_stats), None)
  batch_size = batch["labels"].shape[0]
  per_group_fn = accumulate(date.per_group_value_and_grad(loss_fn, grad_groups, has_aux=True))
  grouped = lambda: noise_lib.combine_group_grads(*per_group_fn(params, batch, batch_stats),
                                             batch_size, leaf_scales=leaf_scales)
  if measure is None:
    return grouped()
  plain = lambda: (*plain_fn(params, batch, batch_stats),
                   noise_lib.no_measurement(batch_size // grad_groups, batch_size))
  if isinstance(measure, (bool, np.bool_)):
    return grouped() if measure else plain()
  return jax.lax.cond(measure, grouped, plain)


def train_step(state: TrainState, batch: dict[str, jax.Array], *,
               record_statistics: jax.Array | None = None,
               measure_noise: jax.Array | None = None, model,
               tx: optax.GradientTransformation, num_classes: int, seed: int,
               label_smoothing: float = 0.0, grad_groups: int = 0,
               recipe: date.Recipe | None = None, grad_accum_steps: int = 1
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on a global batch; returns the new state and metrics.

  With `grad_groups > 1` the optimizer gets the squared gradient norms at
  group and full batch size as `grad_sq_norms=` (the gradient noise scale of
  `date.adaptive` / `date.measure_noise_scale`), on the steps where
  `measure_noise` is true (None: every step; pass a Python bool, static
  under `jax.jit`, rather than a traced one: see `_gradients`). The loss goes to the
  optimizer as `value=` (for `date.divergence_guard`). `record_statistics`
  (a bool array, for a `date.track_statistics` optimizer) says whether this
  step computes the DATE statistics; None: every step. For an adaptive
  `recipe`, a step taken after the progress has covered the baseline's steps
  changes nothing (the trainer stops at its next check).

  With `grad_accum_steps` k > 1 the batch is taken as k micro-batches in
  turn (row i in micro-batch i mod k; see `dateopt.train.accumulation`):
  the optimizer, guard and statistics still see the whole batch's mean
  gradient and loss once, and batch norm normalises each micro-batch alone.
  """
  run = lambda: _train_step(state, batch, record_statistics, measure_noise, model=model,
                            tx=tx, num_classes=num_classes, seed=seed,
                            label_smoothing=label_smoothing, grad_groups=grad_groups,
                            recipe=recipe, grad_accum_steps=grad_accum_steps)
  if recipe is None or not recipe.adaptive:
    return run()
  new_state, metrics = run()
  # The step is computed, then dropped when the progress was already covered: a
  # `lax.cond` around the forward and backward passes made XLA:CPU run the ResNet's
  # convolutions on one thread, 6x slower (nested computations are not parallelised).
  # The trainer stops at its next check, so at most a few steps are dropped.
  done = date.progress_done(state.opt_state, recipe.total_steps)
  kept = jax.tree.map(lambda old, new: jnp.where(done, old, new), state, new_state)
  # NaN metrics (-1 for counts: NaN has no int), but the progress that stops it.
  reported = jax.tree.map(
      lambda m: jnp.where(done, jnp.nan if jnp.issubdtype(m.dtype, jnp.inexact) else -1,
                          m).astype(m.dtype), metrics)
  reported["date/progress"] = optax.tree.get(kept.opt_state, "progress")
  reported["date/batch_size"] = date.next_batch_size(kept.opt_state)
  return kept, reported


def _dropout_keys(step_key: jax.Array, batch_size: int, grad_groups: int,
                  grad_accum_steps: int) -> jax.Array:
  """One dropout key per row: one per gradient group, and per micro-batch.

  The loss reads its batch's first key, so a gradient group (and each
  micro-batch's part of it) draws its own masks; without the micro-batch
  index folded in, every micro-batch would repeat the same masks.
  """
  num_keys = max(grad_groups, 1)  # one key per gradient group, repeated over its rows
  keys = jnp.repeat(jax.random.split(step_key, num_keys), batch_size // num_keys)
  if grad_accum_steps > 1:
    keys = jax.vmap(jax.random.fold_in)(
        keys, accumulation.microbatch_index(batch_size, grad_accum_steps))
  return keys


def _train_step(state, batch, record_statistics, measure_noise, *, model, tx, num_classes,
                seed, label_smoothing, grad_groups, recipe, grad_accum_steps):
  batch_size = batch["labels"].shape[0]
  step_key = jax.random.fold_in(jax.random.key(seed), state.step)
  batch = dict(batch, rng=_dropout_keys(step_key, batch_size, grad_groups, grad_accum_steps))
  loss_fn = _loss_fn(model, num_classes, label_smoothing)
  leaf_scales = None if recipe is None else builder_lib.noise_leaf_scales(recipe, state.params,
                                                                   state.opt_state)
  (loss, (batch_stats, accuracy)), grads, sq_norms = _gradients(
      loss_fn, state.params, batch, state.batch_stats, grad_groups, measure_noise,
      grad_accum_steps, leaf_scales)
  extra = {}
  if sq_norms is not None:
    extra["grad_sq_norms"] = sq_norms
  if record_statistics is not None:
    extra["record"] = record_statistics
  updates, opt_state = tx.update(grads, state.opt_state, state.params, value=loss, **extra)
  params = optax.apply_updates(state.params, updates)
  metrics = {"loss": loss, "accuracy": accuracy}
  learning_rate = applied_learning_rate(state.opt_state, opt_state)
  if learning_rate is not None:
    metrics["learning_rate"] = learning_rate
  metrics.update(optimizer_metrics(opt_state, recipe, batch_size))
  new_state = state.replace(step=state.step + 1, params=params, batch_stats=batch_stats,
                            opt_state=opt_state, examples_seen=state.examples_seen + batch_size,
                            last_batch_size=jnp.asarray(batch_size, jnp.int32))
  return new_state, metrics


def applied_learning_rate(old_opt_state: Any, new_opt_state: Any) -> jax.Array | None:
  """The LR the step applied: its `learning_rate` hyper-parameter × the guard's multiplier.

  `date.build` makes optimizers whose LR is an injected hyper-parameter
  (`optax.inject_hyperparams`, or set by `date.adaptive`), so the new state
  holds the one this step used. A divergence guard scales it by the
  multiplier it held before the step, and a step it skipped applied 0.
  None for an optimizer whose state holds no `learning_rate`.
  """
  # The hyper-parameter's value (an array), not its schedule's state of the same name.
  lr = optax.tree.get(new_opt_state, "learning_rate", filtering=lambda _, v: hasattr(v, "dtype"))
  if lr is None:
    return None
  old_guard = optax.tree.get(old_opt_state, "DivergenceGuardState")
  if old_guard is None:
    return lr
  new_guard = optax.tree.get(new_opt_state, "DivergenceGuardState")
  skipped = new_guard.num_skipped > old_guard.num_skipped
  return jnp.where(skipped, 0.0, lr * old_guard.lr_multiplier)


def optimizer_metrics(opt_state: Any, recipe: date.Recipe | None = None,
                      batch_size: int | None = None) -> dict[str, jax.Array]:
  """DATE statistics, noise scale, adaptive progress and guard counters, flat.

  The gain is that of `batch_size`, the step's batch (default: the recipe's).
  """
  out = {f"date/{k}": v for k, v in date.statistics(opt_state).items()}
  adaptive = optax.tree.get(opt_state, date.AdaptiveState.__name__)
  if adaptive is not None:
    out["date/progress"] = adaptive.progress
    out["date/batch_size"] = adaptive.batch_size  # what the engine asks of the next step
    out["date/gain"] = adaptive.gain  # the one applied: bounded, held while diverged
    if recipe is not None:
      out["date/gain_measured"] = noise_lib.gain_from_estimates(
          adaptive.noise, recipe.base_batch_size, batch_size or recipe.batch_size)
    out["date/diverged_steps"] = adaptive.watch.diverged_steps  # 0: healthy
    out["date/divergences"] = adaptive.watch.divergences  # so far: a healthy run's stay 0
    out["date/rising_loss_steps"] = adaptive.watch.holds  # steps walked at gain 1, unmeasured
    out["date/lr_scale"] = adaptive.watch.lr_scale
    out["date/gave_up"] = adaptive.watch.gave_up.astype(jnp.int32)
    out["date/phase"] = adaptive.phase  # an index into PHASES (docs/guides/training.md)
    out.update(engine_log.engine_metrics(adaptive))  # every step to engine.jsonl
  scheduled = optax.tree.get(opt_state, batch_schedules_lib.BatchScheduleState.__name__)
  if scheduled is not None:  # a field batch schedule: its progress and next batch
    out["date/progress"] = scheduled.progress
    out["date/batch_size"] = scheduled.batch_size
  guard = optax.tree.get(opt_state, "DivergenceGuardState")
  if guard is not None:
    out["guard/lr_multiplier"] = guard.lr_multiplier
    out["guard/num_skipped"] = guard.num_skipped
    out["guard/num_nonfinite"] = guard.num_nonfinite  # the trainer names these steps
  return out


def eval_step(state: TrainState, batch: dict[str, jax.Array], *, model,
              num_classes: int) -> dict[str, jax.Array]:
  """Sums of loss, correct predictions and counted examples (padding masked out)."""
  logits, _ = apply_model(model, state.params, state.batch_stats, inputs=batch["inputs"],
                             train=False)
  mask = batch["mask"]
  loss = cross_entropy(logits, batch["labels"], num_classes)
  correct = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
  if loss.ndim > 1:  # language model: per-token values, the mask is per sequence.
    mask = jnp.broadcast_to(mask[:, None], loss.shape)
  return {"loss_sum": jnp.sum(loss * mask), "correct_sum": jnp.sum(correct * mask),
          "count": jnp.sum(mask)}
