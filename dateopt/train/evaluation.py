"""Evaluation over the whole eval split, data-parallel like the train step.

Example:
  >>> eval_fn = make_eval_fn(exp)
  >>> evaluate(exp, state, eval_fn)["accuracy"]
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from dateopt.train import parallel
from dateopt.train.experiment import Experiment
from dateopt.train.steps import TrainState, eval_step


def make_eval_fn(exp: Experiment):
  """The jitted `eval_step` for `exp`'s model, as `evaluate` takes it."""
  return jax.jit(functools.partial(eval_step, model=exp.model,
                                   num_classes=exp.dataset.num_classes),
                 out_shardings=parallel.replicated(exp.mesh))


def evaluate(exp: Experiment, state: TrainState, step_fn) -> dict[str, float]:
  """Accuracy and loss over the whole eval split (padding masked out)."""
  totals = None
  for batch in exp.dataset.eval_batches(exp.eval_batch_size, process_index=jax.process_index(),
                                        process_count=jax.process_count()):
    sums = step_fn(state, parallel.global_batch(batch, exp.mesh))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = {k: float(v) for k, v in parallel.to_host(totals).items()}  # one transfer
  count = max(totals["count"], 1.0)
  loss = totals["loss_sum"] / count
  metrics = {"loss": loss, "accuracy": totals["correct_sum"] / count}
  if exp.dataset.task == "language_model":
    metrics.update(language_model_metrics(loss, exp.dataset.metadata.get("token_unit")))
  return metrics


def language_model_metrics(loss: float, token_unit: str | None) -> dict[str, float]:
  """Perplexity, and bits per byte when a token is one byte, from the mean loss in nats.

  Bits per byte is the loss in base 2 per byte of text (Graves 2013): a
  byte-level model's nats per token / ln 2. It compares across tokenisers;
  perplexity compares only models with the same vocabulary.

  Example:
    >>> round(language_model_metrics(math.log(2.0), "byte")["bits_per_byte"], 6)
    1.0
  """
  metrics = {"perplexity": float(np.exp(min(loss, 50.0)))}
  if token_unit == "byte":
    metrics["bits_per_byte"] = loss / math.log(2.0)
  return metrics
