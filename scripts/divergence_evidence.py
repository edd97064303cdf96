"""DATE's divergence watch on the runs that diverged, and on healthy ones: one JSON line a run.

The evidence behind notes/divergence.md ("Evidence"):

  python scripts/divergence_evidence.py diverged --workdir runs/divergence
  python scripts/divergence_evidence.py healthy --workdir runs/divergence
  python scripts/divergence_evidence.py baselines --workdir runs/divergence

"diverged": the main job's LSTM with 3000x, 1000x, 100x and 10x its tuned LR, and with
1/10,000 of it (a run that does not learn: its loss stays at chance); the
scaling study's first-pass LSTM recipe (LR 4e-3, no clipping) at 4x seed 1
and 32x seeds 1 and 2; the main job's LSTM with its gradient multiplied by
1,000 at step 50, and at step 500. "healthy": the study's adaptive cells
(seed 0) and the main job's adaptive run. Each line says how the run ended
(finished, or stopped with status 1 as `dateopt-train` would), its accuracy
and steps, and the watch's counts: divergences (a false alarm, on a healthy
run), steps walked at gain 1 on a rising loss, skipped gradient jumps, and
gains the trust rules held. "baselines": the tuned recipes the bar is
measured from, and the main job's recipe at 1000x, 100x and 10x its LR with no
engine (what a diverged run's recipe gives by itself). `--only NAME` runs one of
them. `--rules-off a,b` runs every run with those of the engine's rules off (`dateopt.date._progress.ENGINE_RULES`; what the
ablation `python -m dateopt.study --ablate` measures on the study's cells):

  python scripts/divergence_evidence.py diverged --rules-off relapse --workdir runs/div_off

`--seed N` runs a set on another seed: the healthy set's runs, the main job's runs of the
diverged set and of the baselines, and the unclipped study LSTM at 4x and 32x (with its
baseline) on seed N, each name ending in "_seedN":

  python scripts/divergence_evidence.py healthy --only main_job --seed 1 --workdir runs/div_seed1
  python scripts/divergence_evidence.py diverged --only main_job_lr_x10_seed1 --seed 1 --workdir runs/div_seed1
"""

import argparse
import json
import os
import shutil
import time
from typing import Any, NamedTuple

import jax.numpy as jnp
import optax
from absl import logging

from dateopt import train
from dateopt.configs import load as load_config
from dateopt.train import trainer

MAIN_JOB = "configs/mnist1d_lstm.py"
STUDY = {"lstm": "configs/study_mnist1d_lstm.py", "resnet": "configs/study_mnist1d_resnet.py"}


class Run(NamedTuple):
  name: str
  config: Any
  explode_at: int | None = None


def _adaptive(path: str, multiple: int | None = None, seed: int = 0, **baseline):
  config = load_config(path)
  config.strategy, config.seed = "adaptive", seed
  if multiple is not None:
    config.batch_size = config.baseline.batch_size * multiple
  config.baseline = dict(config.baseline.to_dict(), **baseline)
  config.checkpoint_every_steps, config.progress_bar, config.eval_every_steps = -1, False, 0
  return config


def _seeded(seed: int | None) -> tuple[int, str, tuple[int, ...]]:
  """The main job's seed, the names' ending and the unclipped study LSTM's seeds of a set run
  on `seed` (None: the set's own seeds)."""
  if seed is None:
    return 0, "", (1, 2)
  return seed, f"_seed{seed}", (seed,)


def diverged_runs(seed: int | None = None) -> list[Run]:
  main_seed, tag, _ = _seeded(seed)
  noclip = ((4, 1), (32, 1), (32, 2)) if seed is None else ((4, seed), (32, seed))
  runs = [Run(f"main_job_lr_x{factor}{tag}",
              _adaptive(MAIN_JOB, seed=main_seed, learning_rate=2e-3 * factor))
          for factor in (3000, 1000, 100, 10)]
  runs.append(Run(f"main_job_lr_x1e-4{tag}",
                  _adaptive(MAIN_JOB, seed=main_seed, learning_rate=2e-3 * 1e-4)))
  for multiple, noclip_seed in noclip:
    runs.append(Run(f"study_lstm_noclip_{multiple}x_seed{noclip_seed}",
                    _adaptive(STUDY["lstm"], multiple, noclip_seed, learning_rate=4e-3,
                              grad_clip_norm=None)))
  runs += [Run(f"main_job_explode_at_{step}{tag}", _adaptive(MAIN_JOB, seed=main_seed), step)
           for step in (50, 500)]
  return runs


def baseline_runs(seed: int | None = None) -> list[Run]:
  """The baselines the bar is measured from: the main job's, and the unclipped study LSTM's."""
  main_seed, tag, noclip_seeds = _seeded(seed)

  def baseline(path, seed=0, **recipe):
    config = _adaptive(path, seed=seed, **recipe)
    config.strategy, config.batch_size = "legw", None  # the tuned recipe as it is
    return config

  return [Run(f"main_job_baseline{tag}", baseline(MAIN_JOB, main_seed))] + [
      Run(f"study_lstm_noclip_baseline_seed{noclip_seed}",
          baseline(STUDY["lstm"], noclip_seed, learning_rate=4e-3, grad_clip_norm=None))
      for noclip_seed in noclip_seeds] + [
      # The diverged set's bad LRs at the baseline's batch, with no engine: what the recipe
      # itself gives, so a diverged run is told apart from a recipe that learns badly.
      Run(f"main_job_baseline_lr_x{factor}{tag}",
          baseline(MAIN_JOB, main_seed, learning_rate=2e-3 * factor))
      for factor in (1000, 100, 10)]


def healthy_runs(multiples=(2, 4, 8, 16, 32, 64), workloads=tuple(STUDY), seed=0) -> list[Run]:
  runs = [Run("main_job", _adaptive(MAIN_JOB, seed=seed))]
  for workload in workloads:
    runs += [Run(f"study_{workload}_{k}x_seed{seed}", _adaptive(STUDY[workload], k, seed))
             for k in multiples]
  return runs


class _ExplodeState(NamedTuple):
  count: Any
  inner: Any


def explode_gradient_at(tx, step: int, factor: float = 1e3):
  """`tx`, whose gradient at train step `step` (1-based) is `factor` times larger: a fault,
  injected the way an exploding gradient reaches the optimizer (its measured squared norms
  grow by factor², too)."""

  def update_fn(updates, state, params=None, *, grad_sq_norms=None, **extra_args):
    scale = jnp.where(state.count + 1 == step, factor, 1.0)
    if grad_sq_norms is not None:
      grad_sq_norms = grad_sq_norms._replace(small=grad_sq_norms.small * scale**2,
                                             big=grad_sq_norms.big * scale**2)
    new_updates, inner = tx.update(optax.tree.scale(scale, updates), state.inner, params,
                                   grad_sq_norms=grad_sq_norms, **extra_args)
    return new_updates, _ExplodeState(state.count + 1, inner)

  return optax.GradientTransformationExtraArgs(
      lambda params: _ExplodeState(jnp.zeros((), jnp.int32), tx.init(params)), update_fn)


def run(spec: Run, workdir: str) -> dict[str, Any]:
  shutil.rmtree(workdir, ignore_errors=True)
  build = trainer.build_optimizer
  if spec.explode_at is not None:  # the fault goes in front of the whole optimizer
    trainer.build_optimizer = lambda *a, **k: (
        lambda tx, schedule: (explode_gradient_at(tx, spec.explode_at), schedule)
    )(*build(*a, **k))
  start, row = time.time(), {"run": spec.name, "seed": spec.config.seed}
  if spec.config.get("engine_rules_off"):
    row["rules_off"] = spec.config.engine_rules_off
  try:
    result = train.train_and_evaluate(spec.config, workdir)
    row.update(status=0, accuracy=result.eval_metrics["accuracy"], steps=result.steps)
    watch = optax.tree.get(result.state.opt_state, "DivergenceWatchState")
    if watch is not None:  # None: an engine from before the watch, run for comparison
      row.update(divergences=int(watch.divergences), holds=int(watch.holds),
                 gradient_jumps=int(watch.gradient_jumps),
                 gains_held=int(getattr(watch, "gains_held", -1)), gave_up=bool(watch.gave_up),
                 lr_scale=float(watch.lr_scale))
  except getattr(train, "DivergedError", ()) as stop:
    row.update(status=stop.exit_code, message=str(stop))
  finally:
    trainer.build_optimizer = build
  row["seconds"] = round(time.time() - start)
  return row


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("set", choices=["diverged", "healthy", "baselines"])
  parser.add_argument("--workdir", default="runs/divergence")
  parser.add_argument("--only", default=None)
  parser.add_argument("--multiples", default="2,4,8,16,32,64")
  parser.add_argument("--workloads", default="lstm,resnet")
  parser.add_argument("--seed", type=int, default=None,
                      help="run the set on this seed (default: each run's own; the healthy "
                           "set's is 0)")
  parser.add_argument("--rules-off", default="", metavar="RULES",
                      help="engine rules switched off in every run (config.engine_rules_off)")
  args = parser.parse_args()
  logging.set_verbosity(logging.ERROR)
  specs = {"diverged": lambda: diverged_runs(args.seed),
           "baselines": lambda: baseline_runs(args.seed),
           "healthy": lambda: healthy_runs(tuple(int(k) for k in args.multiples.split(",")),
                                           tuple(args.workloads.split(",")),
                                           args.seed or 0)}[args.set]()
  for spec in specs:
    if args.rules_off and spec.config.strategy == "adaptive":  # a baseline has no engine
      spec.config.engine_rules_off = args.rules_off
    if args.only is None or spec.name == args.only:
      print(json.dumps(run(spec, os.path.join(args.workdir, spec.name))), flush=True)


if __name__ == "__main__":
  main()
