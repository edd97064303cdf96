"""Training: DATE-planned data-parallel training, checkpoints, metrics, polishing.

Example:
  >>> from dateopt import train
  >>> result = train.train_and_evaluate(train.default_config(), "/tmp/run")
"""

from dateopt import extras

# Before the imports that need them: a missing extra is one line naming it.
extras.require_extra("dateopt.train", extra="train", modules=extras.TRAIN_MODULES)

# ruff: noqa: E402
from dateopt.train.config import default_config
from dateopt.train.diverged import DivergedError
from dateopt.train.engine_log import ReplayReport, replay_run
from dateopt.train.metrics import JsonlWriter, MetricWriter, TensorBoardWriter, Writer, read_metrics
from dateopt.train.nonfinite import NonFiniteError
from dateopt.train.parallel import initialize_distributed, make_mesh
from dateopt.train.polish import polish_batch_stats
from dateopt.train.preemption import Preempted
from dateopt.train.steps import (
    TrainState,
    create_train_state,
    cross_entropy,
    eval_step,
    train_step,
)
from dateopt.train.evaluation import evaluate, make_eval_fn
from dateopt.train.experiment import Experiment, build_experiment, build_optimizer, plan_recipe
from dateopt.train.startup import StartupError
from dateopt.train.trainer import TrainResult, train_and_evaluate

__all__ = [
    "Experiment",
    "JsonlWriter",
    "MetricWriter",
    "NonFiniteError",
    "DivergedError",
    "Preempted",
    "ReplayReport",
    "StartupError",
    "TensorBoardWriter",
    "TrainResult",
    "TrainState",
    "Writer",
    "build_experiment",
    "build_optimizer",
    "create_train_state",
    "cross_entropy",
    "default_config",
    "eval_step",
    "evaluate",
    "initialize_distributed",
    "make_eval_fn",
    "make_mesh",
    "plan_recipe",
    "polish_batch_stats",
    "read_metrics",
    "replay_run",
    "train_and_evaluate",
    "train_step",
]
