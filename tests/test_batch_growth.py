"""DATE grows the batch: the ladder, the rule, the engine, the planner, the data stream, the trainer.

References: hand arithmetic for the ladder and the rule, `adascale_gain` and
`predicted_steps` (the closed form) for the engine's gain and the planner's
budget, the epoch permutations for the data stream, the monitoring events of
jax for the compilations, and an uninterrupted run for a resumed one.
"""

import json
import logging
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import date
from dateopt.data import get_dataset
from dateopt.data.base import epoch_permutation
from dateopt.date import _divergence as divergence_lib
from dateopt.date import _noise as noise_lib
from dateopt.date import _planner as planner_lib
from dateopt.date import _progress as progress_lib

import tiny_config

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow


# --- The ladder and the rule ---------------------------------------------------------------

def test_ladder_doubles_from_the_baseline_to_the_max_in_multiples_of_the_quantum():
  assert date.batch_ladder(32, 2048) == (32, 64, 128, 256, 512, 1024, 2048)
  assert date.batch_ladder(32, 32) == (32,)
  assert date.batch_ladder(32, 96) == (32, 64, 96)          # the max is the last rung
  assert date.batch_ladder(12, 96, multiple_of=8) == (16, 32, 64, 96)
  assert date.batch_ladder(1, 64, multiple_of=16) == (16, 32, 64)


@pytest.mark.parametrize("base, top, quantum, match", [
    (32, 100, 8, "max_batch_size=100 must be a multiple of 8"),
    (64, 32, 1, "max_batch_size"),
    (0, 32, 1, "base_batch_size"),
])
def test_ladder_refuses_what_the_layout_cannot_run(base, top, quantum, match):
  with pytest.raises(ValueError, match=match):
    date.batch_ladder(base, top, multiple_of=quantum)


def test_growth_rule_by_hand():
  # From 64 to 128 with B_max = 256 and a step priced at half of it (λ = 128 examples).
  rule = lambda count, noise: bool(progress_lib.wants_next_rung(
      count, noise, batch_size=64, next_batch_size=128, max_batch_size=256, warmup_steps=30,
      step_price=0.5, growth_interval=20))
  assert rule(40, 64.0)                   # past the warmup, on the interval, 64·128 ≤ 128·64
  assert not rule(40, 63.9)               # 64·128 > 128·63.9
  assert not rule(41, 1e9)                # not on the interval
  assert not rule(20, 1e9)                # inside the warmup
  assert not rule(40, float("nan"))       # nothing measured yet
  assert rule(40, float("inf"))           # the signal estimate is <= 0: pure noise


@pytest.mark.parametrize("step_price", [0.25, 1.0, 4.0])
def test_growth_rule_stops_at_the_rung_that_makes_progress_cheapest(step_price):
  """McCandlish's trade-off, brute force: a baseline step costs (B + λ)/r(B) at batch B."""
  ladder = date.batch_ladder(32, 4096)
  price = step_price * ladder[-1]
  for noise in np.geomspace(5.0, 50_000.0, 60):
    climbed = ladder[0]
    for upper in ladder[1:]:
      if not progress_lib.wants_next_rung(
          100, noise, batch_size=climbed, next_batch_size=upper, max_batch_size=ladder[-1],
          warmup_steps=0, step_price=step_price, growth_interval=20):
        break
      climbed = upper
    cost = {b: (b + price) / noise_lib.adascale_gain(noise, 32, b) for b in ladder}
    assert cost[climbed] == pytest.approx(min(cost.values()), rel=1e-12), noise


# --- The engine ------------------------------------------------------------------------------

def _sq_norms(noise_scale, batch, groups=4, grad_sq=1.0):
  """Exact squared norms of a gradient whose |G|² is `grad_sq` and tr Σ = B_noise·|G|²."""
  trace = noise_scale * grad_sq
  small = batch // groups
  return date.GradientSqNorms(grad_sq + trace / small, grad_sq + trace / batch, small, batch)


def _engine(ladder, warmup=0, step_price=1.0, noise_batch_exponent=0.0):
  """A growing engine; by default (α = 0) it reads each rung's noise scale as measured."""
  return date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                       optax.constant_schedule(0.1), base_batch_size=ladder[0],
                       batch_size=ladder[-1], base_steps=10_000, warmup_steps=warmup,
                       batch_sizes=ladder,
                       config=date.EngineConfig(step_price=step_price,
                                                noise_batch_exponent=noise_batch_exponent))


@pytest.mark.parametrize("exponent", [0.0, date.EngineConfig().noise_batch_exponent])
def test_engine_climbs_one_rung_per_interval_and_credits_the_gain_of_the_step_batch(exponent):
  tx = _engine((32, 64, 128, 256), warmup=5, noise_batch_exponent=exponent)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  update = jax.jit(tx.update, static_argnames=())
  batches, progress = [], 0.0
  for _ in range(70):
    batch = int(date.next_batch_size(state))
    batches.append(batch)
    _, state = update({"w": jnp.ones(3)}, state, params, grad_sq_norms=_sq_norms(1000.0, batch))
    ramp = min(1.0, len(batches) / 5)
    credited = 1000.0 * (256 / batch) ** exponent  # rung B reads B_noise × (B_max/B)^α
    progress += ramp * noise_lib.adascale_gain(credited, 32, batch)
    np.testing.assert_allclose(float(state.progress), progress, rtol=1e-5)
  # B_noise = 1000 ≥ every rung: one rung up at steps 20, 40, 60, never two at once.
  assert batches[:20] == [32] * 20 and batches[20:40] == [64] * 20
  assert batches[40:60] == [128] * 20 and batches[60:] == [256] * 10


def test_engine_stops_below_the_noise_scale_and_never_shrinks():
  tx = _engine((32, 64, 128, 256), step_price=0.25)  # λ = 64 examples
  params, update = {"w": jnp.ones(2)}, jax.jit(tx.update)
  state = tx.init(params)
  seen = []
  for step in range(360):
    batch = int(date.next_batch_size(state))
    seen.append(batch)
    noise = 100.0 if step < 60 else 10.0    # 32·64 ≤ 64·100 < 64·128, then 32·64 > 64·10
    _, state = update({"w": jnp.ones(2)}, state, params, grad_sq_norms=_sq_norms(noise, batch))
  assert max(seen) == 64 and seen[-1] == 64 and seen == sorted(seen)
  assert float(noise_lib.noise_scale(state.noise)) < 32  # the reading has fallen below 32·64/λ


def test_the_credit_climbs_where_the_measured_reading_would_not():
  """B_noise 100 at λ = 64: as measured the run stops at 64 (64·128 > 64·100); credited at
  α = 0.2 it reads 100·(256/64)^0.2 = 132 there and climbs (64·128 ≤ 64·132), then at 128
  it reads 115 and stops (128·256 > 64·115; the gain's credit: the test above)."""
  def run(exponent):
    tx = _engine((32, 64, 128, 256), step_price=0.25, noise_batch_exponent=exponent)
    params, update = {"w": jnp.ones(2)}, jax.jit(tx.update)
    state, seen = tx.init(params), []
    for _ in range(100):
      seen.append(int(date.next_batch_size(state)))
      _, state = update({"w": jnp.ones(2)}, state, params,
                        grad_sq_norms=_sq_norms(100.0, seen[-1]))
    return seen
  assert max(run(0.0)) == 64
  assert max(run(0.2)) == 128
  with pytest.raises(ValueError, match="noise_batch_exponent"):
    _engine((32, 64), noise_batch_exponent=1.5)


def test_a_loop_that_follows_late_is_credited_the_batch_it_really_had():
  tx = _engine((32, 64))
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  for _ in range(20):  # grows after step 20; the loop stays at 32
    _, state = tx.update({"w": jnp.ones(2)}, state, params, grad_sq_norms=_sq_norms(500.0, 32))
  assert int(date.next_batch_size(state)) == 64
  before = float(state.progress)
  _, state = tx.update({"w": jnp.ones(2)}, state, params, grad_sq_norms=_sq_norms(500.0, 32))
  assert float(state.progress) - before == pytest.approx(1.0)  # gain of 32 over 32


def test_before_the_run_has_learnt_the_batch_climbs_to_the_early_rungs():
  """A plateau's measured noise scale is high: the batch climbs from its first look to
  EARLY_RUNGS × B0 (512), at AdaScale's gain for each rung, and the rest waits for the run to
  learn."""
  assert date.EngineConfig().early_rungs * 32 == 512
  tx = _engine(date.batch_ladder(32, 1024), warmup=50)
  params = {"w": jnp.ones(2)}
  state, update, seen, gains = tx.init(params), jax.jit(tx.update), [], []
  losses = [2.3] * 110 + [1.9] * 20 + [1.4] * 30
  for loss in losses:
    batch = int(date.next_batch_size(state))
    seen.append(batch)
    _, state = update({"w": jnp.ones(2)}, state, params, grad_sq_norms=_sq_norms(1000.0, batch),
                      value=loss)
    gains.append(float(state.gain))
  # Looks at steps 20, 40, 60, 80 (inside the 50-step warmup too): one rung each, up to 512;
  # those at 100 and 120 wait.
  assert seen[:80] == [32] * 20 + [64] * 20 + [128] * 20 + [256] * 20
  assert seen[80:140] == [512] * 60
  # The watch's mean (decay 0.95) is 2.04 after the 1.9s and reaches 0.8 · 2.3 = 1.84 at the
  # 8th 1.4 (1.4 + 0.64 · 0.95⁸ = 1.82): the look at step 140 climbs to 1,024.
  assert seen[140:] == [1024] * 20
  # B_noise 1,000 at every rung: the gain is 1.94 / 3.66 / 6.57 / 10.9 / 16.3.
  assert gains == pytest.approx([noise_lib.adascale_gain(1000.0, 32, b) for b in seen], rel=1e-5)


def test_a_fixed_batch_on_a_plateau_takes_adascale_s_gain():
  """At a fixed batch of 256 from 32 the gain is AdaScale's (6.57 at B_noise 1,000) on the
  plateau as after it: the phase sets where the batch goes, not the gain."""
  tx = date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                     optax.constant_schedule(0.1), base_batch_size=32, batch_size=256,
                     base_steps=10_000, warmup_steps=50)
  params = {"w": jnp.ones(2)}
  state, update, gains = tx.init(params), jax.jit(tx.update), []
  for loss in [2.3] * 50 + [1.9] * 20 + [1.4] * 30:
    _, state = update({"w": jnp.ones(2)}, state, params, grad_sq_norms=_sq_norms(1000.0, 256),
                      value=loss)
    gains.append(float(state.gain))
  assert gains == pytest.approx([noise_lib.adascale_gain(1000.0, 32, 256)] * 100, rel=1e-5)


def test_the_early_climb_stops_below_the_largest_rung():
  """A ladder that ends at EARLY_RUNGS × B0 (512): on the plateau the looks at steps 20, 40 and
  60 climb to 64, 128 and 256, and the one at 80 does not take 512, which waits for the run to
  learn (the growth rule then reads B_noise 1,000: 256 · 512 ≤ 512 · 1,000)."""
  tx = _engine(date.batch_ladder(32, 32 * date.EngineConfig().early_rungs), warmup=50)
  params = {"w": jnp.ones(2)}
  state, update, seen = tx.init(params), jax.jit(tx.update), []
  for loss in [2.3] * 110 + [1.0] * 30:  # learnt (0.8 · 2.3) a few steps after step 110
    seen.append(int(date.next_batch_size(state)))
    _, state = update({"w": jnp.ones(2)}, state, params,
                      grad_sq_norms=_sq_norms(1000.0, seen[-1]), value=loss)
  assert seen[:60] == [32] * 20 + [64] * 20 + [128] * 20 and seen[60:120] == [256] * 60
  assert seen[120:] == [512] * 20  # the look at step 120, after the run has learnt


@pytest.mark.parametrize("wobble, first_climb", [(0.5, 100), (0.7, 100), (1.0, 120)])
def test_the_batch_does_not_climb_while_the_loss_is_rising(wobble, first_climb):
  """A warmup of 95 steps: the growth rule's looks at steps 100, 120, ... The watch's best is
  0.5 + 0.9 · 0.95⁷⁵ = 0.519 at step 95, its gains 2.3 - 0.519 = 1.78; five losses of 0.7 put
  its 5-step mean at 0.7 - 0.2 · 0.8⁵ = 0.634: 6.5% of the gains above the best, under
  hold_share (10%): the batch climbs. Five of 1.0: 1.0 - 0.5 · 0.8⁵ = 0.836, 18%: a hold, and
  the climb waits for the next look."""
  tx = _engine((32, 64), warmup=95)
  params = {"w": jnp.ones(2)}
  state, update, seen = tx.init(params), jax.jit(tx.update), []
  for loss in [2.3] * 10 + [0.5] * 85 + [wobble] * 5 + [0.5] * 101:
    seen.append(int(date.next_batch_size(state)))
    _, state = update({"w": jnp.ones(2)}, state, params,
                      grad_sq_norms=_sq_norms(1000.0, seen[-1]), value=loss)
    if len(seen) == 100:
      assert bool(divergence_lib.loss_rising(state.watch, date.EngineConfig())) == (
          first_climb > 100)
  assert seen.index(64) == first_climb


def test_fixed_batch_engine_asks_for_its_batch_and_refuses_a_bad_ladder():
  fixed = date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                        optax.constant_schedule(0.1), base_batch_size=32, batch_size=512,
                        base_steps=100)
  assert int(date.next_batch_size(fixed.init({"w": jnp.ones(2)}))) == 512
  for bad in [(32, 128, 64, 512), (16, 512), (32, 256), ()]:
    with pytest.raises(ValueError, match="batch_sizes must be increasing"):
      date.adaptive(lambda learning_rate: optax.sgd(learning_rate), optax.constant_schedule(0.1),
                    base_batch_size=32, batch_size=512, base_steps=100, batch_sizes=bad)


def test_a_plain_optax_loop_follows_the_engine():
  """The README's loop: a jitted step per batch size, the engine says which one comes next."""
  x = np.random.default_rng(0).normal(size=(4096, 8)).astype(np.float32)
  y = x @ np.ones(8, np.float32) + 4 * np.random.default_rng(1).normal(size=4096)
  loss_fn = lambda w, batch: jnp.mean((batch["x"] @ w - batch["y"]) ** 2)
  grad_fn = date.grouped_value_and_grad(loss_fn, num_groups=4)
  tx = date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                     optax.cosine_decay_schedule(0.05, 400), base_batch_size=16,
                     batch_size=256, base_steps=400, warmup_steps=10,
                     batch_sizes=date.batch_ladder(16, 256))

  @jax.jit
  def step(w, opt_state, batch):
    loss, grads, sq_norms = grad_fn(w, batch)
    updates, opt_state = tx.update(grads, opt_state, w, grad_sq_norms=sq_norms)
    return optax.apply_updates(w, updates), opt_state, loss

  w, opt_state, position, batches = jnp.zeros(8), tx.init(jnp.zeros(8)), 0, []
  while not date.progress_done(opt_state, 400):
    batch_size = int(date.next_batch_size(opt_state))
    rows = np.arange(position, position + batch_size) % len(x)
    w, opt_state, loss = step(w, opt_state, {"x": x[rows], "y": y[rows]})
    position, batches = position + batch_size, batches + [batch_size]
  assert batches[0] == 16 and max(batches) > 16 and batches == sorted(batches)
  assert len(batches) < 400 and float(loss) < 20.0
  assert step._cache_size() == len(set(batches))  # one program per rung


# --- The planner ------------------------------------------------------------------------------

@pytest.mark.parametrize("exponent", [0.0, date.EngineConfig().noise_batch_exponent])
@pytest.mark.parametrize("noise, batch, warmup", [(500.0, 2048, 75), (50.0, 512, 0),
                                                  (3000.0, 1024, 10)])
def test_budget_of_a_fixed_batch_is_the_closed_form(noise, batch, warmup, exponent):
  # The baseline's B_noise, read at batch B as B_noise·(B/B0)^α (the batch trend).
  budget = date.predicted_budget(noise, base_batch_size=32, batch_sizes=(batch,),
                                 base_steps=7500, warmup_steps=warmup,
                                 config=date.EngineConfig(noise_batch_exponent=exponent))
  assert budget["steps"] == noise_lib.predicted_steps(
      noise * (batch / 32) ** exponent, base_batch_size=32, batch_size=batch, base_steps=7500,
      warmup_steps=warmup)
  assert budget["examples"] == budget["steps"] * batch


@pytest.mark.parametrize("exponent, top", [(0.0, 256), (date.EngineConfig().noise_batch_exponent, 512)])
def test_budget_of_a_growing_batch_by_hand(exponent, top):
  # The baseline's B_noise = 200 throughout, credited as B_max = 512 reads it: 200·16^α (α = 0:
  # 200; α = 0.2: 348). No warmup, a step priced at B_max, interval 20: B·B' ≤ 512·read takes
  # rungs 32, 64, 128, 256, then 512 only when 256·512 = 131,072 ≤ 512·read (α = 0.2).
  read = 200.0 * 16 ** exponent
  budget = date.predicted_budget(200.0, base_batch_size=32, batch_sizes=(32, 64, 128, 256, 512),
                                 base_steps=1000,
                                 config=date.EngineConfig(step_price=1.0,
                                                          noise_batch_exponent=exponent))
  rungs = [b for b in (32, 64, 128, 256, 512) if b <= top]
  gains = [noise_lib.adascale_gain(read, 32, b) for b in rungs]
  covered = 20 * sum(gains[:-1])   # 20 steps at each rung below the top
  by_hand = 20 * (len(rungs) - 1) + -(-(1000 - covered) // gains[-1])
  assert budget["largest_batch_size"] == top
  if not exponent:  # every rung reads 200: the noise EMAs hold it exactly, the gain is settled
    assert budget["steps"] == by_hand
    assert budget["examples"] == 20 * sum(rungs[:-1]) + top * (by_hand - 20 * (len(rungs) - 1))
  else:
    # A rung reads 200·(B/32)^α: a step after each growth the EMAs still carry the rung below's
    # smaller reading, so the gain climbs to the settled one from below and the run is longer.
    assert by_hand < budget["steps"] <= by_hand * 1.05


def test_a_profile_logged_at_the_largest_batch_plays_as_logged():
  # Read at B_max, the credit (B_max/B_max)^α is 1: a run at B_max plays out as with α = 0.
  profile = [200.0, 900.0, 2500.0]
  kwargs = dict(base_batch_size=32, base_steps=1000, warmup_steps=20)
  flat = date.EngineConfig(noise_batch_exponent=0.0)
  fixed = date.predicted_budget(profile, batch_sizes=(512,), read_at_batch_size=512, **kwargs)
  assert fixed == date.predicted_budget(profile, batch_sizes=(512,), config=flat, **kwargs)
  # On a ladder the smaller rungs read less than the logged profile and are credited back up to
  # it; what the EMAs carry over a growth is a smaller rung's, so never fewer steps than α = 0.
  # Read at B0 the profile is credited up by 16^α: fewer steps.
  ladder = date.batch_ladder(32, 512)
  logged = date.predicted_budget(profile, batch_sizes=ladder, read_at_batch_size=512, **kwargs)
  flat = date.predicted_budget(profile, batch_sizes=ladder, config=flat, **kwargs)
  at_base = date.predicted_budget(profile, batch_sizes=ladder, **kwargs)
  assert at_base["steps"] < flat["steps"] <= logged["steps"] <= flat["steps"] * 1.05
  with pytest.raises(ValueError, match="read_at_batch_size"):
    date.predicted_budget(profile, base_batch_size=32, batch_sizes=ladder, base_steps=1000,
                          read_at_batch_size=0)


def _adaptive_loop_on_a_profile(profile, losses, *, ladder, base_steps, warmup_steps):
  """A plain optax loop through `date.adaptive`, fed the readings `predicted_budget` describes
  (tr Σ/|G|² = B_noise at the progress × the batch trend (B/B0)^α, tr Σ + |G|² = 1): the
  second path."""
  tx = date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                     optax.constant_schedule(0.1), base_batch_size=32, batch_size=ladder[-1],
                     base_steps=base_steps, warmup_steps=warmup_steps,
                     batch_sizes=ladder if len(ladder) > 1 else None, watch=losses is not None)
  params = {"w": jnp.ones(2)}
  state = tx.init(params)

  @jax.jit
  def step(state, noise, batch, loss):
    trace, signal = noise / (1.0 + noise), 1.0 / (1.0 + noise)
    norms = date.GradientSqNorms(signal + trace, signal + trace / batch, 1, batch)
    return tx.update({"w": jnp.ones(2)}, state, params, grad_sq_norms=norms, value=loss)[1]

  steps = examples = 0
  while not (date.progress_done(state, base_steps) or date.gave_up(state)):
    batch, progress = int(state.batch_size), float(state.progress)
    noise = profile[min(int(progress * len(profile) / base_steps), len(profile) - 1)]
    noise *= (batch / 32) ** date.EngineConfig().noise_batch_exponent
    loss = None if losses is None else float(np.interp(progress / base_steps,
                                                        np.linspace(0, 1, len(losses)), losses))
    count = int(state.count)
    state = step(state, jnp.float32(noise), batch, loss)
    steps, examples = steps + (int(state.count) > count), examples + batch * (int(state.count) > count)
  return steps, examples, int(state.batch_size)


@pytest.mark.parametrize("ladder", [(512,), (32, 64, 128, 256, 512)])
@pytest.mark.parametrize("losses", [None, [2.3, 2.25, 1.6, 1.1, 0.9, 0.8, 0.7, 0.6, 0.55, 0.5]])
def test_the_predicted_budget_is_the_engines_own_play_out(ladder, losses):
  profile = [60.0, 150.0, 400.0, 900.0]
  budget = date.predicted_budget(profile, base_batch_size=32, batch_sizes=ladder,
                                 base_steps=1500, warmup_steps=30, losses=losses)
  loop = _adaptive_loop_on_a_profile(profile, losses, ladder=ladder, base_steps=1500,
                                     warmup_steps=30)
  assert (budget["steps"], budget["examples"], budget["largest_batch_size"]) == loop
  assert budget["phase"] == "done"


def test_a_loss_profile_plays_out_the_plateau_and_a_run_that_never_learns_gives_up():
  kwargs = dict(base_batch_size=32, batch_sizes=(512,), base_steps=1500, warmup_steps=30)
  losses = [2.3, 2.25, 1.6, 1.1, 0.9, 0.8, 0.7, 0.6]
  falling = date.predicted_budget(200.0, **kwargs)
  plateau = date.predicted_budget(200.0, losses=losses, **kwargs)
  assert plateau["phase"] == falling["phase"] == "done"
  # At a fixed batch a plateau's step takes AdaScale's gain like any other.
  assert plateau["steps"] == falling["steps"]
  # On a ladder the plateau's early climb starts at the first look, inside the warmup.
  ladder = dict(kwargs, batch_sizes=date.batch_ladder(32, 2048))
  climbing = date.predicted_budget(2000.0, losses=losses, **ladder)
  assert climbing["phase"] == "done"
  assert climbing["steps"] < date.predicted_budget(2000.0, **ladder)["steps"]
  # A loss that has not fallen by a quarter of the progress: the watch's no-learning rule.
  assert date.predicted_budget(200.0, losses=[2.3, 2.3], **kwargs)["phase"] == "gave_up"
  with pytest.raises(ValueError, match="losses"):
    date.predicted_budget(200.0, losses=[], **kwargs)


def test_plan_and_explain_show_the_ladder_and_the_predicted_budget():
  base = date.Recipe(batch_size=32, num_examples=60_000, num_epochs=4, learning_rate=8e-3,
                     optimizer="adam", warmup_epochs=0.04)
  profile = [300.0, 800.0, 1500.0, 3000.0]
  recipe = date.plan(base, 2048, "adaptive", grow_batch=True, noise_scale=profile)
  assert recipe.grow_batch and recipe.batch_size == 2048 and recipe.base_batch_size == 32
  text = date.explain(base, recipe)
  budget = date.predicted_budget(profile, base_batch_size=32,
                                 batch_sizes=date.batch_ladder(32, 2048), base_steps=7500,
                                 warmup_steps=75)
  assert "32, 64, 128, 256, 512, 1,024, 2,048" in text
  assert f"{budget['steps']:,} for a 4-point B_noise profile" in text
  assert f"{budget['examples']:,} = {budget['examples_vs_baseline']:.2f}" in text
  assert planner_lib.plan_predicted_steps(recipe, profile) == budget["steps"]
  assert date.Recipe.from_dict(recipe.to_dict()) == recipe


def test_grow_batch_is_refused_outside_the_adaptive_strategy():
  base = date.Recipe(batch_size=32, num_examples=6_000, num_epochs=4, learning_rate=1e-3)
  with pytest.raises(ValueError, match="grow_batch=True is a rule of the 'adaptive' strategy"):
    date.plan(base, 512, "legw", grow_batch=True)
  with pytest.raises(ValueError, match="grow_batch=True needs an adaptive recipe"):
    base.replace(grow_batch=True)
  with pytest.raises(TypeError, match="a profile is for 'adaptive'"):
    date.plan(base, 512, "legw", noise_scale=[100.0, 200.0])
  with pytest.raises(ValueError, match="step_price"):
    date.plan(base, 512, "adaptive", grow_batch=True, engine={"step_price": 0.0})


# --- The data stream ------------------------------------------------------------------------

def test_stream_serves_every_example_once_per_epoch_whatever_the_batch_sizes():
  ds = get_dataset("digits")
  n = ds.num_train_examples
  sizes = [64, 64, 128, 256, 512, 512, 1024, 1024, 1024]
  position, labels = 0, []
  for size in sizes:
    labels.append(ds.stream_batch(position, size, seed=3, augment=False)["labels"])
    position += size
  served = np.concatenate(labels)
  expected = np.concatenate([epoch_permutation(n, 3, e) for e in range(position // n + 1)])
  train_labels = ds.train_source.gather(np.arange(n), None)["labels"]
  np.testing.assert_array_equal(served, train_labels[expected[:position]])
  # Two processes' slices make the global batch, across an epoch's end too.
  start = n - 100
  whole = ds.stream_batch(start, 256, seed=3)["inputs"]
  halves = [ds.stream_batch(start, 256, seed=3, process_index=p, process_count=2)["inputs"]
            for p in (0, 1)]
  np.testing.assert_array_equal(whole, np.concatenate(halves))


# --- The trainer ------------------------------------------------------------------------------

def _growing_config(**overrides):
  """The tiny MNIST-1D LSTM (B0 = 16, 120 baseline steps) growing its batch up to 128."""
  # A step priced at 1000 largest batches: every rung is due as soon as the rule looks (every
  # 20 steps after the warmup).
  return tiny_config.with_fields(**{
      "strategy": "adaptive", "batch_size": 128, "grad_groups": 4,
      "plan": dict(grow_batch=True, engine={"step_price": 1000.0}), "log_every_steps": 5,
      "checkpoint_every_steps": -1, **overrides})


def _train_step_compilations_of_a_run(config, workdir):
  """(result, {batch: threads}: the threads that compiled a train-step program for each
  batch during the run), from jax's compile log (set for every thread: rungs compiled ahead
  compile in a thread of their own)."""
  from dateopt import train
  messages = []
  handler = logging.Handler()
  handler.emit = lambda record: messages.append((record.threadName, record.getMessage()))
  logger = logging.getLogger("jax")
  logger.addHandler(handler)
  logs_compiles = jax.config.jax_log_compiles
  jax.config.update("jax_log_compiles", True)
  try:
    result = train.train_and_evaluate(config, workdir)
  finally:
    jax.config.update("jax_log_compiles", logs_compiles)
    logger.removeHandler(handler)
  compiled = {}
  for thread, message in messages:
    if message.startswith("Compiling jit(train_step)"):  # (batch, 40, 1): the inputs' shape
      batch = int(re.search(r"float32\[(\d+),40,1\]", message).group(1))
      compiled.setdefault(batch, []).append(thread)
  return result, compiled


@pytest.fixture(scope="module")
def grown_run(tmp_path_factory):
  """One growing run, checkpointed every 5 steps, for the tests that read it: (its config,
  workdir, result, {batch: the threads that compiled its train step})."""
  workdir = tmp_path_factory.mktemp("grown") / "whole"
  config = _growing_config(checkpoint_every_steps=5, keep_checkpoints=20)
  result, compiles = _train_step_compilations_of_a_run(config, str(workdir))
  return config, workdir, result, compiles


def test_trainer_grows_on_8_devices_compiles_once_per_rung_and_logs_every_batch(grown_run,
                                                                                 tmp_path):
  _, workdir, result, compiles = grown_run
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  changes = [(r["step"], r["train/batch_size"]) for r in rows
             if "train/batch_size" in r and "train/loss" not in r]
  # The warmup is 6 steps; the rule looks every 20: rungs from steps 21, 41 and 61.
  assert changes[0] == (1, 16) and changes[1:] == [(21, 32), (41, 64), (61, 128)][:len(changes) - 1]
  rungs = [b for _, b in changes]
  assert result.largest_batch_size == rungs[-1] and len(rungs) >= 3
  assert result.train_step_compilations == len(rungs)
  assert compiles == {b: ["MainThread"] for b in rungs}  # one program per rung, none twice
  # The examples are the sum of every step's batch.
  batch_at = lambda step: max(b for s, b in changes if s <= step)
  assert result.examples == sum(batch_at(s) for s in range(1, result.steps + 1))
  summary = next(r for r in rows if "run/examples" in r)
  assert summary["run/examples"] == result.examples
  assert summary["run/largest_batch_size"] == result.largest_batch_size
  assert summary["run/examples_vs_baseline"] == pytest.approx(result.examples / (120 * 16))
  assert max(r["step"] for r in rows) == result.steps  # nothing after the run's end
  # The rungs compiled ahead in a thread (dateopt.train.rungs): the same run to the bit, and
  # still one program per rung, none compiled twice.
  ahead, compiles_ahead = _train_step_compilations_of_a_run(
      _growing_config(compile_rungs_ahead=True), str(tmp_path / "ahead"))
  # The first rung compiled by the loop, the others each once in the compile thread (the
  # one never reached, too, where the thread got to it before the run ended).
  assert compiles_ahead.pop(16) == ["MainThread"]
  assert set(rungs[1:]) <= set(compiles_ahead) <= {32, 64, 128}
  assert all(threads == ["rung-compile_0"] for threads in compiles_ahead.values())
  assert ahead.train_step_compilations >= len(rungs)
  ahead_rows = [json.loads(line) for line in open(tmp_path / "ahead" / "metrics.jsonl")]
  losses = lambda rows: [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]
  assert losses(ahead_rows) == losses(rows) and ahead.examples == result.examples


@pytest.mark.xla_defaults  # running its accumulated steps, not compiling them, is its time
def test_trainer_grows_with_gradient_accumulation_and_rungs_compiled_ahead(tmp_path):
  # Noise measured on 1 step in 2: two programs a rung (measuring or not), and the compile
  # thread builds both for the rung above the first. Up to 32: two rungs, four programs.
  config = _growing_config(batch_size=32, grad_accum_steps=2, measure_every_steps=2,
                           compile_rungs_ahead=True)
  result, compiles = _train_step_compilations_of_a_run(config, str(tmp_path))
  assert result.largest_batch_size == 32
  assert compiles == {16: ["MainThread"] * 2,  # steps 1 and 2: the loop's own
                      32: ["rung-compile_0"] * 2}


def test_growing_ladder_refuses_a_max_the_layout_cannot_split(tmp_path):
  from dateopt import train
  with pytest.raises(train.StartupError, match="config.batch_size=120, the growing batch's "
                                               "largest, must be a multiple of 32"):
    train.train_and_evaluate(_growing_config(batch_size=120, grad_accum_steps=4), str(tmp_path))


def test_a_run_killed_mid_ramp_resumes_bit_exact(grown_run, tmp_path):
  from dateopt import train
  from dateopt.train import engine_log
  config, whole_dir, whole, _ = grown_run
  resume_at = 45  # after the rungs at 21 and 41, before the one at 61
  shutil.copytree(whole_dir / "checkpoints" / str(resume_at),
                  tmp_path / "resumed" / "checkpoints" / str(resume_at))
  resumed = train.train_and_evaluate(config.copy_and_resolve_references(),
                                     str(tmp_path / "resumed"))
  assert resumed.steps == whole.steps and resumed.examples == whole.examples
  assert resumed.largest_batch_size == whole.largest_batch_size
  for a, b in zip(jax.tree.leaves(whole.state.params), jax.tree.leaves(resumed.state.params)):
    np.testing.assert_array_equal(a, b)
  # The engine's record of every step, on 8 devices: the same after the resume, and replayed
  # (its code on those readings) to the same decisions at every step.
  engine_rows = lambda run: [row for row in (run / engine_log.ENGINE_FILE)
                             .read_text().splitlines() if json.loads(row)["step"] > resume_at]
  assert engine_rows(tmp_path / "resumed") == engine_rows(whole_dir)  # after the checkpoint
  report = engine_log.replay_run(whole_dir)
  assert report.exact and report.steps == whole.steps, report.first_mismatch


def test_compile_rungs_ahead_takes_a_bool():
  from dateopt import train
  config = _growing_config()
  config.compile_rungs_ahead = None
  with pytest.raises(TypeError, match="config.compile_rungs_ahead must be True or False; got None"):
    train.build_experiment(config)
