"""Train-step timing on a fixed batch: dateopt's own `train_step`, jitted on one device.

Shared by `scripts/bench_train_step.py` and `notebooks/resnet50_tpu.ipynb`, so
the notebook times the same step the benchmark does.

Example:
  >>> import dateopt, optax
  >>> import jax.numpy as jnp
  >>> from dateopt import models
  >>> from dateopt.train import benchmark
  >>> model = models.create_model("resnet_tiny", num_classes=10)
  >>> inputs, labels = jnp.zeros((8, 32, 32, 3)), jnp.zeros(8, jnp.int32)
  >>> runners = {name: benchmark.step_runner(model, tx, inputs=inputs, labels=labels,
  ...                                       num_classes=10)
  ...            for name, tx in [("sgd", optax.sgd(0.1, momentum=0.9)),
  ...                             ("lars", dateopt.lars(0.1))]}
  >>> seconds = benchmark.median_step_seconds(runners, rounds=5)   # {name: s/step}
"""

from __future__ import annotations

import functools
import statistics
import time

import jax

from dateopt.train.steps import create_train_state, train_step


def step_runner(model, tx, *, inputs, labels, num_classes):
  """A jitted train step on a fixed batch, its initial state, and the batch."""
  # A jitted init: faster than op by op for a ResNet-50, and no two leaves share a
  # buffer, so the step can donate the state.
  state = jax.jit(functools.partial(create_train_state, model, tx, seed=0))(inputs[:1])
  step = jax.jit(functools.partial(train_step, model=model, tx=tx,
                                   num_classes=num_classes, seed=0), donate_argnums=0)
  batch = {"inputs": inputs, "labels": labels}
  return step, state, batch


def median_step_seconds(runners: dict, rounds: int) -> dict[str, float]:
  """Interleaves the runners round-robin; median seconds per step of each.

  Interleaving spreads a shared machine's slow moments over every runner
  alike; the first step of each (compilation) is not timed.
  """
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
