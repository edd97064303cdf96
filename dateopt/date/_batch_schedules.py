"""The field's batch schedules: the batch and the LR as functions of the examples seen.

The trainers users run grow the batch on a fixed schedule, with nothing
measured. Each rule here is a `BatchSchedule`: a step function of the
examples seen before a step (batch `batch_sizes[i]` from `boundaries[i-1]`
examples on) and an LR multiplier of the step's batch over the baseline's
schedule, which counts examples (baseline steps τ = examples / B0), so a ramp
never stretches the warmup nor leaves a decay unfinished:

  * "linear_ramp" (Megatron-LM `--rampup-batch-size START INCREMENT SAMPLES`,
    MaxText's `RampupBatchManager`): n = (B_max − START)/INCREMENT increments;
    after `consumed` examples the batch is START + ⌊consumed / (SAMPLES/n)⌋ ·
    INCREMENT, then B_max. The LR is not changed at a step-up: it is the LR
    planned for B_max, lr0 · √(B_max/B0) (the √ rule of LEGW's peak).
  * "doubling" (Megatron-LM's `--step-batch-size-schedule`, OLMo-core's
    `BatchSizeSchedulerCallback`): the batch doubles at evenly spaced example
    thresholds, and the (Adam) LR is multiplied by √(B_new/B_old) at each
    change: lr0 · √(B/B0).
  * "seesaw" (Meterez et al. 2025, arXiv 2510.14717): wherever the baseline's
    schedule has fallen by another factor α, the batch grows by 1/α and the LR
    is multiplied by 1/√α on top of the schedule (it falls by √α instead of
    α): lr0 · √(B/B0) over the schedule.
  * "batch_for_decay" (Smith, Kindermans, Ying & Le, ICLR 2018): at the same
    points, the batch grows by 1/α and the LR is kept: lr0 · √(B_s/B0) ·
    (B/B_s) over the schedule, B_s the first batch.

A start batch B_s above B0 starts at lr0 · √(B_s/B0) (the √ rule). Once the
batch reaches B_max it stays, and the schedule's own decay goes on.

Example:
  >>> ramp = linear_ramp(base_batch_size=32, max_batch_size=128, start_batch=32,
  ...                    increment=32, ramp_examples=6400)
  >>> ramp.batch_sizes, ramp.boundaries
  ((32, 64, 96, 128), (2134, 4267, 6400))
  >>> ramp.batch_at(2133), ramp.batch_at(2134), round(ramp.lr_multiplier(64), 3)
  (32, 64, 2.0)
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dateopt.date._adam_scaling import injected
from dateopt.validation import as_int, check_choice, check_range, check_type

#: The field's batch schedules `plan` and `scheduled_batch` know (see the module docstring).
BATCH_SCHEDULES = ("linear_ramp", "doubling", "seesaw", "batch_for_decay")

#: The options a user may give a schedule (`resolve_options`).
USER_OPTIONS = ("start_batch", "ramp_share", "ramp_examples", "increment", "alpha")
# The options each schedule takes in `Recipe.batch_schedule_options`, once planned.
SCHEDULE_OPTIONS = {
    "linear_ramp": ("start_batch", "increment", "ramp_examples"),
    "doubling": ("start_batch", "ramp_examples"),
    "seesaw": ("start_batch", "alpha"),
    "batch_for_decay": ("start_batch", "alpha"),
}

# A schedule value within this relative margin of α^k counts as having fallen to it: a
# cosine's float32 value at its half-way step is 0.5 to within an ulp, on either side.
_REACHED = 1e-6


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
  """The batch of each step, and its LR multiplier, as functions of the examples seen.

  Attributes:
    name: the rule (`BATCH_SCHEDULES`).
    base_batch_size: B0, the batch the baseline's LR was tuned at.
    batch_sizes: the batches in order, increasing; the last is the largest.
    boundaries: `boundaries[i]` is the examples seen from which the step takes
      `batch_sizes[i + 1]` (increasing, one fewer than `batch_sizes`).
    lr_reference: B_ref of the LR rule m(B) = √(B_ref/B0) · (B/B_ref)^p.
    lr_exponent: p: 0 keeps the LR (the ramp), ½ is the √ rule, 1 linear.
  """

  name: str
  base_batch_size: int
  batch_sizes: tuple[int, ...]
  boundaries: tuple[int, ...]
  lr_reference: int
  lr_exponent: float

  def __post_init__(self):
    check_choice("name", self.name, BATCH_SCHEDULES)
    object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
    object.__setattr__(self, "boundaries", tuple(self.boundaries))
    as_int("base_batch_size", self.base_batch_size, low=1)
    as_int("lr_reference", self.lr_reference, low=1)
    if self.batch_sizes and self.batch_sizes[0] < self.base_batch_size:
      raise ValueError(f"batch_sizes start at {self.batch_sizes[0]}, below base_batch_size="
                       f"{self.base_batch_size}.")
    if len(self.boundaries) != len(self.batch_sizes) - 1:
      raise ValueError(f"boundaries must be one fewer than batch_sizes; got "
                       f"{self.boundaries} for {self.batch_sizes}.")
    if list(self.batch_sizes) != sorted(set(self.batch_sizes)) or self.batch_sizes[0] < 1:
      raise ValueError(f"batch_sizes must be increasing positive ints; got {self.batch_sizes}.")
    if list(self.boundaries) != sorted(set(self.boundaries)) or (
        self.boundaries and self.boundaries[0] < 1):
      raise ValueError(f"boundaries must be increasing example counts >= 1; got "
                       f"{self.boundaries}.")

  @property
  def max_batch_size(self) -> int:
    return self.batch_sizes[-1]

  def batch_at(self, examples):
    """The batch of the step taken after `examples` examples (an int, or a jax int array)."""
    if isinstance(examples, (int, np.integer)):
      return self.batch_sizes[int(np.searchsorted(self.boundaries, examples, side="right"))]
    index = jnp.searchsorted(jnp.asarray(self.boundaries, jnp.int32), examples, side="right")
    return jnp.asarray(self.batch_sizes, jnp.int32)[index]

  def lr_multiplier(self, batch_size):
    """m(B): the factor on the baseline's LR at batch B (a number or a jax array)."""
    base = math.sqrt(self.lr_reference / self.base_batch_size)
    if self.lr_exponent == 0:
      return base
    ratio = batch_size / self.lr_reference
    return base * ratio ** self.lr_exponent

  def lr_multiplier_at(self, examples):
    """The LR multiplier of the step taken after `examples` examples."""
    return self.lr_multiplier(self.batch_at(examples))

  def steps_for(self, total_examples: int) -> tuple[int, int]:
    """(steps, examples) of a run that trains until it has seen `total_examples`.

    Example:
      >>> doubling(base_batch_size=8, max_batch_size=32, start_batch=8,
      ...          ramp_examples=800).steps_for(1600)   # 50 at 8, 25 at 16, 25 at 32
      (100, 1600)
    """
    total = as_int("total_examples", total_examples, low=1)
    seen = steps = 0
    for batch, end in zip(self.batch_sizes, self.boundaries + (total,)):
      end = min(end, total)
      if seen < end:
        taken = -(-(end - seen) // batch)
        seen, steps = seen + taken * batch, steps + taken
    return steps, seen

  def rounded(self, multiple_of: int) -> "BatchSchedule":
    """Each batch rounded up to a multiple of `multiple_of` (the devices' batch layout),
    rungs that round alike merged at the earliest boundary."""
    quantum = as_int("multiple_of", multiple_of, low=1)
    if self.max_batch_size % quantum:
      raise ValueError(f"the largest batch {self.max_batch_size} must be a multiple of "
                       f"{quantum}.")
    batches, bounds = [], []
    for i, batch in enumerate(self.batch_sizes):
      up = min(-(-batch // quantum) * quantum, self.max_batch_size)
      if batches and up == batches[-1]:
        continue
      if batches:
        bounds.append(self.boundaries[i - 1])
      batches.append(up)
    return dataclasses.replace(self, batch_sizes=tuple(batches), boundaries=tuple(bounds))

  def describe(self) -> str:
    """One line: the batches and where each starts, in examples."""
    starts = ["0"] + [f"{e:,}" for e in self.boundaries]
    return ", ".join(f"{b:,} from {s}" for b, s in zip(self.batch_sizes, starts))


def _check_batches(base_batch_size, max_batch_size, start_batch) -> tuple[int, int, int]:
  b0 = as_int("base_batch_size", base_batch_size, low=1)
  top = as_int("max_batch_size", max_batch_size, low=b0)
  start = as_int("start_batch", start_batch, low=b0)
  check_range("start_batch", start, low=b0, high=top)
  return b0, top, start


def linear_ramp(*, base_batch_size: int, max_batch_size: int, start_batch: int,
                increment: int, ramp_examples: int) -> BatchSchedule:
  """Megatron-LM's `--rampup-batch-size START INCREMENT RAMP_SAMPLES`.

  With n = (B_max − START)/INCREMENT (it must divide exactly), the batch after
  `consumed` examples is START + ⌊consumed / (RAMP_SAMPLES/n)⌋ · INCREMENT up
  to B_max; the LR is B_max's throughout (lr0 · √(B_max/B0), the √ rule).

  Example:
    >>> linear_ramp(base_batch_size=32, max_batch_size=128, start_batch=64,
    ...             increment=32, ramp_examples=1000).boundaries
    (500, 1000)
  """
  b0, top, start = _check_batches(base_batch_size, max_batch_size, start_batch)
  step = as_int("increment", increment, low=1)
  ramp = as_int("ramp_examples", ramp_examples, low=0)
  if (top - start) % step:
    raise ValueError(f"increment={step} must divide max_batch_size - start_batch = "
                     f"{top - start} (Megatron-LM's rule: a whole number of increments; "
                     f"the increment defaults to the start batch).")
  n = (top - start) // step
  if n and ramp < n:
    raise ValueError(f"ramp_examples={ramp} must be at least the {n} increments.")
  # consumed >= i·ramp/n, for whole examples, is consumed >= ⌈i·ramp/n⌉.
  bounds = tuple(-(-i * ramp // n) for i in range(1, n + 1))
  return BatchSchedule("linear_ramp", b0, tuple(start + i * step for i in range(n + 1)),
                       bounds, lr_reference=top, lr_exponent=0.0)


def doubling(*, base_batch_size: int, max_batch_size: int, start_batch: int,
             ramp_examples: int) -> BatchSchedule:
  """The batch doubles at evenly spaced thresholds, reaching B_max at `ramp_examples`.

  Megatron-LM's `--step-batch-size-schedule "0:B 250B:2B 500B:4B ..."` and
  OLMo-core's `BatchSizeSchedulerCallback`; the LR is multiplied by √2 at each
  doubling (OLMo-core's rule for Adam): lr0 · √(B/B0). B_max/start must be a
  power of 2.

  Example:
    >>> doubling(base_batch_size=8, max_batch_size=32, start_batch=8,
    ...          ramp_examples=800).boundaries
    (400, 800)
  """
  b0, top, start = _check_batches(base_batch_size, max_batch_size, start_batch)
  ramp = as_int("ramp_examples", ramp_examples, low=0)
  n = round(math.log2(top / start))
  if start << n != top:
    raise ValueError(f"max_batch_size / start_batch = {top}/{start} must be a power of 2 for "
                     f"a doubling schedule.")
  if n and ramp < n:
    raise ValueError(f"ramp_examples={ramp} must be at least the {n} doublings.")
  bounds = tuple(-(-i * ramp // n) for i in range(1, n + 1))
  return BatchSchedule("doubling", b0, tuple(start << i for i in range(n + 1)), bounds,
                       lr_reference=start, lr_exponent=0.5)


def decay_points(base_schedule: optax.Schedule, base_steps: int, *, warmup_steps: int,
                 alpha: float, count: int) -> tuple[int, ...]:
  """The first `count` baseline steps (after the warmup) where `base_schedule` has fallen
  to α, α², … of its peak; fewer where it never falls that far.

  Example:
    >>> decay_points(optax.cosine_decay_schedule(1.0, 100), 100, warmup_steps=0,
    ...              alpha=0.5, count=2)
    (50, 67)
  """
  lrs = np.broadcast_to(  # a constant schedule gives one value for every step
      np.asarray(jax.device_get(base_schedule(jnp.arange(base_steps + 1))), np.float64),
      (base_steps + 1,))
  peak = lrs[warmup_steps:].max()
  points = []
  for k in range(1, count + 1):
    below = np.nonzero(lrs[warmup_steps:] <= peak * alpha ** k * (1 + _REACHED))[0]
    if not below.size:
      break
    points.append(int(below[0]) + warmup_steps)
  return tuple(points)


def seesaw(*, base_batch_size: int, max_batch_size: int, start_batch: int, alpha: float,
           base_schedule: optax.Schedule, base_steps: int, warmup_steps: int = 0,
           keep_lr: bool = False) -> BatchSchedule:
  """Seesaw (Meterez et al. 2025): at each point where the baseline's schedule has
  fallen by another α, the batch × 1/α and the LR × 1/√α over the schedule.

  With `keep_lr`, Smith et al.'s "batch_for_decay" (ICLR 2018): the batch × 1/α and
  the LR kept (× 1/α over the schedule). The points are counted in baseline steps
  of `base_schedule` (τ = examples / B0); batches are rounded to whole examples; a
  step decay that falls past several powers of α at once is one step-up.

  The LR is the schedule's × √(B/B0) (× B/B_s · √(B_s/B0) with `keep_lr`) at every
  step: on a step decay it falls by √α (is kept) at each cut, as the rules say. On a
  continuous decay it falls with the schedule within a phase and rises by 1/√α (1/α)
  at each step-up: the papers' equivalence of (η, B) and (η·√k, k·B) for Adam (η·k
  for SGD) applied at every step.

  Example:
    >>> s = seesaw(base_batch_size=8, max_batch_size=32, start_batch=8, alpha=0.5,
    ...            base_schedule=optax.cosine_decay_schedule(1.0, 100), base_steps=100)
    >>> s.batch_sizes, s.boundaries, round(s.lr_multiplier(16), 4)
    ((8, 16, 32), (400, 536), 1.4142)
  """
  b0, top, start = _check_batches(base_batch_size, max_batch_size, start_batch)
  _check_alpha(alpha)
  steps = as_int("base_steps", base_steps, low=1)
  levels = math.ceil(math.log(top / start) / -math.log(alpha) - _REACHED)  # falls to B_max
  points = decay_points(base_schedule, steps, warmup_steps=warmup_steps, alpha=alpha,
                        count=levels)
  if levels and not points:
    warnings.warn(f"the baseline's schedule never falls to α = {alpha:g} of its peak after its "
                  f"warmup: the {'batch_for_decay' if keep_lr else 'seesaw'} schedule keeps "
                  f"the batch at {start}.", UserWarning, stacklevel=2)
  batches, bounds = [start], []
  for level, point in enumerate(points, start=1):
    batch = min(top, max(batches[-1] + 1, round(start / alpha ** level)))
    if bounds and bounds[-1] == point * b0:  # a step decay passes several levels at once
      batches[-1] = batch
    else:
      batches.append(batch)
      bounds.append(point * b0)
  return BatchSchedule("batch_for_decay" if keep_lr else "seesaw", b0, tuple(batches),
                       tuple(bounds), lr_reference=start, lr_exponent=1.0 if keep_lr else 0.5)


def _check_alpha(alpha) -> None:
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
    raise TypeError(f"alpha must be a number in (0, 1); got {alpha!r}.")
  check_range("alpha", alpha, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)


class BatchScheduleState(NamedTuple):
  """State of `scheduled_batch`.

  Attributes:
    inner_state: the wrapped optimizer's (`optax.inject_hyperparams`) state.
    progress: τ, the baseline steps the examples seen cover (examples / B0).
    examples: the examples seen (int32).
    count: steps taken.
    batch_size: the batch of the next step (int32).
  """

  inner_state: Any
  progress: jax.Array
  examples: jax.Array
  count: jax.Array
  batch_size: jax.Array


def scheduled_batch(make_optimizer: Callable[..., optax.GradientTransformation],
                    base_schedule: optax.Schedule, schedule: BatchSchedule, *,
                    base_steps: int, rung_hyperparams: Callable[..., dict] | None = None
                    ) -> optax.GradientTransformationExtraArgs:
  """The baseline's schedule counted in examples, the batch and LR factor from `schedule`.

  Each step applies lr = base_schedule(τ) · m(B), τ = examples seen / B0, B the step's batch
  (`BatchSchedule.lr_multiplier`), then asks for `schedule.batch_at(examples seen)`. Once τ
  reaches `base_steps` (the budget) every update is zero: stop on `progress_done(state,
  base_steps)`; train each step at `next_batch_size(state)`.

  Args:
    make_optimizer: `make_optimizer(learning_rate) -> GradientTransformation`.
    base_schedule: the baseline's LR schedule, in baseline steps.
    schedule: the batch schedule (`linear_ramp`, `doubling`, `seesaw`).
    rung_hyperparams: `fn(k, lr_factor) -> {name: value}`, hyper-parameters of
      `make_optimizer` set at each step from its batch (k = B/B0) and LR factor
      m(B) (`dateopt.date._adam_scaling.rung_hyperparams`).

  Example:
    >>> ramp = linear_ramp(base_batch_size=4, max_batch_size=16, start_batch=8,
    ...                    increment=8, ramp_examples=16)
    >>> tx = scheduled_batch(lambda learning_rate: optax.sgd(learning_rate),
    ...                      optax.constant_schedule(0.1), ramp, base_steps=10)
    >>> state = tx.init({"w": jnp.ones(2)})
    >>> _, state = tx.update({"w": jnp.ones(2)}, state)
    >>> int(state.examples), int(state.batch_size), round(float(state.progress), 2)
    (8, 8, 2.0)
  """
  check_type("schedule", schedule, BatchSchedule, what="a dateopt.date.BatchSchedule")
  steps = as_int("base_steps", base_steps, low=1)
  b0 = schedule.base_batch_size
  inner, set_step = injected(make_optimizer, rung_hyperparams)

  def init_fn(params):
    return BatchScheduleState(inner.init(params), jnp.zeros((), jnp.float32),
                              jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32),
                              jnp.asarray(schedule.batch_sizes[0], jnp.int32))

  def update_fn(updates, state, params=None, **extra_args):
    for name in ("grad_sq_norms", "value", "lr_multiplier"):  # the engine's, unused here
      extra_args.pop(name, None)
    batch = state.batch_size.astype(jnp.float32)
    factor = schedule.lr_multiplier(batch)
    lr = base_schedule(state.examples.astype(jnp.float32) / b0) * factor

    def step():
      inner_state = set_step(state.inner_state, lr, k=batch / b0, lr_factor=factor)
      new_updates, new_inner = inner.update(updates, inner_state, params, **extra_args)
      examples = state.examples + state.batch_size
      return new_updates, BatchScheduleState(new_inner, _baseline_steps(examples, b0, steps),
                                             examples, state.count + 1,
                                             schedule.batch_at(examples))

    def idle():
      return jax.tree.map(jnp.zeros_like, updates), state

    return jax.lax.cond(state.progress >= steps, idle, step)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _baseline_steps(examples: jax.Array, base_batch_size: int, base_steps: int) -> jax.Array:
  """examples / B0 in float32, below `base_steps` until the budget's examples are seen: a
  large count must not round up to the end a step early."""
  progress = examples.astype(jnp.float32) / base_batch_size
  below = jnp.nextafter(jnp.float32(base_steps), jnp.float32(0))
  return jnp.where(examples >= base_steps * base_batch_size, jnp.maximum(progress, base_steps),
                   jnp.minimum(progress, below))


def resolve_options(name: str, options: Mapping[str, Any] | None, *, base_batch_size: int,
                    max_batch_size: int, budget_examples: int) -> dict[str, Any]:
  """A schedule's options with their defaults, checked, as a recipe records them.

  User options: "start_batch" (every schedule); "ramp_share" (linear_ramp and
  doubling: the share of the budget's examples by which B_max is reached) or
  "ramp_examples"; "increment" (linear_ramp); "alpha" (seesaw, batch_for_decay).
  Defaults: linear_ramp starts at B_max/8 (at least B0) in increments of its
  start over the first 5% of the examples (GPT-3-style ramps take 2–5%);
  doubling starts at B0 and reaches B_max at 20%; seesaw and batch_for_decay
  start at B0 with α = 1/2 (Seesaw's; `plan` takes a step decay's own factor,
  `decay_rate`).

  Example:
    >>> resolve_options("linear_ramp", None, base_batch_size=32, max_batch_size=2048,
    ...                 budget_examples=240_000)
    {'start_batch': 256, 'increment': 256, 'ramp_examples': 12000}
  """
  check_choice("strategy", name, BATCH_SCHEDULES)
  given = dict(options or {})
  known = {"start_batch", "alpha"} | ({"increment"} if name == "linear_ramp" else set()) | (
      {"ramp_share", "ramp_examples"} if name in ("linear_ramp", "doubling") else set())
  unknown = sorted(set(given) - known)
  if unknown:
    raise ValueError(f"schedule_options: unknown option(s) {', '.join(map(repr, unknown))} "
                     f"for the {name!r} schedule; it takes {', '.join(sorted(known))}.")
  if name == "linear_ramp":
    start = given.get("start_batch", max(base_batch_size, max_batch_size // 8))
  else:
    start = given.get("start_batch", base_batch_size)
  resolved = {"start_batch": as_int("schedule_options.start_batch", start, low=1)}
  if name in ("seesaw", "batch_for_decay"):
    alpha = given.get("alpha", 0.5)
    _check_alpha(alpha)
    resolved["alpha"] = float(alpha)
    return resolved
  if "alpha" in given:
    raise ValueError(f"schedule_options.alpha is an option of 'seesaw' and 'batch_for_decay', "
                     f"not of {name!r}.")
  if name == "linear_ramp":
    resolved["increment"] = as_int("schedule_options.increment",
                                   given.get("increment", resolved["start_batch"]), low=1)
  if "ramp_examples" in given and "ramp_share" in given:
    raise ValueError("schedule_options: give ramp_share or ramp_examples, not both.")
  if "ramp_examples" in given:
    resolved["ramp_examples"] = as_int("schedule_options.ramp_examples",
                                       given["ramp_examples"], low=0)
  else:
    share = given.get("ramp_share", 0.05 if name == "linear_ramp" else 0.2)
    if isinstance(share, bool) or not isinstance(share, (int, float)):
      raise TypeError(f"schedule_options.ramp_share must be a number in [0, 1]; got {share!r}.")
    check_range("schedule_options.ramp_share", share, low=0.0, high=1.0)
    resolved["ramp_examples"] = int(round(share * budget_examples))
  if resolved["ramp_examples"] > budget_examples:
    raise ValueError(f"schedule_options.ramp_examples={resolved['ramp_examples']} is past the "
                     f"budget's {budget_examples} examples: the largest batch would never train.")
  return resolved


def schedule_of(name: str, options: Mapping[str, Any], *, base_batch_size: int,
                max_batch_size: int, base_schedule: optax.Schedule, base_steps: int,
                warmup_steps: int) -> BatchSchedule:
  """The `BatchSchedule` that `name` and its resolved `options` describe."""
  common = dict(base_batch_size=base_batch_size, max_batch_size=max_batch_size,
                start_batch=options["start_batch"])
  if name == "linear_ramp":
    return linear_ramp(**common, increment=options["increment"],
                       ramp_examples=options["ramp_examples"])
  if name == "doubling":
    return doubling(**common, ramp_examples=options["ramp_examples"])
  return seesaw(**common, alpha=options["alpha"], base_schedule=base_schedule,
                base_steps=base_steps, warmup_steps=warmup_steps,
                keep_lr=name == "batch_for_decay")
