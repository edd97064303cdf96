"""Checks the divergence guard on the main job: hands off a healthy baseline, rescues 10x LR.

Trains the baseline of `configs/mnist1d_lstm.py` (batch 32, Adam 2e-3, 0.25
warmup epochs, cosine to 0, 30 epochs = 7,500 steps) from scratch with the
guard on and with it off, and reports the guard's skipped steps and final LR
multiplier, whether the final parameters are bit-identical, and both eval
accuracies. Then trains it at 10x the learning rate, with the guard and
without, and reports whether the run ends finite and its accuracy.

  python research/guard_check.py                 # the full 7,500 steps per run
  python research/guard_check.py --steps 500     # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import time

import jax
import numpy as np
from absl import logging

from dateopt import configs


def guard_state(opt_state):
  """The divergence guard's state inside `opt_state`, or None without a guard."""
  from dateopt.date import _guard as guard_lib
  is_guard = lambda x: isinstance(x, guard_lib.DivergenceGuardState)
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=is_guard) if is_guard(s)]
  return found[0] if found else None


def train(args, workdir: str, *, guard: bool, lr_factor: float = 1.0):
  """One run of the baseline from scratch; returns (TrainResult, seconds)."""
  from dateopt import train as train_lib
  config = configs.load(args.config)
  config.batch_size = None  # the tuned baseline as it is
  config.progress_bar = False
  config.guard = guard
  config.checkpoint_every_steps = -1  # a fresh run each time, nothing to resume
  if lr_factor != 1.0:
    config.baseline.learning_rate = config.baseline.learning_rate * lr_factor
  if args.steps is not None:
    config.num_train_steps = args.steps
  shutil.rmtree(workdir, ignore_errors=True)
  start = time.perf_counter()
  with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints the (same) plan each run
    result = train_lib.train_and_evaluate(config, workdir)
  return result, time.perf_counter() - start


def describe(name: str, result, seconds: float) -> str:
  guard = guard_state(result.state.opt_state)
  leaves = jax.tree.leaves(result.state.params)
  finite = all(np.all(np.isfinite(x)) for x in leaves)
  if guard is None:
    counters = "| - | - | - | - "
  else:
    counters = (f"| {int(guard.num_skipped)} | {int(guard.num_nonfinite)} | "
                f"{int(guard.num_spikes)} | {float(guard.lr_multiplier):.4g} ")
  return (f"| {name} | {int(result.state.step)} {counters}| {finite} | "
          f"{result.eval_metrics['accuracy']:.4f} | {result.eval_metrics['loss']:.4f} | "
          f"{seconds:.0f} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/mnist1d_lstm.py")
  parser.add_argument("--workdir", default="runs/guard_check")
  parser.add_argument("--steps", type=int, default=None,
                      help="train this many steps instead of the recipe's 7,500 "
                           "(the LR schedule keeps its full length)")
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)

  runs = {}
  for name, guard, factor in (("baseline, guard on", True, 1.0),
                              ("baseline, guard off", False, 1.0),
                              ("10x LR, guard on", True, 10.0),
                              ("10x LR, guard off", False, 10.0)):
    workdir = os.path.join(args.workdir, name.replace(", ", "_").replace(" ", "_"))
    runs[name] = train(args, workdir, guard=guard, lr_factor=factor)
    print(f"done: {name}", flush=True)

  on = runs["baseline, guard on"][0]
  print(f"\nmain job baseline: {on.recipe.batch_size} batch, {on.recipe.optimizer} "
        f"{on.recipe.learning_rate:g}, {int(on.state.step)} steps")
  print("| run | steps | skipped | non-finite | spikes | LR multiplier | params finite "
        "| eval accuracy | eval loss | wall s |")
  print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
  for name, (result, seconds) in runs.items():
    print(describe(name, result, seconds))
  print()
  for name in ("baseline", "10x LR"):
    on, off = runs[f"{name}, guard on"][0], runs[f"{name}, guard off"][0]
    identical = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(on.state.params),
                                                         jax.tree.leaves(off.state.params)))
    print(f"{name}: final params bit-identical with the guard on and off: {identical}")


if __name__ == "__main__":
  main()
