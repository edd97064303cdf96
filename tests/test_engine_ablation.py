"""Each of DATE's engine rules switched off (`adaptive(rules_off=...)`): the rule's effect goes,
and nothing else changes. The scenarios are those of test_batch_growth.py and
test_divergence.py, where each rule binds."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import date, train
from dateopt.date import _divergence as divergence
from dateopt.date._noise import init_noise_scale, noise_scale, update_noise_scale
from dateopt.date._progress import ENGINE_RULES, check_rules_off
from dateopt.train.experiment import build_optimizer, engine_rules_off
from dateopt.date import _noise as noise_lib

PARAMS = {"w": jnp.ones(2)}


def _sq_norms(noise, batch, grad_sq=1.0, groups=4):
  """Exact squared norms of a gradient whose |G|² is `grad_sq` and tr Σ = B_noise·|G|²."""
  trace = noise * grad_sq
  small = batch // groups
  return date.GradientSqNorms(grad_sq + trace / small, grad_sq + trace / batch, small, batch)


def _engine(rules_off=(), **kwargs):
  """SGD under the engine at its defaults, with `rules_off`."""
  options = dict(base_batch_size=32, batch_size=512, base_steps=10_000, rules_off=rules_off)
  options.update(kwargs)
  return date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                       optax.constant_schedule(0.1), **options)


def _run(tx, steps, state=None):
  """`steps` of (noise scale, loss or None[, |G|²]), each at the batch the engine asks for;
  the state, and the batches and gains of every step."""
  update = jax.jit(tx.update)
  state = tx.init(PARAMS) if state is None else state
  batches, gains = [], []
  for noise, loss, *grad_sq in steps:
    batches.append(int(date.next_batch_size(state)))
    extra = {} if loss is None else {"value": loss}
    _, state = update(PARAMS, state, PARAMS,
                      grad_sq_norms=_sq_norms(noise, batches[-1], *grad_sq), **extra)
    gains.append(float(state.gain))
  return state, batches, gains


def test_every_rule_has_a_name_and_a_bad_name_is_refused():
  assert len(set(ENGINE_RULES)) == len(ENGINE_RULES) == 10
  assert check_rules_off(()) == frozenset()
  with pytest.raises(ValueError, match=r"rules_off must be one of .*; got 'early_clim'\."):
    check_rules_off(["early_clim"])
  with pytest.raises(ValueError, match="not 'early_climb'"):
    check_rules_off("early_climb")
  with pytest.raises(ValueError, match="not None"):
    check_rules_off(None)
  with pytest.raises(ValueError, match="rules_off"):
    _engine(rules_off=("warmup",))


def test_gain_rise_bound_off_a_jump_in_the_noise_scale_is_taken_at_once():
  """At a fixed batch of 256 the noise scale jumps from 10 to 1,000 at step 30 (the readings
  as read in both runs): the bound lets the gain rise at most `gain_rise` a step; without it
  the gain is the measured one at once, and the two meet once the measured gain rises slower."""
  steps = [(10.0, None)] * 30 + [(1000.0, None)] * 10
  fixed = dict(batch_size=256, warmup_steps=0)
  _, _, bounded = _run(_engine(("winsorized_readings",), **fixed), steps)
  _, _, free = _run(_engine(("winsorized_readings", "gain_rise_bound"), **fixed), steps)
  start = noise_lib.adascale_gain(10.0, 32, 256)  # 1.26
  assert bounded[:30] == free[:30] == pytest.approx([start] * 30, rel=1e-5)
  rise = 1 + date.EngineConfig().gain_rise
  assert bounded[30:34] == pytest.approx([start * rise ** i for i in range(1, 5)], rel=1e-5)
  assert free[30] > start * rise ** 2 and all(f > b for f, b in zip(free[30:34], bounded[30:34]))
  assert free[34:] == bounded[34:]


def test_rising_hold_off_a_rising_loss_is_measured_and_walked_at_its_gain():
  learnt = [(300.0, 2.3)] * 10 + [(300.0, 0.5)] * 100
  rising = [(9000.0, 1.0)] * 6
  held, _, held_gains = _run(_engine(), learnt + rising)
  free, _, free_gains = _run(_engine(("rising_hold",)), learnt + rising)
  assert held_gains[-1] == 1.0 and int(held.watch.holds) >= 2
  # Not reset to 1: the gain follows the rising loss's readings up.
  assert free_gains[-1] > free_gains[len(learnt) - 1] > 5
  assert float(noise_scale(free.noise)) > float(noise_scale(held.noise))  # measured


def test_early_climb_off_the_batch_waits_for_the_run_to_learn():
  """test_batch_growth's plateau: with the early climb the looks at 20, 40, 60 and 80 climb to
  512 before the run has learnt (step ~137); without it the first climb is the look at 140."""
  steps = [(1000.0, 2.3)] * 110 + [(1000.0, 1.9)] * 20 + [(1000.0, 1.4)] * 30
  grown = dict(batch_size=1024, batch_sizes=date.batch_ladder(32, 1024), warmup_steps=50,
               config=date.EngineConfig(noise_batch_exponent=0.0))
  _, early, _ = _run(_engine(**grown), steps)
  _, late, _ = _run(_engine(("early_climb",), **grown), steps)
  assert early[80:140] == [512] * 60
  assert late[:140] == [32] * 140 and late[140:] == [64] * 20


def test_credited_noise_off_is_the_engine_that_reads_each_rung_as_measured():
  grown = dict(batch_size=256, batch_sizes=(32, 64, 128, 256))
  rng = np.random.default_rng(0)
  steps = [(float(n), None, float(g))
           for n, g in zip(rng.uniform(200.0, 2000.0, 70), rng.uniform(0.2, 5.0, 70))]
  off, off_batches, _ = _run(_engine(("credited_noise",), **grown), steps)
  knob, knob_batches, _ = _run(
      _engine(config=date.EngineConfig(noise_batch_exponent=0.0), **grown), steps)
  on, _, _ = _run(_engine(**grown), steps)
  assert off_batches == knob_batches
  jax.tree.map(np.testing.assert_array_equal, off, knob)
  assert float(on.progress) != float(off.progress)  # the rule does bind here


def test_winsorized_readings_off_a_spike_moves_the_ema_by_its_full_weight():
  """Ten readings of tr Σ 100, |G|² 1, then one of tr Σ 10,000 at decay 0.9 (one horizon). The
  EMAs' bias is the same for both and cancels: B_noise = (0.9 · m · 100 + 0.1 · 10,000) /
  (0.9 · m + 0.1) with m = 1 − 0.9¹⁰ as read; clipped, the reading counts as 4 × 100."""
  state = init_noise_scale()
  for _ in range(10):
    state = update_noise_scale(state, _sq_norms(100.0, 512), 0.9)
  spike = _sq_norms(10_000.0, 512)
  m = 1 - 0.9 ** 10
  as_read = (0.9 * m * 100 + 0.1 * 10_000) / (0.9 * m + 0.1)
  clipped = (0.9 * m * 100 + 0.1 * 400) / (0.9 * m + 0.1)
  assert float(noise_scale(update_noise_scale(state, spike, 0.9, clip=4.0, clip_after=10))) == (
      pytest.approx(clipped, rel=1e-4))
  assert float(noise_scale(update_noise_scale(state, spike, 0.9))) == (
      pytest.approx(as_read, rel=1e-4))
  _, _, gains_on = _run(_engine(), [(100.0, None)] * 10 + [(10_000.0, None)])
  _, _, gains_off = _run(_engine(("winsorized_readings",)),
                         [(100.0, None)] * 10 + [(10_000.0, None)])
  assert gains_off[:10] == pytest.approx(gains_on[:10]) and gains_off[-1] > gains_on[-1]


def test_gradient_jump_skip_off_an_exploding_gradient_is_applied():
  tx_on = _engine()
  tx_off = _engine(("gradient_jump_skip",))
  results = []
  for tx in (tx_on, tx_off):
    state, _, _ = _run(tx, [(100.0, 2.0)] * 12)
    big = _sq_norms(100.0, 512, grad_sq=1e5)
    _, state = jax.jit(tx.update)(PARAMS, state, PARAMS, grad_sq_norms=big, value=2.0)
    results.append(state)
  assert int(results[0].watch.gradient_jumps) == 1 and int(results[0].count) == 12
  assert int(results[1].watch.gradient_jumps) == 0 and int(results[1].count) == 13


@pytest.mark.parametrize("rule, losses, progress", [
    ("relapse", [2.3] * 10 + [1.5] * 100 + [2.3] * 60, lambda step: 0.1),
    ("blow_up", [2.3] * 10 + [9.0] * 20, lambda step: 0.1),
    ("no_learning", [2.3] * 150, lambda step: step / 100),
])
def test_a_divergence_rule_off_never_declares_the_run_diverged(rule, losses, progress):
  update = jax.jit(divergence.update_watch, static_argnames=("config", "rules_off"))
  flagged = {}
  others = frozenset(divergence.DIVERGENCE_RULES) - {rule}  # off: this rule alone still fires
  for rules_off in (frozenset(), frozenset({rule}), others):
    watch, flagged[rules_off] = divergence.init_watch(), 0
    for step, loss in enumerate(losses):
      watch = update(watch, jnp.float32(loss), step=jnp.int32(step),
                     progress_fraction=jnp.float32(progress(step)),
                     config=date.EngineConfig(),
                     rules_off=rules_off)
      flagged[rules_off] += int(watch.diverged_steps > 0)
  assert flagged[frozenset()] > 0 and flagged[frozenset({rule})] == 0
  assert flagged[others] == flagged[frozenset()]


def test_the_trainer_reads_the_rules_off_and_refuses_them_where_no_engine_runs():
  config = train.default_config()
  config.engine_rules_off = " early_climb, rising_hold "
  assert engine_rules_off(config) == ("early_climb", "rising_hold")
  config.engine_rules_off = "early_climb,warmup"
  with pytest.raises(ValueError, match=r"config.engine_rules_off: unknown rule 'warmup'"):
    engine_rules_off(config)
  static = date.Recipe(batch_size=128, num_examples=1000, num_epochs=1, learning_rate=0.1,
                       optimizer="sgd")
  config.engine_rules_off = "early_climb"
  with pytest.raises(ValueError, match="plans no adaptive recipe"):
    build_optimizer(config, static)
