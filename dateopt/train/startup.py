"""Starting a run: the workdir is ours, its recipe matches, and every process agrees.

Before the first step, `train_and_evaluate` checks that the workdir can be
written, takes its lock (process 0), checks that a run already there was
planned with the same recipe and `config.RESUME_FIELDS` and that starting
over loses nothing it wrote, and writes `recipe.json` and `recipe.txt`. A
failure on any process stops every process with one `StartupError`.

Example:
  >>> lock = claim_workdir("/tmp/run", lead=True, exp=exp)   # StartupError if it cannot start
  >>> save_recipes("/tmp/run", exp, date.explain(exp.baseline, exp.recipe))
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from dateopt.date import _builder as builder_lib
from dateopt.train import config as config_lib
from dateopt.train import experiment, recipe_record, workdir_lock, workdirs
from dateopt.train.experiment import Experiment


class StartupError(Exception):
  """A run that cannot start, said in one line; `__cause__` keeps the original error.

  Raised for a bad config field, missing dataset files, a workdir that cannot
  be written or that another live run holds, and checkpoints none of which loads.
  """


@contextlib.contextmanager
def startup(*errors: type[Exception]):
  """Re-raises `errors` as a StartupError with the same message."""
  try:
    yield
  except errors as error:
    raise StartupError(str(error)) from error


def _lock_workdir(workdir: str, lead: bool) -> dict[str, Any] | None:
  """Checks that `workdir` can be written; process 0 also takes its lock."""
  try:
    workdir_lock.check_writable(workdir)
  except OSError as error:
    raise StartupError(f"cannot write in the workdir {workdir}: "
                       f"{error.strerror or error}.") from error
  if not lead:
    return None
  with startup(workdir_lock.WorkdirInUseError):
    return workdir_lock.acquire(workdir)


def claim_workdir(workdir: str, lead: bool, exp: Experiment) -> dict[str, Any] | None:
  """Claims `workdir` for `exp` on every process; all go on, or none does.

  Every process checks that it can write there; process 0 takes the lock and
  checks that a run already in the workdir was planned with this recipe and
  `config.RESUME_FIELDS`, and that starting over loses nothing it wrote.

  Returns:
    The lock (process 0) or None, for `workdir_lock.release`.

  Raises:
    StartupError: naming what stopped this process, or which process failed.
  """
  lock, failure = None, None
  try:
    lock = _lock_workdir(workdir, lead)
    if lead:  # after the lock: a live run's files are not ours to judge
      with startup(recipe_record.RecipeChangedError, recipe_record.WorkdirHoldsRunError):
        recipe_record.check_unchanged(workdir, exp.recipe,
                                     config_lib.resume_fields(exp.config))
        recipe_record.check_nothing_lost(
            workdir, starts_over=exp.config.checkpoint_every_steps < 0,
            overwrite=exp.config.overwrite)
  except StartupError as error:
    failure = error
  failed = failed_processes(failure is not None)
  if failure is not None:
    workdir_lock.release(lock)
    raise failure
  if failed:  # a process starting alone would wait for the others forever
    workdir_lock.release(lock)
    raise StartupError(f"process {failed[0]} could not start on the workdir {workdir} "
                       "(its log says why).")
  return lock


def failed_processes(failed_here: bool) -> list[int]:
  """The indices of the processes that failed; every process must call it."""
  if jax.process_count() == 1:
    return [0] if failed_here else []
  flags = multihost_utils.process_allgather(np.int32(failed_here))
  return [int(i) for i in np.flatnonzero(flags)]


def save_recipes(workdir: str, exp: Experiment, report: str) -> None:
  """Process 0 writes `recipe.json` (checked on a restart) and the `explain` report."""
  if jax.process_index() != 0:
    return
  root = workdirs.as_path(workdir)  # local or gs://
  root.mkdir(parents=True, exist_ok=True)
  # config.polish rides along for the record; only "planned" is checked on a restart.
  recipes = {"baseline": exp.baseline.to_dict(), "planned": exp.recipe.to_dict(),
             "run": config_lib.resume_fields(exp.config), "polish": dict(exp.polish),
             "engine": None}
  if exp.recipe.adaptive and not exp.recipe.scheduled:  # every knob of DATE's engine: a
    recipes["engine"] = builder_lib.adaptive_settings(  # replay re-runs it (engine_log)
        exp.recipe, batch_sizes=exp.batch_sizes, **experiment.engine_settings(exp.config))
  # A start killed mid-write must not leave half a file for the restart to judge.
  workdirs.write_atomically(root / recipe_record.RECIPE_FILE,
                            json.dumps(recipes, indent=2, default=str))
  workdirs.write_atomically(root / "recipe.txt", report + "\n")
