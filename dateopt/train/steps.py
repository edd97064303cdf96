"""Train state, loss, and the jit-able train and eval steps (flax examples/imagenet shape).

Example:
  >>> state = create_train_state(model, tx, example_inputs, seed=0)
  >>> step = functools.partial(train_step, model=model, tx=tx, schedule=schedule,
  ...                          num_classes=10, seed=0)
  >>> state, metrics = jax.jit(step)(state, batch)
"""

from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax

from dateopt import date


@flax.struct.dataclass
class TrainState:
  """Everything a run needs to resume: the step, weights, BN statistics, optimizer."""

  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any


def create_train_state(model, tx: optax.GradientTransformation, example_inputs: jax.Array,
                       *, seed: int) -> TrainState:
  """Initialises the model and the optimizer from `seed`."""
  variables = model.init({"params": jax.random.key(seed), "dropout": jax.random.key(seed + 1)},
                         example_inputs, train=False)
  params = variables["params"]
  return TrainState(step=jnp.zeros([], jnp.int32), params=params,
                    batch_stats=variables.get("batch_stats", {}), opt_state=tx.init(params))


def cross_entropy(logits: jax.Array, labels: jax.Array, num_classes: int,
                  label_smoothing: float = 0.0) -> jax.Array:
  """Per-example (or per-token) cross-entropy, with optional label smoothing."""
  logits = logits.astype(jnp.float32)
  if label_smoothing == 0.0:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
  return optax.softmax_cross_entropy(logits, targets)


def apply_model(model, params, batch_stats, inputs, *, train: bool, rng=None):
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
    logits, new_stats = apply_model(model, params, batch_stats, batch["inputs"], train=True,
                                    rng=rng)
    loss = jnp.mean(cross_entropy(logits, batch["labels"], num_classes, label_smoothing))
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["labels"])
    return loss, (new_stats, accuracy)

  return loss_fn


def train_step(state: TrainState, batch: dict[str, jax.Array],
               record_statistics: jax.Array | None = None, *, model,
               tx: optax.GradientTransformation, schedule: Callable[[Any], Any],
               num_classes: int, seed: int, label_smoothing: float = 0.0,
               grad_groups: int = 0) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on a global batch; returns the new state and metrics.

  With `grad_groups > 1` the gradient is taken per group of the batch
  (`date.grouped_value_and_grad`) so the optimizer gets the squared gradient
  norms at group and full batch size: the gradient noise scale of DATE. The
  loss goes to the optimizer as `value=` (for `date.divergence_guard`).
  `record_statistics` (a bool array, for a `date.track_statistics` optimizer)
  says whether this step computes the DATE statistics; None: every step.
  """
  batch_size = batch["labels"].shape[0]
  step_key = jax.random.fold_in(jax.random.key(seed), state.step)
  num_keys = max(grad_groups, 1)  # one key per gradient group, repeated over its rows
  batch = dict(batch, rng=jnp.repeat(jax.random.split(step_key, num_keys),
                                     batch_size // num_keys))
  loss_fn = _loss_fn(model, num_classes, label_smoothing)
  extra = {}
  if grad_groups > 1:
    grad_fn = date.grouped_value_and_grad(loss_fn, grad_groups, has_aux=True)
    (loss, (batch_stats, accuracy)), grads, sq_norms = grad_fn(
        state.params, batch, state.batch_stats)
    extra["grad_sq_norms"] = sq_norms
  else:
    (loss, (batch_stats, accuracy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch, state.batch_stats)
  if record_statistics is not None:
    extra["record"] = record_statistics
  updates, opt_state = tx.update(grads, state.opt_state, state.params, value=loss, **extra)
  params = optax.apply_updates(state.params, updates)
  metrics = {"loss": loss, "accuracy": accuracy,
             "learning_rate": applied_learning_rate(schedule, state.opt_state, state.step)}
  metrics.update(optimizer_metrics(opt_state))
  new_state = state.replace(step=state.step + 1, params=params, batch_stats=batch_stats,
                            opt_state=opt_state)
  return new_state, metrics


def applied_learning_rate(schedule: Callable[[Any], Any], opt_state: Any,
                          step: jax.Array) -> jax.Array:
  """The LR the step about to run applies (before its own guard decision).

  Without a divergence guard: `schedule(step)`. With one, the inner optimizer
  advances on accepted steps only, so its schedule stands at the number of
  accepted steps, and the guard scales it by its current multiplier.
  """
  guard = _find_guard(opt_state)
  if guard is None:
    return schedule(step)
  return schedule(guard.num_accepted) * guard.lr_multiplier


def optimizer_metrics(opt_state: Any) -> dict[str, jax.Array]:
  """DATE statistics and guard counters found in the optimizer state, flat."""
  out = {}
  try:
    out.update({f"date/{k}": v for k, v in date.statistics(opt_state).items()})
  except ValueError:
    pass  # the optimizer is not wrapped in track_statistics.
  guard = _find_guard(opt_state)
  if guard is not None:
    out["guard/lr_multiplier"] = guard.lr_multiplier
    out["guard/num_skipped"] = guard.num_skipped
  return out


def _find_guard(opt_state: Any) -> date.DivergenceGuardState | None:
  """The first divergence guard's state in `opt_state`, or None."""
  is_guard = lambda x: isinstance(x, date.DivergenceGuardState)
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=is_guard) if is_guard(s)]
  return found[0] if found else None


def eval_step(state: TrainState, batch: dict[str, jax.Array], *, model,
              num_classes: int) -> dict[str, jax.Array]:
  """Sums of loss, correct predictions and counted examples (padding masked out)."""
  logits, _ = apply_model(model, state.params, state.batch_stats, batch["inputs"], train=False)
  mask = batch["mask"]
  loss = cross_entropy(logits, batch["labels"], num_classes)
  correct = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
  if loss.ndim > 1:  # language model: per-token values, the mask is per sequence.
    mask = jnp.broadcast_to(mask[:, None], loss.shape)
  return {"loss_sum": jnp.sum(loss * mask), "correct_sum": jnp.sum(correct * mask),
          "count": jnp.sum(mask)}
