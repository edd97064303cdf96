"""Train-step time and examples/s: ResNet-50 with SGD-momentum vs dateopt LARS, the LSTMs,
the MNIST-1D input pipeline against what its training step consumes, and the cost of
watching (DATE's noise scale, statistics and guard) on the main job's step.

The step is dateopt's own `train_step` (forward, backward, optimizer) jitted on
one device; medians over interleaved runs after compilation.

  python scripts/bench_train_step.py                    # everything (CPU: ~5 min)
  python scripts/bench_train_step.py --only resnet50 --resnet-batch 256 --dtype bfloat16   # on a GPU
  python scripts/bench_train_step.py --only watching --rounds 30   # DATE's cost, on vs off
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
from dateopt import data, date, models
from dateopt.train.benchmark import median_step_seconds, step_runner
from dateopt.train.steps import create_train_state, train_step


def bench_resnet50(batch_size: int, dtype: str, rounds: int) -> list[str]:
  model = models.create_model("resnet50", num_classes=1000, dtype=dtype)
  inputs = jnp.asarray(np.random.default_rng(0).normal(size=(batch_size, 224, 224, 3)), jnp.float32)
  labels = jnp.arange(batch_size, dtype=jnp.int32) % 1000
  runners = {
      "optax.sgd(momentum)": step_runner(model, optax.sgd(0.1, momentum=0.9), inputs=inputs,
                                         labels=labels, num_classes=1000),
      "dateopt.lars": step_runner(model, dateopt.lars(0.1, weight_decay=1e-4), inputs=inputs,
                                  labels=labels, num_classes=1000),
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
    s = median_step_seconds({name: step_runner(model, optax.adam(1e-3), inputs=inputs,
                                                   labels=labels, num_classes=classes)},
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
  s = median_step_seconds({name: step_runner(
      model, optax.adam(1e-3), inputs=jnp.asarray(batch["inputs"]),
      labels=jnp.asarray(batch["labels"]), num_classes=10)}, rounds)[name]
  return ["| MNIST-1D, batch %d | examples/s |" % batch_size, "|---|---:|",
          f"| input pipeline (train_iterator) | {pipeline:,.0f} |",
          f"| train step consumes | {batch_size / s:,.0f} |",
          f"| ratio | {pipeline * s / batch_size:.1f}x |"]


def bench_watching(batch_size: int, rounds: int, measure_every: tuple[int, ...],
                   log_every: int = 20) -> list[str]:
  """DATE adaptive's whole watch (grouped gradients for the noise scale, statistics on log
  steps, divergence guard) against the same step without it, on the main job's LSTM.

  One cycle is `log_every` steps, as the trainer runs them: statistics on the last,
  the noise scale measured on 1 step in N (a plain gradient on the others). Variants
  are interleaved cycle by cycle; the figure is the median cycle time per step.
  """
  dataset = data.get_dataset("mnist1d", num_samples=10_000)
  batch = dataset.train_batch(0, batch_size, seed=0)
  batch = {"inputs": jnp.asarray(batch["inputs"]), "labels": jnp.asarray(batch["labels"])}
  model = models.create_model("lstm_classifier", num_classes=10, hidden_size=64)
  base = date.Recipe(batch_size=32, num_examples=8000, num_epochs=30, learning_rate=2e-3,
                     optimizer="adam", warmup_epochs=0.25)
  plain_tx, _ = date.build(base)
  watched = date.plan(base, batch_size, "adaptive")
  watched_tx = date.track_statistics(date.divergence_guard(date.build(watched)[0]))

  def runner(tx, recipe, groups, every):
    state = jax.jit(functools.partial(create_train_state, model, tx, seed=0))(
        batch["inputs"][:1])  # jitted: no two leaves share a buffer, so donation works
    step = jax.jit(functools.partial(train_step, model=model, tx=tx, num_classes=10, seed=0,
                                     grad_groups=groups, recipe=recipe),
                   static_argnames="measure_noise", donate_argnums=0)  # as the trainer does
    pattern = [(np.bool_(i == log_every - 1) if groups else None,
                i % every == 0 if groups and every > 1 else None)
               for i in range(log_every)]
    return step, state, pattern

  runners = {"off (plain step)": runner(plain_tx, None, 0, 1)}
  for every in measure_every:
    runners[f"on, noise every {every} step{'s' if every > 1 else ''}"] = runner(
        watched_tx, watched, 8, every)
  states = {}
  for name, (step, state, pattern) in runners.items():  # compile every variant used
    for record, measure in pattern[-2:] + pattern[:1]:
      state, _ = step(state, batch, record_statistics=record, measure_noise=measure)
    states[name] = jax.block_until_ready(state)
  times = {name: [] for name in runners}
  for _ in range(rounds):
    for name, (step, _, pattern) in runners.items():
      start = time.perf_counter()
      for record, measure in pattern:
        states[name], metrics = step(states[name], batch, record_statistics=record,
                                     measure_noise=measure)
      jax.block_until_ready(metrics["loss"])
      times[name].append((time.perf_counter() - start) / log_every)
  off = statistics.median(times["off (plain step)"])
  rows = [f"| MNIST-1D LSTM(64), batch {batch_size}, {rounds} rounds of {log_every} steps "
          f"| step ms | examples/s | vs off |", "|---|---:|---:|---:|"]
  for name, t in times.items():
    s = statistics.median(t)
    rows.append(f"| {name} | {s * 1e3:.2f} | {batch_size / s:,.0f} | {100 * (s / off - 1):+.1f}% |")
  ratios = {name: statistics.median(a / b for a, b in zip(t, times["off (plain step)"]))
            for name, t in times.items() if name != "off (plain step)"}
  rows.append("")
  rows += [f"- {name}: median per-round ratio {r:.3f}" for name, r in ratios.items()]
  return rows


def _inside_cond(step, total_steps: int):
  """`step` under `lax.cond(progress covered, idle, step)`, as the trainer had it."""
  def wrapped(state, batch, *, record_statistics=None, measure_noise=None):
    run = lambda: step(state, batch, record_statistics=record_statistics,
                       measure_noise=measure_noise)
    shapes = jax.eval_shape(run)[1]
    idle = lambda: (state, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), shapes))
    return jax.lax.cond(date.progress_done(state.opt_state, total_steps), idle, run)
  return wrapped


def bench_control_flow(batch_size: int, rounds: int) -> list[str]:
  """The study's ResNet (workload (b)) with LARS: the trainer's step, static LEGW vs DATE
  adaptive, against the same steps with their branch traced into a `lax.cond` (what the
  trainer did before: XLA:CPU runs computations nested in control flow on one thread)."""
  from dateopt import configs
  from dateopt.train import experiment
  config = configs.load("study_mnist1d_resnet")
  config.batch_size = batch_size
  dataset = data.get_dataset(config.dataset, **config.dataset_kwargs.to_dict())
  batch = {k: jnp.asarray(v) for k, v in dataset.train_batch(0, batch_size, seed=0).items()}

  def runner(strategy: str, measure, wrap_in_cond: bool = False):
    config.strategy = strategy
    exp = experiment.build_experiment(config)
    tx, _ = experiment.build_optimizer(config, exp.recipe)
    step = functools.partial(train_step, model=exp.model, tx=tx, num_classes=10, seed=0,
                             grad_groups=config.grad_groups, recipe=exp.recipe)
    if wrap_in_cond:  # the old idle branch: the whole step under a traced predicate
      step = _inside_cond(step, exp.recipe.total_steps)
    static = ("measure_noise",) if isinstance(measure, bool) else ()  # as the trainer passes it
    jitted = jax.jit(step, static_argnames=static, donate_argnums=0)
    state = jax.jit(functools.partial(create_train_state, exp.model, tx, seed=0))(
        batch["inputs"][:1])
    return lambda state: jitted(state, batch, measure_noise=measure), state

  cases = {
      "static LEGW": runner("legw", None),
      "DATE adaptive (the trainer's step)": runner("adaptive", None),
      "DATE adaptive, step inside lax.cond (before)": runner("adaptive", None, True),
      "static LEGW, a non-measuring step, static flag": runner("legw", False),
      "static LEGW, a non-measuring step, traced flag (before)": runner("legw", np.bool_(False)),
  }
  states = {name: jax.block_until_ready(fn(state)[0]) for name, (fn, state) in cases.items()}
  times = {name: [] for name in cases}
  for _ in range(rounds):
    for name, (fn, _) in cases.items():
      start = time.perf_counter()
      for _ in range(5):
        states[name], metrics = fn(states[name])
      jax.block_until_ready(metrics["loss"])
      times[name].append((time.perf_counter() - start) / 5)
  rows = [f"| study ResNet (LARS), batch {batch_size}, {rounds} rounds of 5 steps | step ms "
          f"| examples/s |", "|---|---:|---:|"]
  for name, t in times.items():
    s = statistics.median(t)
    rows.append(f"| {name} | {s * 1e3:.1f} | {batch_size / s:,.0f} |")
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", choices=["resnet50", "lstm", "pipeline", "watching",
                                         "control_flow"],
                      default=None)
  parser.add_argument("--resnet-batch", type=int, default=8)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args()
  print(f"jax {jax.__version__}, {jax.default_backend()}: {jax.devices()[0].device_kind}\n")
  sections = {"resnet50": lambda: bench_resnet50(args.resnet_batch, args.dtype, args.rounds),
              "lstm": lambda: bench_lstms(args.rounds * 4),
              "pipeline": lambda: bench_mnist1d_pipeline(512, args.rounds * 4),
              "watching": lambda: bench_watching(512, args.rounds * 2, (1, 4, 10)),
              "control_flow": lambda: bench_control_flow(1024, args.rounds * 2)}
  for name, run in sections.items():
    if args.only in (None, name):
      print("\n".join(run()) + "\n", flush=True)


if __name__ == "__main__":
  main()
