"""`dateopt-train --config <name or file> --workdir <dir> [--config.batch_size=...]`.

Thin: parses flags, joins the hosts of a multi-host run (`--jax_distributed`),
calls `dateopt.train.train_and_evaluate`. A run that cannot start (a bad config
value or override, missing data, a busy or read-only workdir, a changed recipe
in a workdir that holds a run) ends with one line `dateopt-train: error: ...`
and status 2; a run stopped by SIGTERM or SIGINT with one line saying where it
was saved and status 143 or 130; a run stopped by non-finite steps with one
line naming the step and status 1; a write that fails mid-run (a full disk or
quota, or another I/O error) with one line naming the file and status 1.
"""

from __future__ import annotations

import errno
import json
import logging as logging_lib
import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from dateopt import configs, strict_json

FLAGS = flags.FLAGS
# Unlocked, and new keys accepted: the free-form sub-dicts (config.plan, config.guard_kwargs,
# ...) start empty, so `--config.plan.gain_rule=sqrt` adds a key. A misspelt key is refused
# by the trainer's config check instead, in one line naming it.
config_flags.DEFINE_config_file(
    "config", None,
    "A packaged config's name (mnist1d_lstm, study_mnist1d_resnet, imagenet_resnet50, ...) or "
    "a config file's path. Any field can be overridden: "
    "--config.batch_size=2048 (the target batch; None: the baseline's), "
    "--config.strategy=adaptive (legw, linear, sqrt, none, adaptive; the field's batch "
    "schedules linear_ramp, doubling, seesaw, batch_for_decay with --config.plan.budget=2), "
    "--config.plan.grow_batch=True (adaptive: grow the batch up to batch_size), "
    "--config.num_train_steps=N (-1: the recipe's length), --config.seed=N, "
    "--config.checkpoint_every_steps=N (-1: never), --config.eval_every_steps=N, "
    "--config.data_dir=/path, --config.baseline.learning_rate=x (the tuned recipe).",
    lock_config=False, accept_new_attributes=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and the planned recipe go here: "
                    "a local path or gs://bucket/run (needs the dateopt[gcp] extra).")
flags.DEFINE_enum("jax_distributed", "auto", ["auto", "on", "off"],
                  "Start jax.distributed: auto when JAX detects a cluster (Cloud TPU VM, GKE, "
                  "SLURM, Open MPI, Kubernetes) or the flags below are given; on: always; "
                  "off: never.")
flags.DEFINE_string("coordinator_address", None,
                    "host:port of process 0 (multi-host without TPU/SLURM auto-detection).")
flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")
flags.mark_flags_as_required(["config", "workdir"])
_OWN_FLAGS = ("config", "workdir", "jax_distributed", "coordinator_address", "num_processes",
              "process_id")


def main(argv=None):
  if argv is None:  # console-script entry point
    return app.run(main, flags_parser=parse_flags)
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO.
  from dateopt import train  # after flags: jax.distributed must start before devices are used.
  try:
    train.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                 FLAGS.process_id, mode=FLAGS.jax_distributed)
  except (ValueError, RuntimeError) as error:  # off with a coordinator; detection or start failed
    return _fail(f"error: {error}", 2)
  with _FailedWriteNoise():  # to the end: a failed save's threads may report it until then
    return _train_and_report(train)


def _train_and_report(train) -> int | None:
  """Runs `train.train_and_evaluate` on the flags; the exit status of a run that stopped."""
  from dateopt.data import errors as data_errors
  try:
    _report(train.train_and_evaluate(FLAGS.config, FLAGS.workdir))
  except train.StartupError as error:
    return _fail(f"error: {error}", 2)
  except train.Preempted as stop:
    if stop.step is None:  # nothing to save: end now, not after XLA work still in flight
      _fail(str(stop), stop.exit_code)
      sys.stdout.flush()
      os._exit(stop.exit_code)
    return _fail(str(stop), stop.exit_code)
  except (train.NonFiniteError, train.DivergedError) as stop:  # a NaN batch, or divergence
    return _fail(str(stop), stop.exit_code)
  except (data_errors.UndecodableRecordError, data_errors.WorkerDiedError) as stop:
    return _fail(str(stop), stop.exit_code)  # a record that does not decode; a dead worker
  except (OSError, ValueError, RuntimeError) as error:  # a failed write mid-run, or a bug
    message = _failed_write_message(error, FLAGS.workdir)
    if message is None:
      raise
    _fail(message, 1)
    sys.stdout.flush()
    os._exit(1)  # orbax's threads and coroutines of the failed save would print at exit


def _report(result) -> None:
  """Prints the run's summary and writes it to `final_metrics.json` (process 0)."""
  import jax
  if jax.process_index() == 0:
    summary = strict_json.sanitize({"eval": result.eval_metrics,
                            "steps_per_second": result.steps_per_second,
                            "batch_size": result.recipe.batch_size, "steps": result.steps,
                            "predicted_steps": result.predicted_steps,
                            "examples": result.examples,
                            **({} if result.tokens is None else {
                                "tokens": result.tokens,
                                "tokens_per_second": _tokens_per_second(result)})})
    print("final:", json.dumps(summary, allow_nan=False))
    from dateopt.train import workdirs
    final = workdirs.as_path(FLAGS.workdir) / "final_metrics.json"  # local or gs://
    final.write_text(json.dumps(summary, indent=2, allow_nan=False), encoding="utf-8")


def _tokens_per_second(result) -> float | None:
  """The run's tokens over its train time (its steps / steps_per_second); None where the run
  was too short to time."""
  if result.steps_per_second is None or not result.steps:
    return None
  return result.tokens * result.steps_per_second / result.steps


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad flag, override or config file as one line and status 2.

  absl would print "FATAL Flags parsing error" and a usage hint, with status 1;
  ml_collections raises its own errors from inside the parse (an override
  `--config..batch_size=5` that is no field path, a config file that fails).
  """
  for name in _OWN_FLAGS:  # --help lists the key flags of the module named by argv[0]
    FLAGS.register_key_flag_for_module(argv[0], FLAGS[name])
  try:
    return FLAGS(_with_config_resolved(argv))
  except SystemExit:
    if _HELP_FLAGS & set(argv[1:]):  # absl exits 1 after printing the help asked for
      sys.exit(0)
    raise
  except flags.Error as error:
    sys.exit(_fail(f"error: {error}", 2))
  except Exception as error:  # pylint: disable=broad-except  # all of it is the user's input
    sys.exit(_fail(f"error: {type(error).__name__}: {error}", 2))


_HELP_FLAGS = {"--help", "-help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml"}


def _with_config_resolved(argv: list[str]) -> list[str]:
  """`argv` with the value of `--config` a file: a packaged config's name becomes its path
  (`--config mnist1d_lstm` works from any directory).

  Raises:
    FileNotFoundError: the value is neither a file nor a packaged config's name.
  """
  resolved = list(argv)
  for i, arg in enumerate(resolved):
    if arg in ("--config", "-config") and i + 1 < len(resolved):
      resolved[i + 1] = configs.resolve(resolved[i + 1])
    elif arg.startswith(("--config=", "-config=")):
      flag, value = arg.split("=", 1)
      resolved[i] = f"{flag}={configs.resolve(value)}"
  return resolved


# The errors of a full disk or quota: they alone are answered with "Free space".
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# tensorstore (orbax's array writes) raises a failed write as ValueError("RESOURCE_EXHAUSTED:
# Failed writing: \"<file>\": ... No space left on device [os_error_code='28']").
_OS_ERROR_CODE = re.compile(r"\[os_error_code='(\d+)'\]")
_QUOTED_PATH = re.compile(r'"((?:/|gs://)[^"]+)"')


def _failed_write(error: BaseException | None) -> tuple[int | None, str, str | None] | None:
  """(errno, what failed, the file) when `error` is a failed I/O, else None."""
  if isinstance(error, OSError):
    return error.errno, error.strerror or str(error), error.filename
  if isinstance(error, (ValueError, RuntimeError)):
    text = str(error)
    code = _OS_ERROR_CODE.search(text)
    if code or ("RESOURCE_EXHAUSTED" in text and any(os.strerror(c) in text for c in _NO_SPACE)):
      number = int(code.group(1)) if code else errno.ENOSPC
      path = _QUOTED_PATH.search(text)
      return number, os.strerror(number), path.group(1) if path else None
  return None


def _failure_of(error: BaseException | None) -> tuple[int | None, str, str | None] | None:
  """`_failed_write` of `error`, or of the error it was raised from (`raise ... from`)."""
  while error is not None:
    failure = _failed_write(error)
    if failure is not None:
      return failure
    error = error.__cause__
  return None


def _failed_write_message(error: BaseException, workdir: str) -> str | None:
  """The one line for a run stopped by a failed write, or None for any other error.

  The write that failed first is named: a failed save can make the cleanup's
  writes fail too (each raised while handling the one before).
  """
  failure, earlier = _failure_of(error), error
  if failure is None:
    return None
  while not earlier.__suppress_context__ and earlier.__context__ is not None:
    earlier = earlier.__context__
    failure = _failure_of(earlier) or failure
  number, what, filename = failure
  if _in_checkpoint_save(error) and not what.startswith("a checkpoint save"):
    from dateopt.train import workdirs
    what = f"a checkpoint save in {workdirs.as_path(workdir) / 'checkpoints'} failed: {what}"
  no_space = number in _NO_SPACE
  return (f"stopped: {what}" + (f": {filename}" if filename else "")
          + "; the checkpoints saved before it are kept. "
          + ("Free space" if no_space else "Fix what stopped it")
          + ", then rerun the same command to resume.")


def _in_checkpoint_save(error: BaseException) -> bool:
  """Whether `error`, or one it was raised from or while handling, came from a checkpoint
  save (orbax names no file for some of its writes)."""
  from dateopt.train import checkpoint
  seen = []
  while error is not None and all(error is not e for e in seen):
    seen.append(error)
    failure = _failed_write(error)
    if failure and failure[2] and checkpoint.UNFINISHED_MARK in failure[2]:
      return True
    trace = error.__traceback__
    while trace is not None:
      if trace.tb_frame.f_code.co_filename == checkpoint.__file__:
        return True
      trace = trace.tb_next
    error = error.__cause__ or error.__context__
  return False


class _FailedWriteNoise(logging_lib.Filter):
  """While the run trains: drops orbax's and asyncio's reports of a failed write.

  Each thread of a failed save logs it with its traceback (hundreds of lines),
  and tensorstore's callbacks that land after orbax closed their event loop
  print "Event loop is closed" through `sys.unraisablehook`. The CLI says the
  failure once, in one line (`_failed_write_message`).
  """

  _LOGGERS = ("absl", "asyncio")

  def __enter__(self):
    self._previous = sys.unraisablehook
    sys.unraisablehook = self._hook
    for name in self._LOGGERS:
      logging_lib.getLogger(name).addFilter(self)
    return self

  def __exit__(self, *exc_info):
    if sys.unraisablehook == self._hook:  # leave a hook installed after ours alone
      sys.unraisablehook = self._previous
    for name in self._LOGGERS:
      logging_lib.getLogger(name).removeFilter(self)

  def filter(self, record: logging_lib.LogRecord) -> bool:
    from_orbax = f"{os.sep}orbax{os.sep}" in (record.pathname or "")
    if not (from_orbax or record.name == "asyncio"):
      return True
    error = record.exc_info[1] if record.exc_info else None
    return _failure_of(error or ValueError(record.getMessage())) is None

  def _hook(self, unraisable) -> None:
    error, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
      return
    if (code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
        and _failure_of(error) is not None):
      return
    self._previous(unraisable)


def _fail(message: str, status: int) -> int:
  """Prints `message` as one line on stderr (no traceback); the exit status."""
  print("dateopt-train: " + " ".join(message.split()), file=sys.stderr, flush=True)
  return status


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
