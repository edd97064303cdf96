"""Times the jitted optimizer update alone on ResNet-50 and LSTM parameter shapes.

Compares optax.sgd(momentum), optax.lars, optax.lamb, dateopt.lars and
dateopt.lamb, and prints a markdown table with the ratios to SGD-momentum and
to optax's own LARS/LAMB. Two timings per optimizer:

- `update`: `tx.update(grads, state, params)` jitted, returning updates and state;
- `update+apply`: the same plus `optax.apply_updates`, returning new params and
  state (what a train step executes after the backward pass).

Runs are interleaved round-robin so machine noise hits every optimizer alike;
the figure is the median over all rounds, after compilation. Below each table:

- the spread of dateopt.lars / SGD-momentum, as quartiles of the per-round
  ratio (each round times both back to back);
- the floor: SGD-momentum plus reading every trust-ratio leaf's w and g once
  for the norms, the traffic any exact LARS adds before its update can start.

Usage:
  python scripts/bench_optimizers.py                 # both models, 30 rounds
  python scripts/bench_optimizers.py --models resnet50 --rounds 50
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dateopt

LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4


def optimizers() -> dict[str, optax.GradientTransformation]:
  """The optimizers compared, with the hyper-parameters a ResNet recipe uses."""
  return {
      "optax.sgd(momentum)": optax.sgd(LR, momentum=MOMENTUM),
      "optax.lars": optax.lars(LR, weight_decay=WEIGHT_DECAY, momentum=MOMENTUM),
      "dateopt.lars": dateopt.lars(LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY),
      "optax.lamb": optax.lamb(1e-3, weight_decay=0.01),
      "dateopt.lamb": dateopt.lamb(1e-3, weight_decay=0.01),
  }


def param_shapes(model_name: str):
  """The real parameter tree (names and shapes) of a dateopt reference model."""
  from dateopt import models  # Flax is needed for the shapes only.
  if model_name == "resnet50":
    model, inputs = models.create_model("resnet50", num_classes=1000), jnp.zeros((1, 224, 224, 3))
  elif model_name == "lstm":
    model = models.create_model("lstm_lm", preset="ptb_large", vocab_size=10_000)
    inputs = jnp.zeros((1, 35), jnp.int32)
  else:
    raise ValueError(f"model must be one of 'resnet50', 'lstm'; got {model_name!r}.")
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), inputs, train=False))
  return variables["params"]


def random_tree(shapes, seed: int, scale: float):
  """Concrete float32 arrays with the given shapes (values do not affect timing)."""
  leaves, treedef = jax.tree.flatten(shapes)
  rng = np.random.default_rng(seed)
  return treedef.unflatten(
      [jnp.asarray(rng.normal(0, scale, s.shape).astype(np.float32)) for s in leaves])


def make_steps(tx):
  """The two jitted functions timed for one optimizer."""
  update = jax.jit(lambda g, s, p: tx.update(g, s, p))

  def update_and_apply(g, s, p):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  return update, jax.jit(update_and_apply)


def time_call(fn, grads, state, params) -> tuple[float, object]:
  start = time.perf_counter()
  out = fn(grads, state, params)
  jax.block_until_ready(out)
  return time.perf_counter() - start, out[1]


def norm_reads():
  """Jitted: dateopt.lars's trust ratios alone, i.e. its reads of w and g for the norms."""
  return jax.jit(lambda g, s, p: (dateopt.transforms.lars_trust_ratios(
      g, p, weight_decay=WEIGHT_DECAY, mask=dateopt.masks.exclude_bias_and_norm), s))


NORMS = "norm reads"


def bench_model(model_name: str, rounds: int) -> dict[str, dict[str, list[float]]]:
  """Per-round seconds of every optimizer (and the norm reads), interleaved."""
  shapes = param_shapes(model_name)
  params, grads = random_tree(shapes, 0, 0.05), random_tree(shapes, 1, 0.01)
  runners = {}
  for name, tx in optimizers().items():
    update, update_and_apply = make_steps(tx)
    state = tx.init(params)
    for fn in (update, update_and_apply):  # compile and warm up.
      time_call(fn, grads, state, params)
    runners[name] = dict(update=update, apply=update_and_apply, state=state)
  norms = norm_reads()
  time_call(norms, grads, None, params)
  runners[NORMS] = dict(update=norms, apply=norms, state=None)
  times = {name: {"update": [], "apply": []} for name in runners}
  for _ in range(rounds):
    for name, r in runners.items():
      for kind in ("update", "apply"):
        seconds, r["state"] = time_call(r[kind], grads, r["state"], params)
        times[name][kind].append(seconds)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  print(f"\n{model_name}: {len(jax.tree.leaves(shapes))} leaves, {n_params:,} params, "
        f"median of {rounds} interleaved rounds")
  return times


def medians_of(times):
  return {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}


def spread_and_floor(times) -> str:
  """The quartiles of the per-round LARS/SGD ratio, and the SGD + norm-reads floor."""
  lines = []
  sgd, lars, norms = (times[k] for k in ("optax.sgd(momentum)", "dateopt.lars", NORMS))
  for kind, label in (("update", "update"), ("apply", "update+apply")):
    ratios = np.array(lars[kind]) / np.array(sgd[kind])
    q1, q2, q3 = np.percentile(ratios, [25, 50, 75])
    floor = 1 + statistics.median(norms[kind]) / statistics.median(sgd[kind])
    lines.append(f"- {label}: dateopt.lars / SGD-m per round: median {q2:.2f}×, "
                 f"quartiles {q1:.2f}–{q3:.2f}×; floor (SGD-m + norm reads) {floor:.2f}×")
  return "\n".join(lines)


def markdown_table(model_name: str, medians: dict[str, dict[str, float]]) -> str:
  sgd = medians["optax.sgd(momentum)"]
  reference = {"dateopt.lars": "optax.lars", "dateopt.lamb": "optax.lamb"}
  rows = [f"| {model_name} | update ms | × SGD-m | vs optax | update+apply ms | × SGD-m | vs optax |",
          "|---|---:|---:|---:|---:|---:|---:|"]
  for name, m in medians.items():
    if name == NORMS:
      continue
    cells = [name]
    for kind in ("update", "apply"):
      ref = reference.get(name)
      vs = f"{m[kind] / medians[ref][kind]:.2f}×" if ref else ""
      cells += [f"{m[kind] * 1e3:.1f}", f"{m[kind] / sgd[kind]:.2f}×", vs]
    rows.append("| " + " | ".join(cells) + " |")
  return "\n".join(rows)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", nargs="+", default=["resnet50", "lstm"],
                      choices=["resnet50", "lstm"])
  parser.add_argument("--rounds", type=int, default=30)
  args = parser.parse_args()
  print(f"jax {jax.__version__}, optax {optax.__version__}, backend "
        f"{jax.default_backend()}, {jax.device_count()} device(s): {jax.devices()[0].device_kind}")
  for model_name in args.models:
    times = bench_model(model_name, args.rounds)
    print(markdown_table(model_name, medians_of(times)))
    print(spread_and_floor(times))


if __name__ == "__main__":
  main()
