"""McCandlish's two noise scales at a run's checkpoints: the simple and the curvature-weighted.

DATE reads B_simple = tr Σ / |G|² (per-example gradient covariance Σ, mean gradient G). McCandlish
et al. 2018 (eq. 2.8) derive the critical batch from B_crit = tr(HΣ) / GᵀHG, which weighs the
noise and the signal by the curvature H; the two agree when H is a multiple of the identity.
This command measures both on the parameters a run saved, from Hessian-vector products
(`jax.jvp` of the gradient), to check whether B_simple under- or over-states the critical batch
in a phase of training (notes/batch_growth.md, the 2026-11-29 section "two other readings of
the critical batch, measured, neither adopted"):

  python research/date_grow_probe.py configs/study_mnist1d_lstm.py 32 grow 0 --workdir runs/g32 \
      --checkpoint-every-steps 20
  python research/critical_batch.py configs/study_mnist1d_lstm.py runs/g32 --steps 120,200,300

Any trainer workdir whose checkpoints were kept will do (`config.checkpoint_every_steps`,
`config.keep_checkpoints`); the config gives the model and the data.

Each step's estimate pools `--batches` training batches of `--groups` × `--group-size`
examples: over groups, tr Σ ≈ b·Σ_i|ξ_i|²/(n−1) and tr(HΣ) ≈ b·Σ_i ξ_iᵀHξ_i/(n−1) (ξ_i: group i's
gradient minus the batch's, b examples a group, n groups, H the batch's Hessian), and
|G|² ≈ |Ĝ|² − tr Σ/N, GᵀHG ≈ ĜᵀHĜ − tr(HΣ)/N (N = n·b); sums over batches, then the ratios.
GᵀHG ≤ 0 gives B_crit = inf and tr(HΣ) < 0 a negative B_crit: a non-convex stretch, where no
critical batch is defined. One line of JSON per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from dateopt import date, train
from dateopt.configs import load as load_config
from dateopt.train import steps

_SUMS = ("trace", "grad_sq", "trace_h", "grad_h_grad")
_vdot = optax.tree_utils.tree_vdot


def batch_sums(loss_fn: Callable[[Any, Any], jax.Array], params: Any, batch: Any,
               num_groups: int) -> dict[str, float]:
  """The four estimates of one batch (tr Σ, |G|², tr HΣ, GᵀHG), bias-corrected.

  Example:
    >>> loss = lambda w, b: 0.5 * jnp.mean(jnp.sum((w - b["x"]) ** 2, -1))  # H = I
    >>> x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    >>> sums = batch_sums(loss, jnp.full(3, 2.0), {"x": x}, 8)
    >>> round(sums["trace_h"] / sums["trace"], 4), round(sums["grad_h_grad"] / sums["grad_sq"], 4)
    (1.0, 1.0)
  """
  _, group_grads = date.per_group_value_and_grad(loss_fn, num_groups)(params, batch)
  size = jax.tree.leaves(batch)[0].shape[0]
  group_size = size // num_groups
  mean = jax.tree.map(lambda g: jnp.mean(g, axis=0), group_grads)
  grad = jax.grad(loss_fn)
  hvp = jax.jit(lambda v: jax.jvp(lambda p: grad(p, batch), (params,), (v,))[1])
  trace = trace_h = 0.0
  for i in range(num_groups):
    xi = jax.tree.map(lambda g, m: g[i] - m, group_grads, mean)
    trace += float(_vdot(xi, xi))
    trace_h += float(_vdot(xi, hvp(xi)))
  scale = group_size / (num_groups - 1)
  trace, trace_h = trace * scale, trace_h * scale
  return {"trace": trace, "grad_sq": float(_vdot(mean, mean)) - trace / size,
          "trace_h": trace_h, "grad_h_grad": float(_vdot(mean, hvp(mean))) - trace_h / size}


def noise_scales(loss_fn: Callable[[Any, Any], jax.Array], params: Any,
                 batches: Iterable[Any], num_groups: int) -> dict[str, float]:
  """B_simple and B_crit pooled over `batches`: each estimate summed, then the ratios."""
  totals = dict.fromkeys(_SUMS, 0.0)
  for batch in batches:
    for key, value in batch_sums(loss_fn, params, batch, num_groups).items():
      totals[key] += value
  ratio = lambda num, den: num / den if den > 0 else math.inf
  return {"b_simple": ratio(totals["trace"], totals["grad_sq"]),
          "b_crit": ratio(totals["trace_h"], totals["grad_h_grad"]), **totals}


def _loss_fn(model, batch_stats: Any) -> Callable[[Any, Any], jax.Array]:
  """The training loss at `params` (batch normalisation, if any, over the call's batch), with
  the trainer's own model call and cross-entropy."""

  def loss_fn(params, batch):
    logits, _ = steps.apply_model(model, params, batch_stats, inputs=batch["inputs"],
                                  train=True)
    return jnp.mean(steps.cross_entropy(logits, batch["labels"], logits.shape[-1]))

  return loss_fn


def _restored(workdir: str, step: int) -> dict[str, Any]:
  path = os.path.abspath(os.path.join(workdir, "checkpoints", str(step), "default"))
  try:
    return ocp.StandardCheckpointer().restore(path)
  except FileNotFoundError as error:
    raise FileNotFoundError(f"{path}: no checkpoint at step {step}; train with "
                            "config.checkpoint_every_steps and keep_checkpoints set.") from error


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("config")
  parser.add_argument("workdir")
  parser.add_argument("--steps", required=True, help="comma-separated checkpoint steps")
  parser.add_argument("--batches", type=int, default=4)
  parser.add_argument("--groups", type=int, default=32)
  parser.add_argument("--group-size", type=int, default=64)
  parser.add_argument("--seed", type=int, default=12345, help="the batches' data order")
  args = parser.parse_args()
  for name in ("batches", "group_size"):
    if getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
  if args.groups < 2:
    parser.error(f"--groups must be >= 2; got {args.groups}")
  exp = train.build_experiment(load_config(args.config))
  size = args.groups * args.group_size
  batches = [{key: jnp.asarray(value) for key, value in
              exp.dataset.train_batch(i, size, seed=args.seed).items()
              if key in ("inputs", "labels")} for i in range(args.batches)]
  for step in [int(s) for s in args.steps.split(",")]:
    saved = _restored(args.workdir, step)
    loss_fn = _loss_fn(exp.model, saved.get("batch_stats") or {})
    scales = noise_scales(loss_fn, saved["params"], batches, args.groups)
    loss = float(np.mean([loss_fn(saved["params"], b) for b in batches]))
    print(json.dumps({"step": step, "loss": round(loss, 4),
                      **{k: round(v, 4) for k, v in scales.items()}}), flush=True)


if __name__ == "__main__":
  main()
