"""Train-step time and examples/s: ResNet-50 with SGD-momentum vs dateopt LARS, the LSTMs,
and the MNIST-1D input pipeline against what its training step consumes.

The step is dateopt's own `train_step` (forward, backward, optimizer) jitted on
one device; medians over interleaved runs after compilation.

  python scripts/bench_train_step.py                    # everything (CPU: ~5 min)
  python scripts/bench_train_step.py --only resnet50 --resnet-batch 256 --dtype bfloat16   # on a GPU
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dateopt
from dateopt import data, models
from dateopt.train.steps import create_train_state, train_step


def step_runner(model, tx, inputs, labels, num_classes):
  """A jitted train step on a fixed batch, and its initial state."""
  state = create_train_state(model, tx, inputs[:1], seed=0)
  step = jax.jit(functools.partial(train_step, model=model, tx=tx, schedule=lambda s: 0.1,
                                   num_classes=num_classes, seed=0), donate_argnums=0)
  batch = {"inputs": inputs, "labels": labels}
  return step, state, batch


def median_step_seconds(runners: dict, rounds: int) -> dict[str, float]:
  """Interleaves the runners round-robin; median seconds per step of each."""
  states = {}
  for name, (step, state, batch) in runners.items():
    state, _ = step(state, batch)  # compile
    states[name] = jax.block_until_ready(state)
  times = {name: [] for name in runners}
  for _ in range(rounds):
    for name, (step, _, batch) in runners.items():
      start = time.perf_counter()
      states[name], metrics = step(states[name], batch)
      jax.block_until_ready(metrics["loss"])
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def bench_resnet50(batch_size: int, dtype: str, rounds: int) -> list[str]:
  model = models.create_model("resnet50", num_classes=1000, dtype=dtype)
  inputs = jnp.asarray(np.random.default_rng(0).normal(size=(batch_size, 224, 224, 3)), jnp.float32)
  labels = jnp.arange(batch_size, dtype=jnp.int32) % 1000
  runners = {
      "optax.sgd(momentum)": step_runner(model, optax.sgd(0.1, momentum=0.9), inputs, labels, 1000),
      "dateopt.lars": step_runner(model, dateopt.lars(0.1, weight_decay=1e-4), inputs, labels, 1000),
  }
  seconds = median_step_seconds(runners, rounds)
  sgd = seconds["optax.sgd(momentum)"]
  rows = [f"| ResNet-50 {dtype}, batch {batch_size} | step ms | images/s | vs SGD-m |", "|---|---:|---:|---:|"]
  for name, s in seconds.items():
    rows.append(f"| {name} | {s * 1e3:.0f} | {batch_size / s:.1f} | {100 * (s / sgd - 1):+.1f}% |")
  return rows


def bench_lstms(rounds: int) -> list[str]:
  rng = np.random.default_rng(0)
  cases = {
      "LSTM(128) classifier, 28 steps, batch 128": (
          models.create_model("lstm_classifier", num_classes=10, hidden_size=128),
          jnp.asarray(rng.normal(size=(128, 28, 28)), jnp.float32), jnp.zeros(128, jnp.int32), 10),
      "LSTM(64) MNIST-1D, 40 steps, batch 512": (
          models.create_model("lstm_classifier", num_classes=10, hidden_size=64),
          jnp.asarray(rng.normal(size=(512, 40, 1)), jnp.float32), jnp.zeros(512, jnp.int32), 10),
      "PTB small LM (2x200, unroll 20), batch 20": (
          models.create_model("lstm_lm", preset="ptb_small", vocab_size=10_000),
          jnp.zeros((20, 20), jnp.int32), jnp.zeros((20, 20), jnp.int32), 10_000),
  }
  rows = ["| LSTM (adam) | step ms | sequences/s |", "|---|---:|---:|"]
  for name, (model, inputs, labels, classes) in cases.items():
    s = median_step_seconds({name: step_runner(model, optax.adam(1e-3), inputs, labels, classes)},
                            rounds)[name]
    rows.append(f"| {name} | {s * 1e3:.1f} | {inputs.shape[0] / s:.0f} |")
  return rows


def bench_mnist1d_pipeline(batch_size: int, rounds: int) -> list[str]:
  dataset = data.get_dataset("mnist1d", num_samples=10_000)
  iterator = dataset.train_iterator(batch_size, seed=0)
  next(iterator)
  start = time.perf_counter()
  for _ in range(rounds * 10):
    next(iterator)
  pipeline = rounds * 10 * batch_size / (time.perf_counter() - start)
  model = models.create_model("lstm_classifier", num_classes=10, hidden_size=64)
  batch = dataset.train_batch(0, batch_size, seed=0)
  name = "step"
  s = median_step_seconds({name: step_runner(model, optax.adam(1e-3), jnp.asarray(batch["inputs"]),
                                             jnp.asarray(batch["labels"]), 10)}, rounds)[name]
  return ["| MNIST-1D, batch %d | examples/s |" % batch_size, "|---|---:|",
          f"| input pipeline (train_iterator) | {pipeline:,.0f} |",
          f"| train step consumes | {batch_size / s:,.0f} |",
          f"| ratio | {pipeline * s / batch_size:.1f}x |"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", choices=["resnet50", "lstm", "pipeline"], default=None)
  parser.add_argument("--resnet-batch", type=int, default=8)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args()
  print(f"jax {jax.__version__}, {jax.default_backend()}: {jax.devices()[0].device_kind}\n")
  sections = {"resnet50": lambda: bench_resnet50(args.resnet_batch, args.dtype, args.rounds),
              "lstm": lambda: bench_lstms(args.rounds * 4),
              "pipeline": lambda: bench_mnist1d_pipeline(512, args.rounds * 4)}
  for name, run in sections.items():
    if args.only in (None, name):
      print("\n".join(run()) + "\n", flush=True)


if __name__ == "__main__":
  main()
