"""The Adam family beyond the LR: β₂ half-life, ε/√k, the AdamW timescale (REFERENCE.md §10)."""

import math

import jax
import jax.numpy as jnp
import optax
import pytest

from dateopt import date


def _adamw():
  return date.Recipe(batch_size=32, num_examples=24_000, num_epochs=10, learning_rate=1e-3,
                     optimizer="adamw", b2=0.99, eps=1e-8, weight_decay=0.1,
                     warmup_epochs=0.1)


def test_a_static_plan_writes_the_scaled_values_by_hand():
  planned = date.plan(_adamw(), 512, "legw", promote=False,
                      adam_scaling=("b2", "eps", "weight_decay"))
  # k = 16, LEGW's LR × 4: β₂ = 0.99^16 = 0.851 is below β₁, so β₁ = 0.9; ε = 1e-8/4;
  # λ = 0.1 · 16 / 4 = 0.4.
  assert planned.b2 == pytest.approx(0.9) and 0.99 ** 16 < 0.9
  assert planned.eps == pytest.approx(2.5e-9) and planned.weight_decay == pytest.approx(0.4)
  assert "Marek" in planned.rationale["b2"] and "Bergsma" in planned.rationale["weight_decay"]
  assert planned.adam_scaling == ()  # the values are in the recipe: nothing left to apply
  gentle = date.plan(_adamw().replace(b2=0.999), 512, "legw", promote=False,
                     adam_scaling=("b2",))
  assert gentle.b2 == pytest.approx(0.999 ** 16)  # 0.984: above β₁, not clamped


def test_the_b2_clamp_never_raises_b2():
  low = _adamw().replace(b1=0.95, b2=0.9)
  assert date.plan(low, 64, "legw", promote=False, adam_scaling=("b2",)).b2 == pytest.approx(0.9)


def test_without_rules_a_plan_keeps_b2_eps_and_weight_decay():
  planned = date.plan(_adamw(), 512, "legw", promote=False)
  assert (planned.b2, planned.eps, planned.weight_decay) == (0.99, 1e-8, 0.1)


def test_the_rules_refuse_what_they_do_not_scale():
  with pytest.raises(ValueError, match="holds the AdamW timescale of decoupled weight decay"):
    date.plan(_adamw().replace(optimizer="adam"), 512, "legw", adam_scaling=("weight_decay",))
  with pytest.raises(ValueError, match="scales the Adam family"):
    date.plan(_adamw().replace(optimizer="momentum"), 512, "sqrt", adam_scaling=("b2",))
  with pytest.raises(ValueError, match="adam_scaling must be one of 'b2', 'eps'"):
    date.plan(_adamw(), 512, "adaptive", adam_scaling=("beta2",))
  with pytest.raises(ValueError, match="a static plan writes the scaled"):
    _adamw().replace(adam_scaling=("b2",))
  with pytest.raises(ValueError, match="this plan promotes it to 'lamb': pass promote=False"):
    date.plan(_adamw(), 16384, "legw", adam_scaling=("b2",))
  with pytest.raises(ValueError, match="noise_of='adam_step' reads Adam's preconditioner"):
    date.plan(_adamw(), 512, "adaptive", noise_of="adam_step", adam_scaling=("eps",))


def test_a_batch_schedule_sets_them_at_every_step_from_its_batch_and_lr_factor():
  planned = date.plan(_adamw(), 128, "doubling", adam_scaling=("b2", "eps", "weight_decay"),
                      schedule_options={"ramp_examples": 64})
  tx, _ = date.build(planned)
  params = {"w": jnp.ones(3)}
  state, update = tx.init(params), jax.jit(tx.update)
  for _ in range(6):
    batch = int(date.next_batch_size(state))
    _, state = update({"w": jnp.ones(3)}, state, params)
    k = batch / 32
    lr_factor = math.sqrt(k)  # the doubling's √ rule
    assert float(optax.tree.get(state, "b2")) == pytest.approx(max(0.99 ** k, 0.9), rel=1e-6)
    assert float(optax.tree.get(state, "eps")) == pytest.approx(1e-8 / math.sqrt(k), rel=1e-6)
    assert float(optax.tree.get(state, "weight_decay")) == pytest.approx(0.1 * k / lr_factor,
                                                                         rel=1e-6)
  assert batch == 128  # the ramp reached the largest batch


def test_dates_engine_sets_them_from_the_step_batch_and_the_gain_it_applied():
  planned = date.plan(_adamw(), 256, "adaptive", adam_scaling=("eps", "weight_decay"))
  tx, _ = date.build(planned)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  # |G|² = 1 and tr Σ = 320 at groups of 32 and the whole 256 (B_noise = 320).
  sq = date.GradientSqNorms(1 + 320 / 32, 1 + 320 / 256, 32, 256)
  for _ in range(3):
    _, state = tx.update({"w": jnp.ones(3)}, state, params, grad_sq_norms=sq)
  engine = optax.tree.get(state, "AdaptiveState")
  gain = float(engine.gain)
  assert gain > 1
  assert float(optax.tree.get(state, "eps")) == pytest.approx(1e-8 / math.sqrt(8), rel=1e-6)
  assert float(optax.tree.get(state, "weight_decay")) == pytest.approx(0.1 * 8 / gain,
                                                                       rel=1e-5)
