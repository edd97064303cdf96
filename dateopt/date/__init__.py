"""DATE, the Dynamic Adaptive-Tuning Engine: plan, explain, build, and watch.

Static planning turns one tuned small-batch `Recipe` into a large-batch one
(`plan`), says why (`explain`) and builds its optax optimizer (`build`). The
dynamic part is a set of optax wrappers a trainer plugs in: `track_statistics`
(gradient norm, trust ratios, update ratio, gradient noise scale) and
`divergence_guard` (skip bad steps, back the LR off, recover it).

Example:
  >>> from dateopt import date
  >>> base = date.Recipe(batch_size=1024, num_examples=1_281_167, num_epochs=90,
  ...                    learning_rate=2**2.5, optimizer="lars",
  ...                    warmup_epochs=0.3125, decay="polynomial", end_lr=1e-4)
  >>> big = date.plan(base, 16384)
  >>> tx, schedule = date.build(big)
  >>> tx = date.track_statistics(date.divergence_guard(tx))
"""

from dateopt.date.builder import build, build_schedule
from dateopt.date.guard import DivergenceGuardState, divergence_guard
from dateopt.date.planner import (
    DEFAULT_PROMOTE_ABOVE,
    DEFAULT_PROMOTION_ANCHORS,
    STRATEGIES,
    LargeBatchWarning,
    explain,
    plan,
)
from dateopt.date.recipe import OPTIMIZERS, Recipe
from dateopt.date.stats import (
    GradientSqNorms,
    NoiseScaleState,
    StatisticsState,
    TrainingStatistics,
    adascale_gain,
    compute_statistics,
    cross_replica_sq_norms,
    expected_efficiency,
    grouped_value_and_grad,
    init_noise_scale,
    noise_estimates,
    noise_scale,
    statistics,
    track_statistics,
    trust_ratio_summary,
    update_noise_scale,
)

__all__ = [
    "DEFAULT_PROMOTE_ABOVE",
    "DEFAULT_PROMOTION_ANCHORS",
    "DivergenceGuardState",
    "GradientSqNorms",
    "LargeBatchWarning",
    "NoiseScaleState",
    "OPTIMIZERS",
    "Recipe",
    "STRATEGIES",
    "StatisticsState",
    "TrainingStatistics",
    "adascale_gain",
    "build",
    "build_schedule",
    "compute_statistics",
    "cross_replica_sq_norms",
    "divergence_guard",
    "expected_efficiency",
    "explain",
    "grouped_value_and_grad",
    "init_noise_scale",
    "noise_estimates",
    "noise_scale",
    "plan",
    "statistics",
    "track_statistics",
    "trust_ratio_summary",
    "update_noise_scale",
]
