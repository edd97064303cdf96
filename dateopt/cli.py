"""`dateopt-train --config <name or file> --workdir <dir> [--config.batch_size=...]`.

Thin: parses flags, joins the hosts of a multi-host run (`--jax_distributed`),
calls `dateopt.train.train_and_evaluate`. A run that cannot start (a bad config
value or override, missing data, a busy or read-only workdir, a changed recipe
in a workdir that holds a run) ends with one line `dateopt-train: error: ...`
and status 2; a run stopped by SIGTERM or SIGINT with one line saying where it
was saved and status 143 or 130; a run stopped by non-finite steps with one
line naming the step and status 1.
"""

from __future__ import annotations

import json
import os
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
    "--config.strategy=adaptive (legw, linear, sqrt, none, adaptive), "
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
  try:
    result = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
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
  except OSError as error:  # a full disk or quota mid-run: the saves so far are kept
    return _fail(f"stopped: {error.strerror or error}"
                 + (f": {error.filename}" if error.filename else "")
                 + "; the checkpoints saved before it are kept. Free space, then rerun the "
                 "same command to resume.", 1)
  import jax
  if jax.process_index() == 0:
    summary = strict_json.sanitize({"eval": result.eval_metrics,
                            "steps_per_second": result.steps_per_second,
                            "batch_size": result.recipe.batch_size, "steps": result.steps,
                            "predicted_steps": result.predicted_steps,
                            "examples": result.examples,
                            **({} if result.tokens is None else {"tokens": result.tokens})})
    print("final:", json.dumps(summary, allow_nan=False))
    from dateopt.train import workdirs
    final = workdirs.as_path(FLAGS.workdir) / "final_metrics.json"  # local or gs://
    final.write_text(json.dumps(summary, indent=2, allow_nan=False), encoding="utf-8")


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


def _fail(message: str, status: int) -> int:
  """Prints `message` as one line on stderr (no traceback); the exit status."""
  print("dateopt-train: " + " ".join(message.split()), file=sys.stderr, flush=True)
  return status


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
