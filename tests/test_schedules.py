"""Schedules and scaling rules against hand arithmetic and docs/papers.md numbers."""

import doctest
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dateopt import date, epochs, schedules

IMAGENET = 1_281_167
AT_1024 = {"num_examples": IMAGENET, "batch_size": 1024}  # ImageNet epochs at batch 1024


# ---- scaling rules ---------------------------------------------------------


@pytest.mark.parametrize("rule, expected", [("linear", 3.2), ("sqrt", 0.1 * math.sqrt(32)),
                                            ("none", 0.1)])
def test_scale_learning_rate(rule, expected):
  assert schedules.scale_learning_rate(0.1, 256, 8192, rule=rule) == pytest.approx(expected)


def test_scale_learning_rate_bad_input_names_the_field():
  with pytest.raises(ValueError, match="rule"):
    schedules.scale_learning_rate(0.1, 256, 512, rule="cubic")
  with pytest.raises(ValueError, match="batch_size"):
    schedules.scale_learning_rate(0.1, 256, 0, rule="linear")
  with pytest.raises(ValueError, match="base_batch_size"):
    schedules.scale_learning_rate(0.1, -1, 256, rule="linear")


# ---- epochs and steps ------------------------------------------------------


def test_steps_per_epoch_drop_and_keep():
  # 1,281,167 / 1024 = 1251.14: floor when dropping, ceil when keeping.
  assert schedules.steps_per_epoch(IMAGENET, 1024, drop_remainder=True) == 1251
  assert schedules.steps_per_epoch(IMAGENET, 1024, drop_remainder=False) == 1252
  assert schedules.steps_per_epoch(4096, 1024, drop_remainder=False) == 4


def test_epochs_to_steps_rounds_fractional_epochs():
  assert schedules.epochs_to_steps(0.3125, IMAGENET, 1024) == 391  # 390.94
  assert schedules.epochs_to_steps(90, IMAGENET, 1024) == 90 * 1251
  assert schedules.epochs_to_steps(0.5, 10, 5) == 1  # 0.5 * 2 steps


def test_batch_larger_than_dataset_when_dropping_raises():
  with pytest.raises(ValueError, match="batch_size"):
    schedules.steps_per_epoch(100, 128, drop_remainder=True)
  assert schedules.steps_per_epoch(100, 128, drop_remainder=False) == 1


# ---- warmup + decay, against hand arithmetic ---------------------------------


def _reference(t, decay, peak, warmup, total, init=0.0, power=2.0, end=0.0,
               boundaries=(), rate=0.1, period=1, staircase=False):
  """The documented formulas, written out independently in plain Python."""
  if t < warmup:
    return init + (peak - init) * t / warmup
  u, span = t - warmup, total - warmup  # steps since the warmup, decay length
  if decay == "polynomial":  # MLPerf: the denominator is span + 1
    return end + (peak - end) * (1 - min(u, span + 1) / (span + 1)) ** power
  if decay == "cosine":
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * min(u, span) / span))
  if decay == "exponential":
    exponent = math.floor(u / period) if staircase else u / period
    return max(peak * rate ** exponent, end)
  if decay == "multistep":
    return peak * rate ** sum(t >= b for b in boundaries)
  return peak  # constant


DECAY_ARGS = {
    "polynomial": {"power": 2.0, "end_value": 1e-4},
    "cosine": {"end_value": 0.05},
    "exponential": {"decay_rate": 0.5, "transition_steps": 500, "end_value": 0.3},
    "multistep": {"boundaries": (300, 600), "decay_rate": 0.1},
    "constant": {},
}


def _reference_kwargs(kwargs):
  names = {"power": "power", "end_value": "end", "boundaries": "boundaries",
           "decay_rate": "rate", "transition_steps": "period", "staircase": "staircase"}
  return {names[k]: v for k, v in kwargs.items()}


def _evaluate(schedule, steps):
  return np.asarray(jax.jit(jax.vmap(schedule))(jnp.asarray(steps)))


@pytest.mark.parametrize("decay", schedules.DECAYS)
@pytest.mark.parametrize("init", [0.0, 0.5])
def test_every_decay_against_hand_arithmetic(decay, init):
  peak, warmup, total = 4.0, 200, 1000
  s = schedules.warmup_decay_schedule(peak, warmup, total, decay=decay, init_value=init,
                                      **DECAY_ARGS[decay])
  steps = np.concatenate([np.arange(0, total + 50, 7), [warmup - 1, warmup, total]])
  want = [_reference(int(t), decay, peak, warmup, total, init,
                     **_reference_kwargs(DECAY_ARGS[decay])) for t in steps]
  np.testing.assert_allclose(_evaluate(s, steps), want, rtol=2e-5, atol=1e-6)
  assert float(s(0)) == pytest.approx(init)


@pytest.mark.parametrize("decay", schedules.DECAYS)
def test_no_warmup_starts_at_the_peak(decay):
  kwargs = {**DECAY_ARGS[decay], "boundaries": (0, 250)} if decay == "multistep" else (
      DECAY_ARGS[decay])
  s = schedules.warmup_decay_schedule(2.0, 0, 500, decay=decay, **kwargs)
  steps = np.arange(0, 520, 13)
  want = [_reference(int(t), decay, 2.0, 0, 500, **_reference_kwargs(kwargs))
          for t in steps]
  np.testing.assert_allclose(_evaluate(s, steps), want, rtol=2e-5, atol=1e-6)
  assert float(s(0)) == pytest.approx(0.2 if decay == "multistep" else 2.0)


def test_exponential_staircase_and_floor():
  kwargs = {"decay_rate": 0.5, "transition_steps": 10, "staircase": True,
            "end_value": 0.1}
  s = schedules.warmup_decay_schedule(1.0, 5, 100, decay="exponential", **kwargs)
  # Staircase: 1.0 for 10 steps after the warmup, then 0.5, ...; floored at 0.1.
  assert [float(s(t)) for t in (14, 15, 24, 25, 99)] == pytest.approx(
      [1.0, 0.5, 0.5, 0.25, 0.1])
  steps = np.arange(0, 100)
  want = [_reference(int(t), "exponential", 1.0, 5, 100, **_reference_kwargs(kwargs))
          for t in steps]
  np.testing.assert_allclose(_evaluate(s, steps), want, rtol=1e-6)


def test_exponential_without_decay_stays_at_the_peak():
  # decay_rate = 1 keeps the peak; end_value stays a floor, never a ceiling.
  s = schedules.warmup_decay_schedule(1.0, 10, 100, decay="exponential", decay_rate=1.0,
                                      end_value=0.1)
  assert [float(s(t)) for t in (10, 50, 99)] == pytest.approx([1.0, 1.0, 1.0])


def test_repeated_multistep_boundaries_multiply():
  s = schedules.warmup_decay_schedule(1.0, 10, 100, decay="multistep",
                                      boundaries=(40, 40, 70), decay_rate=0.5)
  assert [float(s(t)) for t in (39, 40, 69, 70)] == pytest.approx(
      [1.0, 0.25, 0.25, 0.125])


def _mlperf_reference(t, peak, warmup, total, power=2.0, end=1e-4):
  """docs/papers.md §3, written out independently in plain Python."""
  if t < warmup:
    return peak * t / warmup
  return end + (peak - end) * (1 - (t - warmup) / (total - warmup + 1)) ** power


def test_warmup_polynomial_decay_is_the_mlperf_formula():
  # MLPerf batch 8,192: 5 warmup epochs and 42 epochs of 156 steps.
  warmup, total = 5 * 156, 42 * 156
  schedule = jax.jit(schedules.warmup_polynomial_decay(17.0, warmup, total))
  steps = np.arange(0, total + 1, 7)
  got = np.asarray(jax.vmap(schedule)(jnp.asarray(steps)))
  want = np.array([_mlperf_reference(t, 17.0, warmup, total) for t in steps])
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
  # The "+1" of the MLPerf denominator: the last step sits just above 1e-4.
  assert float(schedule(total)) == pytest.approx(1e-4 + 17.0 / (total - warmup + 1) ** 2,
                                                 rel=1e-4)


@pytest.mark.parametrize("decay", schedules.DECAYS)
@pytest.mark.parametrize("init", [0.0, 0.5])
def test_continuous_at_the_warmup_boundary(decay, init):
  peak, warmup, total = 4.0, 200, 1000
  s = schedules.warmup_decay_schedule(peak, warmup, total, decay=decay,
                                      init_value=init, **DECAY_ARGS[decay])
  before, at, after = float(s(warmup - 1)), float(s(warmup)), float(s(warmup + 1))
  ramp_step = (peak - init) / warmup
  assert at == pytest.approx(peak, rel=1e-6)
  assert before == pytest.approx(peak - ramp_step, rel=1e-6)
  assert abs(after - at) <= ramp_step  # no jump on either side


@pytest.mark.parametrize("decay", schedules.DECAYS)
def test_schedules_are_jit_safe(decay):
  s = schedules.warmup_decay_schedule(1.0, 100, 1000, decay=decay, **DECAY_ARGS[decay])
  steps = jnp.arange(0, 1000, 37)
  eager = np.array([float(s(int(t))) for t in steps])
  np.testing.assert_allclose(_evaluate(s, steps), eager, rtol=1e-5, atol=1e-7)


# ---- schedules in epochs -----------------------------------------------------


def test_epoch_schedule_places_milestones_at_epochs():
  s = schedules.epoch_schedule(0.4, 5, 90, **AT_1024, decay="multistep",
                               decay_epochs=(30, 60, 80))
  per_epoch = 1251
  assert float(s(5 * per_epoch // 2)) == pytest.approx(0.2, rel=1e-3)  # mid-warmup
  assert float(s(30 * per_epoch - 1)) == pytest.approx(0.4)
  assert float(s(30 * per_epoch)) == pytest.approx(0.04)
  assert float(s(80 * per_epoch)) == pytest.approx(0.4e-3)


@pytest.mark.parametrize("decay", ["polynomial", "cosine", "exponential"])
def test_epoch_schedule_converts_every_length_with_epochs_to_steps(decay):
  # 100,000 examples at batch 300 (333.3 steps, 333 kept): 2.25 warmup epochs
  # (749.25 steps), 12 epochs, exponential period 1.25 epochs (416.25 steps).
  warmup, total, period = 749, 12 * 333, 416
  s = schedules.epoch_schedule(0.8, 2.25, 12, num_examples=100_000, batch_size=300,
                               decay=decay, init_value=0.01, power=1.5, end_value=0.02,
                               decay_rate=0.7, decay_every_epochs=1.25, staircase=True)
  steps = np.arange(0, total + 1, 11)
  want = [_reference(int(t), decay, 0.8, warmup, total, 0.01, power=1.5, end=0.02,
                     rate=0.7, period=period, staircase=True) for t in steps]
  np.testing.assert_allclose(_evaluate(s, steps), want, rtol=2e-5, atol=1e-6)


def test_epoch_schedule_keeps_the_last_partial_batch_when_asked():
  # 1000 examples at batch 300: 3 steps per epoch dropping, 4 keeping.
  small = {"num_examples": 1000, "batch_size": 300, "decay": "constant"}
  dropped = schedules.epoch_schedule(1.0, 1, 10, **small)
  kept = schedules.epoch_schedule(1.0, 1, 10, **small, drop_remainder=False)
  assert float(dropped(3)) == pytest.approx(1.0)
  assert float(kept(3)) == pytest.approx(0.75)


# ---- LEGW warmup length (the schedule itself: dateopt.date.plan) ------------

# docs/papers.md §3: batch -> warmup epochs from B0 = 1K, 0.3125 epochs.
LEGW_WARMUP = {512: 0.15625, 1024: 0.3125, 2048: 0.625, 4096: 1.25, 8192: 2.5,
               16384: 5.0, 32768: 10.0}


@pytest.mark.parametrize("batch", sorted(LEGW_WARMUP))
def test_legw_warmup_epochs_reproduce_the_reference_table(batch):
  assert schedules.legw_warmup_epochs(0.3125, 1024, batch) == LEGW_WARMUP[batch]


def test_legw_warmup_steps_are_the_same_for_every_k():
  # A data set every batch divides: warmup steps are exactly w0·N/B0 for all k.
  n = 1024 * 64 * 20
  steps = {schedules.epochs_to_steps(schedules.legw_warmup_epochs(0.3125, 1024, b), n, b)
           for b in (1024, 2048, 4096, 8192, 16384, 32768, 65536)}
  assert steps == {round(0.3125 * n / 1024)}
  # ImageNet with a dropped remainder: floor(N/B) rounding moves it by <= 1 step.
  imagenet = [schedules.epochs_to_steps(schedules.legw_warmup_epochs(0.3125, 1024, b),
                                        IMAGENET, b) for b in (1024, 4096, 32768)]
  assert max(imagenet) - min(imagenet) <= 1


# ---- bad input ----------------------------------------------------------------


@pytest.mark.parametrize("field, build", [
    ("total_steps", lambda: schedules.warmup_decay_schedule(1.0, 0, 0)),
    ("warmup_steps", lambda: schedules.warmup_decay_schedule(1.0, 100, 100, decay="cosine")),
    ("warmup_steps", lambda: schedules.warmup_decay_schedule(1.0, -1, 100)),
    ("decay", lambda: schedules.warmup_decay_schedule(1.0, 10, 100, decay="linear-ish")),
    (r"boundaries\[0\]", lambda: schedules.warmup_decay_schedule(
        1.0, 10, 100, decay="multistep", boundaries=(5,))),
    ("power", lambda: schedules.warmup_decay_schedule(1.0, 10, 100, decay="polynomial",
                                                      power=0.0)),
    ("decay_rate", lambda: schedules.warmup_decay_schedule(1.0, 10, 100, decay="exponential",
                                                           decay_rate=1.5)),
    ("decay_rate", lambda: schedules.warmup_decay_schedule(1.0, 10, 100, decay="multistep",
                                                           decay_rate=0.0)),
    ("transition_steps", lambda: schedules.warmup_decay_schedule(
        1.0, 10, 100, decay="exponential", transition_steps=0)),
    ("power", lambda: schedules.warmup_polynomial_decay(1.0, 10, 100, power=-1.0)),
    ("warmup_epochs", lambda: schedules.epoch_schedule(1.0, 90, 90, **AT_1024)),
    ("num_epochs", lambda: schedules.epoch_schedule(1.0, 0, 0, **AT_1024)),
    (r"decay_epochs\[1\]", lambda: schedules.epoch_schedule(
        1.0, 5, 90, **AT_1024, decay="multistep", decay_epochs=(30, 95))),
    ("decay_every_epochs", lambda: schedules.epoch_schedule(
        1.0, 5, 90, **AT_1024, decay="exponential", decay_every_epochs=-1.0)),
    ("batch_size", lambda: schedules.epoch_schedule(1.0, 5, 90, num_examples=IMAGENET,
                                                    batch_size=0)),
    ("batch_size", lambda: schedules.legw_warmup_epochs(1.0, 1024, 0)),
])
def test_bad_schedule_arguments_name_the_field(field, build):
  with pytest.raises(ValueError, match=field):
    build()


@pytest.mark.parametrize("module", [schedules, epochs])
def test_docstring_examples(module):
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.attempted >= 2 and result.failed == 0


def test_an_end_value_above_the_peak_is_refused():
  with pytest.raises(ValueError, match=r"end_value must be in \[0, 0.1\]"):
    schedules.warmup_decay_schedule(0.1, 10, 100, decay="cosine", end_value=50.0)
  with pytest.raises(ValueError, match="end_value"):
    date.Recipe(batch_size=32, num_examples=8000, num_epochs=3, learning_rate=0.1,
                decay="polynomial", end_value=0.5)
  # Equal to the peak is a constant tail, not a climb.
  flat = schedules.warmup_decay_schedule(0.1, 10, 100, decay="cosine", end_value=0.1)
  assert float(flat(50)) == pytest.approx(0.1)
