"""The recipe a workdir's run was planned with (`recipe.json`), and the check that a
restarted run still plans it.

A restart resumes from the workdir's checkpoints. If the config meanwhile plans
another recipe (a new batch size, learning rate, number of epochs), the
resumed run would mix two recipes: an optimizer state and data position from
one, a schedule from the other (a shorter schedule trains on at LR 0). So the
restart is refused before anything is built, naming each changed field. To go
on from these checkpoints under the new recipe on purpose, delete
`recipe.json`: the next start writes the new one.

Example:
  >>> check_unchanged("/tmp/run", recipe, {"seed": 0})  # RecipeChangedError if it differs
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from etils import epath

from dateopt import date
from dateopt.train import metrics, workdirs

RECIPE_FILE = "recipe.json"
# Not part of what is trained: `plan`'s explanation of each value.
_IGNORED_FIELDS = frozenset({"rationale"})
# Engine knobs added since runs were recorded, with the value those runs trained with. A
# stored recipe that lacks one, and whose run uses it, ran with that value: a resume under a
# newer default would change the run halfway (a grown run's credit,
# `dateopt.date._progress.credited_noise`). Recipes recorded before `Recipe.engine` held the
# knobs `step_price` and `noise_batch_exponent` as fields of their own.
VALUE_BEFORE_THE_FIELD = {"noise_batch_exponent": 0.0}
# The same for the run fields (`config.RESUME_FIELDS`): before `engine_rules_off` every rule
# was on; before `divergence_watch` a run was watched unless its `divergence_patience` was 0.
RUN_VALUE_BEFORE_THE_FIELD = {"engine_rules_off": "", "divergence_watch": True}


class RecipeChangedError(ValueError):
  """The config plans another recipe than the one the workdir's run was trained with."""


class WorkdirHoldsRunError(ValueError):
  """A run that would start over in a workdir whose earlier run it would overwrite."""


def as_stored(recipe: date.Recipe) -> dict[str, Any]:
  """`recipe` as `recipe.json` holds it (the trainer writes it with `default=str`)."""
  return _as_json(recipe.to_dict())


def recipe_changes(stored: Mapping[str, Any], planned: Mapping[str, Any]) -> list[str]:
  """"field: old → new" for every field whose value differs.

  A field the stored recipe lacks is skipped: it was written before the field
  existed, and its old value cannot be known.

  Example:
    >>> recipe_changes({"batch_size": 64, "num_epochs": 2}, {"batch_size": 32, "num_epochs": 2})
    ['batch_size: 64 → 32']
  """
  return [f"{name}: {_show(stored[name])} → {_show(planned[name])}"
          for name in planned
          if name in stored and name not in _IGNORED_FIELDS and stored[name] != planned[name]]


def _show(value: Any) -> str:
  return f"{value:.6g}" if isinstance(value, float) else json.dumps(value)


def _stored_record(path: epath.Path) -> dict[str, Any]:
  """What `path` holds ({"planned": ..., "run": ...}), or {"error": why} when it cannot
  be read. The trainer writes it atomically, so a half-written file is damage."""
  try:
    stored = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError) as error:
    return {"error": f"it cannot be read: {error}"}
  return stored if isinstance(stored, dict) else {"error": "it holds no JSON object"}


def _stored_run(record: Mapping[str, Any]) -> dict[str, Any]:
  """The run fields `record` holds (a file from before they were recorded has the seed), a
  field it lacks or holds as null at its `RUN_VALUE_BEFORE_THE_FIELD`."""
  run = record.get("run")
  if not isinstance(run, dict):
    run = {"seed": record["seed"]} if "seed" in record else {}
  if "divergence_watch" not in run and "divergence_patience" in run:
    run = dict(run, divergence_watch=bool(run["divergence_patience"]))
  recorded = {name: value for name, value in run.items()
              if value is not None or name not in RUN_VALUE_BEFORE_THE_FIELD}
  return {**RUN_VALUE_BEFORE_THE_FIELD, **recorded}


def _as_json(value: Any) -> Any:
  """`value` as `recipe.json` gives it back (tuples as lists, numbers as JSON has them)."""
  return json.loads(json.dumps(value, default=str))


def _has_checkpoint(workdir: str) -> bool:
  """Whether `workdir/checkpoints` holds a step (a damaged one counts: it is still a run)."""
  directory = workdirs.as_path(workdir) / "checkpoints"
  return directory.exists() and any(p.name.split(".")[0].isdigit() for p in directory.iterdir())


def check_unchanged(workdir: str, recipe: date.Recipe,
                    run_fields: Mapping[str, Any] | None = None) -> None:
  """Raises RecipeChangedError when `workdir` holds a run planned with another recipe, or
  with other `run_fields` (the config fields besides the recipe that a resume must keep:
  `config.RESUME_FIELDS`, named `config.<field>` in the message).

  A workdir without a checkpoint to resume from (a run that stopped before its
  first save), or without `recipe.json` (deleted to go on under a new recipe
  on purpose), passes. Otherwise the check fails closed: an unreadable
  `recipe.json` is refused, since the run could not be checked.

  Raises:
    RecipeChangedError: naming each changed field (old → new), the file, and
      what to do: another workdir, the old config, or deleting the file.
  """
  path = workdirs.as_path(workdir) / RECIPE_FILE
  if not path.exists() or not _has_checkpoint(workdir):
    return
  record = _stored_record(path)
  stored = record.get("planned")
  if not isinstance(stored, dict):
    raise RecipeChangedError(
        f"the workdir {workdir} holds checkpoints, but {os.fspath(path)} does not say which "
        f"recipe they were trained with ({record.get('error', 'it holds no planned recipe')}), so "
        f"this run cannot be checked against them. Use a new --workdir, or restore the file "
        f"(to go on from these checkpoints under this config anyway, delete {RECIPE_FILE}).")
  changes = recipe_changes(_with_values_before_the_fields(stored, recipe), as_stored(recipe))
  changes += [f"config.{change}" for change in recipe_changes(_stored_run(record),
                                                                _as_json(run_fields or {}))]
  if changes:
    raise RecipeChangedError(
        f"the workdir {workdir} holds a run planned with another recipe "
        f"({os.fspath(path)}); this config changes {'; '.join(changes)}. Use a new --workdir "
        f"for the new recipe, or the old config to resume this run (to go on from its "
        f"checkpoints under the new recipe anyway, delete {RECIPE_FILE} first).")


def stored_recipe(planned: Mapping[str, Any]) -> date.Recipe:
  """The recipe a `recipe.json`'s "planned" entry trained with: a field it lacks takes its
  `VALUE_BEFORE_THE_FIELD`, not today's default.

  Example:
    >>> stored_recipe({"batch_size": 64, "num_examples": 640, "num_epochs": 1,
    ...                "learning_rate": 0.1}).engine["noise_batch_exponent"]
    0.0
  """
  return date.Recipe.from_dict({**_knobs_before_the_engine(planned, grows=True), **planned})


def _knobs_before_the_engine(stored: Mapping[str, Any], *, grows: bool) -> dict[str, Any]:
  """The `VALUE_BEFORE_THE_FIELD` of each engine knob a record without `engine` lacks (only
  where the run `grows` its batch, the knobs' only reader then)."""
  if "engine" in stored or not grows:
    return {}
  return {name: value for name, value in VALUE_BEFORE_THE_FIELD.items() if name not in stored}


def _with_values_before_the_fields(stored: Mapping[str, Any], recipe: date.Recipe
                                   ) -> dict[str, Any]:
  """`stored` as `recipe.json` holds it today: the knobs of a record without `engine` in it
  (each it lacks at its `VALUE_BEFORE_THE_FIELD`), the rest of the record as it is."""
  if "engine" in stored or not recipe.adaptive:
    return dict(stored)
  if recipe.grow_batch:  # the knobs it had: its own fields, else their values before them
    old = {**_knobs_before_the_engine(stored, grows=True),
           **{name: stored[name] for name in _OLD_KNOBS if name in stored}}
  else:  # a fixed batch reads neither
    old = {name: recipe.engine[name] for name in _OLD_KNOBS}
  # Every other knob had today's default: the engine's constants were those values.
  knobs = {**date.EngineConfig().to_dict(), **old}
  rest = {name: value for name, value in stored.items() if name not in _OLD_KNOBS}
  return {**rest, "engine": _as_json(knobs)}


_OLD_KNOBS = ("step_price", "noise_batch_exponent")  # `Recipe` fields before `engine`


def check_nothing_lost(workdir: str, *, starts_over: bool, overwrite: bool = False) -> None:
  """Raises WorkdirHoldsRunError when a new start would overwrite an earlier run's record.

  A run that `starts_over` (checkpointing off: it resumes from nothing) in a
  workdir whose `metrics.jsonl` has rows, or any run in a workdir whose run
  finished (`final_metrics.json`) and left no checkpoint to resume from,
  would truncate those metrics and replace the final ones. A resume from the
  workdir's checkpoints is exact, and passes. `overwrite=True` allows it.

  Example:
    >>> check_nothing_lost("/tmp/run", starts_over=True)   # WorkdirHoldsRunError if it logged
  """
  if overwrite:
    return
  root = workdirs.as_path(workdir)
  last = metrics.last_logged_step(workdir)
  finished = (root / "final_metrics.json").exists()
  if not (starts_over and last) and not (finished and not _has_checkpoint(workdir)):
    return
  why = ("config.checkpoint_every_steps=-1: it resumes from no checkpoint" if starts_over
         else "its checkpoints are gone")
  held = f"metrics up to step {last}" if last else "its final metrics"
  raise WorkdirHoldsRunError(
      f"the workdir {workdir} holds an earlier run ({held}), and this run would start over "
      f"at step 0 ({why}), replacing them. Use a new --workdir, or --config.overwrite=True "
      f"to replace that run.")
