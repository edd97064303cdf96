"""DATE, the Dynamic Adaptive-Tuning Engine: plan, explain, build, and watch.

Planning turns one tuned small-batch `Recipe` into a large-batch one (`plan`),
says why (`explain`) and builds its optax optimizer (`build`). With
`strategy="adaptive"` the plan is dynamic: `adaptive` walks the baseline's
schedule at the pace the gradient noise scale measured each step allows
(AdaScale's gain), and stops when it has covered the baseline's steps. The
other optax wrappers a trainer plugs in: `measure_noise_scale` (the noise EMAs
alone), `track_statistics` (gradient norm, trust ratios, update ratio) and
`divergence_guard` (skip bad steps, back the LR off, recover it). The field's
fixed batch schedules (`plan(base, max_batch, "seesaw")`, `scheduled_batch`,
`dateopt.date.batch_schedules`) grow the batch with nothing measured. An
adaptive run that diverges is held and, if it stays diverged, given up:
`diverged(state)` and `gave_up(state)` say so. Every reader of the state takes
an optax state, or a Flax nnx `Optimizer` or its `opt_state` (`as_optax_state`).

Example:
  >>> from dateopt import date
  >>> base = date.Recipe(batch_size=1024, num_examples=1_281_167, num_epochs=90,
  ...                    learning_rate=2**2.5, optimizer="lars",
  ...                    warmup_epochs=0.3125, decay="polynomial", end_value=1e-4)
  >>> big = date.plan(base, 16384)
  >>> tx, schedule = date.build(big)
  >>> tx = date.track_statistics(date.divergence_guard(tx))
  >>> adaptive_tx, base_schedule = date.build(date.plan(base, 16384, "adaptive"))
"""

from dateopt.date.divergence import (
    DIVERGENCE_PATIENCE,
    DivergenceWatchState,
    as_optax_state,
    diverged,
    gave_up,
    has_learnt,
    may_grow_batch,
)
from dateopt.date.progress import (
    EARLY_RUNGS,
    GAIN_RISE,
    GAIN_SETTLE,
    GROWTH_INTERVAL,
    AdaptiveState,
    adaptive,
    batch_credit,
    batch_ladder,
    bounded_gain,
    bump_ceiling,
    credited_noise,
    next_batch_size,
    predicted_budget,
    progress_done,
    wants_next_rung,
)
from dateopt.date.batch_schedules import (
    BATCH_SCHEDULES,
    BatchSchedule,
    BatchScheduleState,
    doubling,
    linear_ramp,
    scheduled_batch,
    seesaw,
)
from dateopt.date.builder import (
    adam_preconditioner,
    batch_schedule_of,
    build,
    build_schedule,
    noise_leaf_scales,
    optimizer_factory,
)
from dateopt.date.guard import DEFAULT_MIN_MULTIPLIER, DivergenceGuardState, divergence_guard
from dateopt.date.noise import (
    SIGNAL_DECAY,
    GradientSqNorms,
    NoiseMeasurementState,
    NoiseScaleState,
    adascale_gain,
    combine_group_grads,
    cross_replica_sq_norms,
    clip_readings,
    expected_efficiency,
    law_steps,
    gain_from_estimates,
    grouped_value_and_grad,
    init_noise_scale,
    measure_noise_scale,
    no_measurement,
    noise_estimates,
    noise_scale,
    per_group_value_and_grad,
    predicted_steps,
    update_noise_scale,
)
from dateopt.date.planner import (
    DEFAULT_PROMOTE_ABOVE,
    DEFAULT_PROMOTION_ANCHORS,
    STRATEGIES,
    LargeBatchWarning,
    explain,
    plan,
    plan_predicted_budget,
    plan_predicted_steps,
)
from dateopt.date.recipe import (
    GAIN_RULES,
    NOISE_BATCH_EXPONENT,
    NOISE_OF,
    OPTIMIZERS,
    STEP_PRICE,
    Recipe,
)
from dateopt.date.stats import (
    StatisticsState,
    TrainingStatistics,
    compute_statistics,
    statistics,
    track_statistics,
    trust_ratio_summary,
)

__all__ = [
    "AdaptiveState",
    "BATCH_SCHEDULES",
    "BatchSchedule",
    "BatchScheduleState",
    "DEFAULT_MIN_MULTIPLIER",
    "DEFAULT_PROMOTE_ABOVE",
    "DEFAULT_PROMOTION_ANCHORS",
    "DIVERGENCE_PATIENCE",
    "DivergenceGuardState",
    "DivergenceWatchState",
    "EARLY_RUNGS",
    "GAIN_RISE",
    "GAIN_SETTLE",
    "GAIN_RULES",
    "GROWTH_INTERVAL",
    "GradientSqNorms",
    "LargeBatchWarning",
    "NOISE_BATCH_EXPONENT",
    "NOISE_OF",
    "NoiseMeasurementState",
    "NoiseScaleState",
    "OPTIMIZERS",
    "Recipe",
    "SIGNAL_DECAY",
    "STEP_PRICE",
    "STRATEGIES",
    "StatisticsState",
    "TrainingStatistics",
    "adascale_gain",
    "adam_preconditioner",
    "adaptive",
    "as_optax_state",
    "batch_credit",
    "batch_ladder",
    "batch_schedule_of",
    "bounded_gain",
    "bump_ceiling",
    "build",
    "build_schedule",
    "clip_readings",
    "combine_group_grads",
    "compute_statistics",
    "credited_noise",
    "cross_replica_sq_norms",
    "divergence_guard",
    "diverged",
    "doubling",
    "expected_efficiency",
    "law_steps",
    "linear_ramp",
    "explain",
    "gain_from_estimates",
    "gave_up",
    "grouped_value_and_grad",
    "has_learnt",
    "init_noise_scale",
    "may_grow_batch",
    "measure_noise_scale",
    "next_batch_size",
    "no_measurement",
    "noise_estimates",
    "noise_leaf_scales",
    "noise_scale",
    "optimizer_factory",
    "per_group_value_and_grad",
    "plan",
    "plan_predicted_budget",
    "plan_predicted_steps",
    "predicted_budget",
    "predicted_steps",
    "progress_done",
    "scheduled_batch",
    "seesaw",
    "statistics",
    "track_statistics",
    "trust_ratio_summary",
    "update_noise_scale",
    "wants_next_rung",
]
