"""DATE, the Dynamic Adaptive-Tuning Engine: plan, explain, build, and watch.

Planning turns one tuned small-batch `Recipe` into a large-batch one (`plan`),
says why (`explain`) and builds its optax optimizer (`build`). With
`strategy="adaptive"` the plan is dynamic: `adaptive` walks the baseline's
schedule at the pace the gradient noise scale measured each step allows
(AdaScale's gain), and stops when it has covered the baseline's steps. The
other optax wrappers a trainer plugs in: `measure_noise_scale` (the noise EMAs
alone), `track_statistics` (gradient norm, trust ratios, update ratio) and
`divergence_guard` (skip bad steps, back the LR off, recover it). The field's
fixed batch schedules (`plan(base, max_batch, "seesaw")`, `scheduled_batch`)
grow the batch with nothing measured. An adaptive run that diverges is held
and, if it stays diverged, given up: `diverged(state)` and `gave_up(state)` say
so. Every reader of the state takes an optax state, or a Flax nnx `Optimizer` or
its `opt_state` (`as_optax_state`).

Example:
  >>> from dateopt import date
  >>> base = date.Recipe(batch_size=1024, num_examples=1_281_167, num_epochs=90,
  ...                    learning_rate=2**2.5, optimizer="lars",
  ...                    warmup_epochs=0.3125, decay="polynomial", end_value=1e-4)
  >>> big = date.plan(base, 16384)
  >>> tx, schedule = date.build(big)
  >>> tx = date.track_statistics(date.divergence_guard(tx))
  >>> adaptive_tx, base_schedule = date.build(date.plan(base, 16384, "adaptive"))
  >>> grown = date.plan(base, 16384, "adaptive", grow_batch=True,
  ...                   engine=date.EngineConfig(step_price=2.0))  # the engine's knobs

The engine's modules (`_progress`, `_noise`, `_divergence`, ...) are private, as
optax's `_src` is: what this package exports is the API, and the rest may change.
"""

from dateopt.date._batch_schedules import BatchSchedule, scheduled_batch
from dateopt.date._builder import batch_schedule_of, build, build_schedule, noise_leaf_scales
from dateopt.date._divergence import as_optax_state, diverged, gave_up
from dateopt.date._engine_config import EngineConfig
from dateopt.date._guard import divergence_guard
from dateopt.date._noise import (
    GradientSqNorms,
    cross_replica_sq_norms,
    grouped_value_and_grad,
    measure_noise_scale,
    no_measurement,
    per_group_value_and_grad,
)
from dateopt.date._planner import LargeBatchWarning, explain, plan
from dateopt.date._progress import (
    AdaptiveState,
    adaptive,
    batch_ladder,
    next_batch_size,
    predicted_budget,
    progress_done,
    replay,
)
from dateopt.date._recipe import Recipe
from dateopt.date._stats import statistics, track_statistics

__all__ = [
    "AdaptiveState",
    "BatchSchedule",
    "EngineConfig",
    "GradientSqNorms",
    "LargeBatchWarning",
    "Recipe",
    "adaptive",
    "as_optax_state",
    "batch_ladder",
    "batch_schedule_of",
    "build",
    "build_schedule",
    "cross_replica_sq_norms",
    "divergence_guard",
    "diverged",
    "explain",
    "gave_up",
    "grouped_value_and_grad",
    "measure_noise_scale",
    "next_batch_size",
    "no_measurement",
    "noise_leaf_scales",
    "per_group_value_and_grad",
    "plan",
    "predicted_budget",
    "progress_done",
    "replay",
    "scheduled_batch",
    "statistics",
    "track_statistics",
]
