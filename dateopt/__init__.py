"""dateopt: large-batch training in JAX.

Layers (each imports only the ones above it):
  1. `dateopt.transforms`, `dateopt.masks`: optax gradient transformations
     (LARS, LAMB, trust ratios, parameter masks). No Flax.
  2. `dateopt.schedules`: learning-rate schedules and batch-size scaling rules.
  3. `dateopt.date`: DATE, the Dynamic Adaptive-Tuning Engine (plan, explain,
     build, and in-training statistics and guards).
  4. `dateopt.models`, `dateopt.data`: Flax reference models and input pipelines.
  5. `dateopt.train`: trainer, checkpoints, metrics, final polishing.
  6. `dateopt.cli`: the `dateopt-train` entry point.

`import dateopt` loads layers 1-3 only (jax + optax); models, data and training
are imported explicitly, e.g. `from dateopt import train`.
"""

from dateopt import masks
from dateopt import schedules
from dateopt.transforms import (
    LarsTrustRatioState,
    MomentumState,
    lamb,
    lars,
    scale_by_lamb_trust_ratio,
    scale_by_lars_trust_ratio,
    scale_by_momentum,
)

from dateopt import date  # noqa: E402  (layer 3 builds on the transforms above)

__version__ = "0.1.0"

__all__ = [
    "LarsTrustRatioState",
    "date",
    "MomentumState",
    "lamb",
    "lars",
    "masks",
    "scale_by_lamb_trust_ratio",
    "scale_by_lars_trust_ratio",
    "scale_by_momentum",
    "schedules",
]
