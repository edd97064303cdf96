"""Schedules and scaling rules against hand arithmetic and REFERENCE.md numbers."""

import doctest
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dateopt import schedules

IMAGENET = 1_281_167


# ---- scaling rules ---------------------------------------------------------


@pytest.mark.parametrize("rule, expected", [("linear", 3.2), ("sqrt", 0.1 * math.sqrt(32)),
                                            ("none", 0.1)])
def test_scale_learning_rate(rule, expected):
  assert schedules.scale_learning_rate(0.1, 256, 8192, rule) == pytest.approx(expected)


def test_scale_learning_rate_bad_input_names_the_field():
  with pytest.raises(ValueError, match="rule"):
    schedules.scale_learning_rate(0.1, 256, 512, "cubic")
  with pytest.raises(ValueError, match="batch_size"):
    schedules.scale_learning_rate(0.1, 256, 0, "linear")
  with pytest.raises(ValueError, match="base_batch_size"):
    schedules.scale_learning_rate(0.1, -1, 256, "linear")


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


# ---- building blocks -------------------------------------------------------


def test_linear_warmup_from_zero_and_from_a_start_value():
  from_zero = schedules.linear_warmup(2.0, 10)
  from_start = schedules.linear_warmup(2.0, 10, init_value=0.5)
  assert float(from_zero(0)) == 0.0
  assert float(from_zero(5)) == pytest.approx(1.0)
  assert float(from_zero(10)) == pytest.approx(2.0)
  assert float(from_start(0)) == pytest.approx(0.5)
  assert float(from_start(4)) == pytest.approx(0.5 + 1.5 * 0.4)


def test_decays_against_hand_arithmetic():
  poly = schedules.polynomial_decay(1.0, 10, power=2.0, end_value=0.1)
  assert float(poly(0)) == pytest.approx(1.0)
  assert float(poly(4)) == pytest.approx(0.1 + 0.9 * 0.6 ** 2)
  assert float(poly(25)) == pytest.approx(0.1)  # held at the end value
  cosine = schedules.cosine_decay(2.0, 100, end_value=0.0)
  assert float(cosine(25)) == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi / 4)),
                                            rel=1e-6)
  expo = schedules.exponential_decay(1.0, 10, 0.5)
  assert float(expo(5)) == pytest.approx(0.5 ** 0.5, rel=1e-6)
  stairs = schedules.exponential_decay(1.0, 10, 0.5, staircase=True)
  assert float(stairs(15)) == pytest.approx(0.5)
  multi = schedules.multistep_decay(1.0, [10, 20], rate=0.1)
  assert [float(multi(t)) for t in (9, 10, 19, 20)] == pytest.approx(
      [1.0, 0.1, 0.1, 0.01])
  assert float(schedules.constant(0.3)(12345)) == pytest.approx(0.3)


def _mlperf_reference(t, peak, warmup, total, power=2.0, end=1e-4):
  """REFERENCE.md §3, written out independently in plain Python."""
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


DECAY_ARGS = {
    "polynomial": {"power": 2.0, "end_value": 1e-4},
    "cosine": {"end_value": 0.0},
    "exponential": {"rate": 0.5, "transition_steps": 500},
    "multistep": {"boundaries": (300, 600), "rate": 0.1},
    "constant": {},
}


@pytest.mark.parametrize("decay", schedules.DECAYS)
@pytest.mark.parametrize("init", [0.0, 0.5])
def test_continuous_at_the_warmup_boundary(decay, init):
  peak, warmup, total = 4.0, 200, 1000
  s = schedules.warmup_decay_schedule(peak, warmup, total, decay,
                                      warmup_init_value=init, **DECAY_ARGS[decay])
  before, at, after = float(s(warmup - 1)), float(s(warmup)), float(s(warmup + 1))
  ramp_step = (peak - init) / warmup
  assert at == pytest.approx(peak, rel=1e-6)
  assert before == pytest.approx(peak - ramp_step, rel=1e-6)
  assert abs(after - at) <= ramp_step  # no jump on either side


@pytest.mark.parametrize("decay", schedules.DECAYS)
def test_schedules_are_jit_safe(decay):
  s = schedules.warmup_decay_schedule(1.0, 100, 1000, decay, **DECAY_ARGS[decay])
  steps = jnp.arange(0, 1000, 37)
  eager = np.array([float(s(int(t))) for t in steps])
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(s))(steps)), eager, rtol=1e-5,
                             atol=1e-7)


def test_epoch_schedule_places_milestones_at_epochs():
  s = schedules.epoch_schedule(0.4, 5, 90, IMAGENET, 1024, "multistep",
                               decay_epochs=(30, 60, 80))
  per_epoch = 1251
  assert float(s(30 * per_epoch - 1)) == pytest.approx(0.4)
  assert float(s(30 * per_epoch)) == pytest.approx(0.04)
  assert float(s(80 * per_epoch)) == pytest.approx(0.4e-3)


# ---- LEGW and Goyal ---------------------------------------------------------

# REFERENCE.md §3: batch -> (peak LR, warmup epochs) from B0 = 1K, 2^2.5, 0.3125.
LEGW_TABLE = {512: (4.0, 0.15625), 1024: (5.657, 0.3125), 2048: (8.0, 0.625),
              4096: (11.31, 1.25), 8192: (16.0, 2.5), 16384: (22.63, 5.0),
              32768: (32.0, 10.0)}


@pytest.mark.parametrize("batch", sorted(LEGW_TABLE))
def test_legw_schedule_reproduces_the_reference_table(batch):
  peak, warmup_epochs = LEGW_TABLE[batch]
  assert schedules.legw_warmup_epochs(0.3125, 1024, batch) == warmup_epochs
  s = schedules.legw_schedule(2 ** 2.5, 1024, batch, 0.3125, 90, IMAGENET)
  warmup_steps = schedules.epochs_to_steps(warmup_epochs, IMAGENET, batch)
  assert float(s(warmup_steps)) == pytest.approx(peak, rel=1e-3)  # table rounds
  assert float(s(warmup_steps - 1)) < float(s(warmup_steps))


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


def test_legw_warmup_ends_where_the_schedule_peaks():
  for batch in (2048, 16384):
    s = schedules.legw_schedule(0.1, 1024, batch, 0.5, 20, 1024 * 64)
    w = schedules.epochs_to_steps(0.5 * batch / 1024, 1024 * 64, batch)
    assert w == 32  # 0.5 epochs of 64 steps at batch 1024
    assert float(s(w // 2)) == pytest.approx(0.5 * 0.1 * math.sqrt(batch / 1024))


def test_goyal_schedule():
  s = schedules.goyal_schedule(0.1, 256, 8192, 90, IMAGENET)
  per_epoch = 156
  assert float(s(0)) == pytest.approx(0.1)  # warmup from the small-batch LR
  assert float(s(5 * per_epoch)) == pytest.approx(3.2)
  assert float(s(30 * per_epoch)) == pytest.approx(0.32)
  assert float(s(60 * per_epoch)) == pytest.approx(0.032)
  from_zero = schedules.goyal_schedule(0.1, 256, 8192, 90, IMAGENET, warmup_init_value=0.0)
  assert float(from_zero(0)) == 0.0


# ---- bad input ----------------------------------------------------------------


def test_bad_schedule_arguments_name_the_field():
  with pytest.raises(ValueError, match="warmup_steps"):
    schedules.warmup_decay_schedule(1.0, 100, 100, "cosine")
  with pytest.raises(ValueError, match="warmup_epochs"):
    schedules.epoch_schedule(1.0, 90, 90, IMAGENET, 1024)
  with pytest.raises(ValueError, match="decay"):
    schedules.warmup_decay_schedule(1.0, 10, 100, "linear-ish")
  with pytest.raises(ValueError, match=r"boundaries\[0\]"):
    schedules.warmup_decay_schedule(1.0, 10, 100, "multistep", boundaries=(5,))
  with pytest.raises(ValueError, match="batch_size"):
    schedules.legw_schedule(1.0, 1024, 0, 1.0, 90, IMAGENET)


def test_docstring_examples():
  result = doctest.testmod(schedules, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 10 and result.failed == 0
