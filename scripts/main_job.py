"""The README's main job: train the tuned baseline, then DATE's large-batch plan, compare.

Runs the config twice from scratch: once at the baseline's batch size, once at
the config's target batch (planned by DATE, no re-tuning), and prints the final
eval accuracy of both with their wall-clock times.

  python scripts/main_job.py --config configs/mnist1d_lstm.py --workdir runs/mnist1d_lstm
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import time

from absl import logging


def load_config(path: str):
  spec = importlib.util.spec_from_file_location("job_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def run(config, workdir: str):
  from dateopt import train
  shutil.rmtree(workdir, ignore_errors=True)  # a fresh run each time, not a resume
  start = time.perf_counter()
  result = train.train_and_evaluate(config, workdir)
  return result, time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/mnist1d_lstm.py")
  parser.add_argument("--workdir", default="runs/mnist1d_lstm")
  parser.add_argument("--num-epochs", type=int, default=None,
                      help="override the baseline's epochs (both runs keep the same epochs)")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)

  planned_config = load_config(args.config)
  planned_config.progress_bar = not args.no_progress
  baseline_config = load_config(args.config)
  baseline_config.progress_bar = not args.no_progress
  baseline_config.batch_size = None  # the tuned baseline as it is
  if args.num_epochs is not None:
    for config in (planned_config, baseline_config):
      config.baseline.num_epochs = args.num_epochs  # ConfigDict keeps the int type: pass an int

  base, base_seconds = run(baseline_config, os.path.join(args.workdir, "baseline"))
  big, big_seconds = run(planned_config, os.path.join(args.workdir, "planned"))
  k = big.recipe.batch_size // base.recipe.batch_size
  print("\n| run | batch | optimizer | peak LR | warmup epochs | steps | eval accuracy | wall s |")
  print("|---|---:|---|---:|---:|---:|---:|---:|")
  for name, r, seconds in (("baseline", base, base_seconds), (f"DATE {k}x", big, big_seconds)):
    print(f"| {name} | {r.recipe.batch_size} | {r.recipe.optimizer} | {r.recipe.learning_rate:.4g} "
          f"| {r.recipe.warmup_epochs:g} | {r.recipe.total_steps} "
          f"| {100 * r.eval_metrics['accuracy']:.2f}% | {seconds:.0f} |")


if __name__ == "__main__":
  main()
