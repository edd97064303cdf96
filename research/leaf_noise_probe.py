"""Per-leaf weight norms and gradient noise of one DATE run, at chosen points of its progress.

The evidence behind notes/batch_growth.md ("Per layer: the history is in the parameters LARS
leaves at the raw LR", "Per leaf: whose noise scale the ResNet reads"): whose noise scale a
ResNet reads, and where a grown run's history sits. It trains one run like
`date_grow_probe.py`, checkpointing every `--every` steps. Then, at the checkpoint
nearest each progress τ, it reports:
- each leaf's weight norm;
- each leaf's |G|² and tr Σ, estimated as the engine does (McCandlish et al. 2018)
  from `--batches` training batches of `--small` examples against their mean;
- the noise scale of all leaves, and the same sums weighted by each trust-ratio leaf's LARS trust
  ratio² (You et al. 2017).

  python research/leaf_noise_probe.py configs/study_mnist1d_resnet.py 64 grow 0 \\
      --workdir runs/leaf_grow64 --taus 1000,2000
  python research/leaf_noise_probe.py configs/study_mnist1d_resnet.py 16 fixed 0 \\
      --workdir runs/leaf_fixed16 --taus 1000,2000

A workdir that already holds the run's checkpoints is read again, not retrained.
"""

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from dateopt import date, masks, train
from dateopt.configs import load as load_config
from dateopt.train import experiment, steps as steps_lib
from dateopt.date import _noise as noise_lib


def run_config(args):
  config = load_config(args.config)
  config.seed, config.strategy = args.seed, "adaptive"
  config.batch_size = config.baseline.batch_size * args.multiple
  config.plan = {"grow_batch": args.mode == "grow"}
  config.checkpoint_every_steps, config.keep_checkpoints = args.every, 10_000
  config.progress_bar, config.eval_every_steps, config.overwrite = False, 0, True
  return config


def progress_by_step(workdir):
  """{step: (τ, the step's batch)} from the run's metrics.jsonl."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: (r["train/date/progress"], int(r["train/date/batch_size"]))
          for r in rows if "train/date/progress" in r}


def nearest_checkpoint(workdir, tau_of, tau):
  steps = [int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit()]
  return min((s for s in steps if s in tau_of), key=lambda s: abs(tau_of[s][0] - tau))


def leaf_noise(exp, params, batch_stats, num_batches, small):
  """Per leaf (in tree order): (|G|², tr Σ) from `num_batches` batches of `small` examples."""
  label_smoothing = float(exp.config.baseline.get("label_smoothing", 0.0))

  def loss(p, inputs, labels):
    logits, _ = steps_lib.apply_model(exp.model, p, batch_stats, inputs=inputs, train=True,
                                      rng=jax.random.key(0))
    return jnp.mean(steps_lib.cross_entropy(logits, labels, exp.dataset.num_classes,
                                            label_smoothing=label_smoothing))

  grad = jax.jit(jax.grad(loss))
  small_sq, total = 0.0, None
  for j in range(num_batches):
    batch = exp.dataset.train_batch(j, small, seed=1234)
    g = [np.asarray(x, np.float64) for x in jax.tree.leaves(
        grad(params, jnp.asarray(batch["inputs"]), jnp.asarray(batch["labels"])))]
    small_sq = small_sq + np.array([np.sum(x ** 2) for x in g])
    total = g if total is None else [t + x for t, x in zip(total, g)]
  big_sq = np.array([np.sum((t / num_batches) ** 2) for t in total])
  sq_norms = date.GradientSqNorms(small_sq / num_batches, big_sq, small, num_batches * small)
  return tuple(np.asarray(x, np.float64) for x in noise_lib.noise_estimates(sq_norms))


def report(exp, workdir, step, logged, args):
  """Prints the leaf table of the checkpoint of `step`; `logged` is its (τ, batch)."""
  tau, batch = logged
  state = ocp.StandardCheckpointer().restore(
      os.path.abspath(os.path.join(workdir, "checkpoints", str(step), "default")))
  params = state["params"]
  names = [masks.path_to_str(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  norms = np.array([float(np.linalg.norm(np.asarray(x, np.float64)))
                    for x in jax.tree.leaves(params)])
  grad_sq, trace = leaf_noise(exp, params, state["batch_stats"], args.batches, args.small)
  trusted = np.array(jax.tree.leaves(masks.resolve(exp.recipe.mask, params)))
  trust_sq = norms ** 2 / (grad_sq + trace / batch)  # LARS's c cancels; no weight-decay term
  print(f"\n== {workdir}: step {step}, τ {tau:.0f}, batch {batch}")
  print(f"B_noise, all leaves: {trace.sum() / grad_sq.sum():.1f}; trust-ratio leaves weighted by their "
        f"trust ratio² (batch {batch}): "
        f"{(trust_sq * trace)[trusted].sum() / (trust_sq * grad_sq)[trusted].sum():.1f}; "
        f"masked leaves' share of |G|² / tr Σ: {grad_sq[~trusted].sum() / grad_sq.sum():.1%}"
        f" / {trace[~trusted].sum() / trace.sum():.1%}")
  print(f"{'leaf':44s} {'norm':>8s} {'|G|^2':>10s} {'share':>6s} {'tr S':>10s} {'share':>6s}"
        f" {'B':>8s}")
  for i, name in enumerate(names):
    own = trace[i] / grad_sq[i] if grad_sq[i] > 0 else float("nan")
    print(f"{name[:44]:44s} {norms[i]:8.3f} {grad_sq[i]:10.3g} {grad_sq[i] / grad_sq.sum():6.1%}"
          f" {trace[i]:10.3g} {trace[i] / trace.sum():6.1%} {own:8.1f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("config")
  parser.add_argument("multiple", type=int)
  parser.add_argument("mode", choices=["grow", "fixed"])
  parser.add_argument("seed", type=int)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--taus", default="1000,2000", help="progress points, baseline steps")
  parser.add_argument("--every", type=int, default=40, help="steps between checkpoints")
  parser.add_argument("--batches", type=int, default=64)
  parser.add_argument("--small", type=int, default=32, help="examples per estimate batch")
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  config = run_config(args)
  if not os.path.isdir(os.path.join(args.workdir, "checkpoints")):
    result = train.train_and_evaluate(config, args.workdir)
    print(f"trained: {result.steps} steps, accuracy {result.eval_metrics['accuracy']:.4f}")
  exp = experiment.build_experiment(config)
  tau_of = progress_by_step(args.workdir)
  for tau in (float(t) for t in args.taus.split(",")):
    step = nearest_checkpoint(args.workdir, tau_of, tau)
    report(exp, args.workdir, step, tau_of[step], args)


if __name__ == "__main__":
  main()
