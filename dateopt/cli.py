"""`dateopt-train --config configs/<name>.py --workdir <dir> [--config.batch_size=...]`.

Thin: parses flags, joins the hosts of a multi-host run, calls
`dateopt.train.train_and_evaluate`. A run that cannot start (a bad config
value, missing data, a busy or read-only workdir) ends with one line
`dateopt-train: error: ...` and status 2; a run stopped by SIGTERM or SIGINT
with one line saying where it was saved and status 143 or 130.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from dateopt import strict_json

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "A configs/*.py file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and the planned recipe go here.")
flags.DEFINE_string("coordinator_address", None,
                    "host:port of process 0 (multi-host without TPU/SLURM auto-detection).")
flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv=None):
  if argv is None:  # console-script entry point
    return app.run(main)
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO.
  from dateopt import train  # after flags: jax.distributed must start before devices are used.
  train.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  try:
    result = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except train.StartupError as error:
    return _fail(f"error: {error}", 2)
  except train.Preempted as stop:
    return _fail(str(stop), stop.exit_code)
  import jax
  if jax.process_index() == 0:
    summary = strict_json.sanitize({"eval": result.eval_metrics,
                            "steps_per_second": result.steps_per_second,
                            "batch_size": result.recipe.batch_size, "steps": result.steps,
                            "predicted_steps": result.predicted_steps})
    print("final:", json.dumps(summary, allow_nan=False))
    with open(os.path.join(FLAGS.workdir, "final_metrics.json"), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=2, allow_nan=False)


def _fail(message: str, status: int) -> int:
  """Prints `message` as one line on stderr (no traceback); the exit status."""
  print("dateopt-train: " + " ".join(message.split()), file=sys.stderr, flush=True)
  return status


if __name__ == "__main__":
  app.run(main)
