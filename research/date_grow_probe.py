"""One DATE adaptive run from a config at k x the baseline's batch, fixed or grown: one JSON line.

The probe behind notes/batch_growth.md's tables of growth rules:

  python research/date_grow_probe.py configs/mnist1d_lstm.py 64 grow 0 1 --workdir runs/probe
  python research/date_grow_probe.py configs/study_mnist1d_resnet.py 64 fixed 0

Arguments: config path, k, "grow" or "fixed", seed, and (grown runs) the step price;
`--noise-batch-exponent 0` reads each rung's noise scale as measured (grown runs; the
engine's default credits it × (B_max/B)^0.2); `--gain-rule sqrt` scales the LR by √r_t;
`--noise-of adam_step` measures the noise scale in Adam's metric (`Recipe.noise_of`);
`--checkpoint-every-steps 20` keeps a checkpoint every 20 steps (for
`research/critical_batch.py`); `--log-every-steps 1` logs every step (the watch's EMAs can
then be recomputed from the loss); `--first-rung 16` starts a grown run's ladder at 16 x the
baseline's batch (its lower rungs dropped), the way Seesaw's best setting starts
(docs/results/schedule_study.md).
"""

import argparse
import json
import time

from absl import logging

from dateopt import date, train
from dateopt.configs import load as load_config


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("config")
  parser.add_argument("multiple", type=int)
  parser.add_argument("mode", choices=["grow", "fixed"])
  parser.add_argument("seed", type=int, nargs="?", default=0)
  parser.add_argument("step_price", type=float, nargs="?", default=None)
  parser.add_argument("--workdir", default="runs/grow_probe")
  parser.add_argument("--noise-batch-exponent", type=float, default=None,
                      help="grown runs: α of the credit (B_max/B)^α on rung B's noise scale "
                           "(default: the engine's)")
  parser.add_argument("--gain-rule", choices=["linear", "sqrt"], default=None,
                      help="the LR's gain rule: lr x r_t or lr x sqrt(r_t) (default: the plan's)")
  parser.add_argument("--noise-of", choices=["gradient", "lars_step", "adam_step"],
                      default=None, help="what the noise scale is measured on (default: the "
                                         "plan's, Recipe.noise_of 'auto')")
  parser.add_argument("--checkpoint-every-steps", type=int, default=None,
                      help="save, and keep, a checkpoint every this many steps (default: none)")
  parser.add_argument("--log-every-steps", type=int, default=None,
                      help="log the training metrics every this many steps (default: the "
                           "config's); logging does not change the run")
  parser.add_argument("--first-rung", type=int, default=None,
                      help="grown runs: the ladder's first rung, in multiples of the baseline's "
                           "batch (default: 1, the baseline's own)")
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  if args.first_rung is not None:
    _start_ladder_at(args.first_rung, parser)
  config = load_config(args.config)
  config.seed, config.strategy = args.seed, "adaptive"
  config.batch_size = config.baseline.batch_size * args.multiple
  plan = {"grow_batch": args.mode == "grow"}
  engine = {}  # EngineConfig's fields
  if args.mode == "grow" and args.step_price is not None:
    engine["step_price"] = args.step_price
  if args.mode == "grow" and args.noise_batch_exponent is not None:
    engine["noise_batch_exponent"] = args.noise_batch_exponent
  if engine:
    plan["engine"] = engine
  if args.gain_rule is not None:
    plan["gain_rule"] = args.gain_rule
  if args.noise_of is not None:
    plan["noise_of"] = args.noise_of
  config.plan = plan
  config.checkpoint_every_steps, config.progress_bar, config.eval_every_steps = -1, False, 0
  if args.checkpoint_every_steps is not None:
    if args.checkpoint_every_steps < 1:
      parser.error(f"--checkpoint-every-steps must be >= 1; got {args.checkpoint_every_steps}")
    config.checkpoint_every_steps = args.checkpoint_every_steps
    config.keep_checkpoints = 10**6  # every one: the probe's runs are short
  config.overwrite = True  # a probe replaces the last one in its workdir
  if args.log_every_steps is not None:
    if args.log_every_steps < 1:
      parser.error(f"--log-every-steps must be >= 1; got {args.log_every_steps}")
    config.log_every_steps = args.log_every_steps
  start = time.time()
  result = train.train_and_evaluate(config, args.workdir)
  print(json.dumps({
      "multiple": args.multiple, "mode": args.mode, "seed": args.seed,
      "step_price": result.recipe.engine["step_price"],
      "noise_batch_exponent": result.recipe.engine["noise_batch_exponent"],
      "gain_rule": result.recipe.gain_rule, "noise_of": result.recipe.measured_noise_of,
      "accuracy": result.eval_metrics["accuracy"], "steps": result.steps,
      "examples": result.examples,
      "examples_vs_baseline": result.examples / (result.baseline.total_steps
                                                 * result.baseline.batch_size),
      "first_rung": args.first_rung or 1, "largest_batch": result.largest_batch_size,
      "compilations": result.train_step_compilations, "seconds": round(time.time() - start)}))


def _start_ladder_at(first_rung: int, parser) -> None:
  """Every ladder the run builds (`date.batch_ladder`) without its rungs below `first_rung` x
  its base."""
  if first_rung < 1:
    parser.error(f"--first-rung must be >= 1; got {first_rung}")
  ladder = date.batch_ladder

  def from_first_rung(base_batch_size, max_batch_size, **kwargs):
    rungs = ladder(base_batch_size, max_batch_size, **kwargs)
    return tuple(b for b in rungs if b >= min(first_rung * base_batch_size, rungs[-1]))

  date.batch_ladder = from_first_rung


if __name__ == "__main__":
  main()
