"""`date.EngineConfig`: the engine's eight knobs, what derives from them, and where they go."""

import dataclasses
import json

import jax.numpy as jnp
import optax
import pytest

from dateopt import date
from dateopt.date import _noise as noise_lib
from dateopt.train import recipe_record

BASE = date.Recipe(batch_size=32, num_examples=8000, num_epochs=30, learning_rate=2e-3,
                   optimizer="adam", warmup_epochs=0.25)


def test_the_defaults_derive_the_engine_s_documented_values():
  """Each derived value is the one docs/results/engine_rules.md tables, in float32 too."""
  config = date.EngineConfig()
  assert len(dataclasses.fields(config)) <= 8
  want = {"noise_decay": 0.99, "signal_decay": 0.97, "reading_clip": 4.0,
          "gradient_jump": 1e4, "growth_interval": 20, "patience": 100, "loss_decay": 0.95,
          "fast_decay": 0.8, "learnt": 0.8, "stall_drop": 0.9, "fall_share": 0.01,
          "recovery_steps": 20, "relapse": 0.5, "recovered": 0.25, "blow_up": 2.0,
          "stall_progress": 0.25, "min_lr_scale": 2.0 ** -10}
  for name, value in want.items():
    assert jnp.float32(getattr(config, name)) == jnp.float32(value), name


def test_one_horizon_moves_every_value_derived_from_it():
  config = date.EngineConfig(horizon=200)
  assert (config.noise_decay, config.signal_decay, config.patience) == (0.995, 0.985, 200)
  assert config.gradient_jump == 4e4 and config.reading_clip == 7.0
  assert config.decays(2) == (0.995 ** 2, 0.985 ** 2)  # the horizon stays in steps


@pytest.mark.parametrize("fields, match", [
    (dict(horizon=2), "EngineConfig.horizon"),      # the |G|² decay 1 - 3/h would be < 0
    (dict(horizon=10.5), "EngineConfig.horizon"),
    (dict(warm_in=1), "EngineConfig.warm_in"),
    (dict(hold_share=0.5), "EngineConfig.hold_share"),
    (dict(climb_share=0.2), "EngineConfig.climb_share"),  # above hold_share
    (dict(gain_rise=0.0), "EngineConfig.gain_rise"),
    (dict(step_price=-1.0), "EngineConfig.step_price"),
    (dict(noise_batch_exponent=1.5), "EngineConfig.noise_batch_exponent"),
])
def test_a_bad_knob_is_refused_by_name(fields, match):
  with pytest.raises(ValueError, match=match):
    date.EngineConfig(**fields)


def test_an_unknown_knob_is_refused_naming_the_allowed_ones():
  with pytest.raises(ValueError, match="unknown field 'horizn'; allowed: horizon, warm_in"):
    date.plan(BASE, 512, "adaptive", engine={"horizn": 50})


def test_the_plan_records_the_config_and_a_recipe_round_trips_it():
  planned = date.plan(BASE, 512, "adaptive", grow_batch=True,
                      engine=date.EngineConfig(step_price=2.0))
  assert planned.engine_config == date.EngineConfig(step_price=2.0)
  stored = json.loads(json.dumps(recipe_record.as_stored(planned)))
  assert date.Recipe.from_dict(stored) == planned
  assert "step_price 2 as given" in planned.rationale["engine"]
  # A recipe recorded before `engine` held the growth rule's knobs as fields of its own.
  old = {k: v for k, v in stored.items() if k != "engine"}
  old.update(step_price=2.0, noise_batch_exponent=0.0)
  assert date.Recipe.from_dict(old).engine_config == date.EngineConfig(
      step_price=2.0, noise_batch_exponent=0.0)


def test_the_config_steers_the_engine_s_noise_emas():
  """`adaptive` and `measure_noise_scale` with horizon 200 keep the EMAs of decay 0.995 and
  |G|² 0.985: what `update_noise_scale` gives at those decays by hand."""
  config = date.EngineConfig(horizon=200)
  readings = [date.GradientSqNorms(g + 320 / 64, g + 320 / 512, 64, 512) for g in (4.0, 2.0, 1.0)]
  expected = noise_lib.init_noise_scale()
  for sq in readings:
    expected = noise_lib.update_noise_scale(expected, sq, 0.995, signal_decay=0.985,
                                            clip=7.0, clip_after=10)
  params = {"w": jnp.ones(2)}
  measured = date.measure_noise_scale(optax.sgd(0.1), config=config)
  engine = date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                         optax.constant_schedule(0.1), base_batch_size=32, batch_size=512,
                         base_steps=1000, config=config)
  for tx in (measured, engine):
    state = tx.init(params)
    for sq in readings:
      _, state = tx.update(params, state, params, grad_sq_norms=sq)
    assert [float(x) for x in state.noise] == pytest.approx([float(x) for x in expected])


def test_a_record_from_before_the_config_replays_with_the_config_it_implies():
  from dateopt.train import engine_log
  old = dict(base_batch_size=32, batch_size=512, base_steps=100, warmup_steps=0,
             gain_rule="linear", batch_sizes=None, noise_decay=0.99 ** 2, signal_decay=None,
             step_price=1.0, noise_batch_exponent=0.2, divergence_patience=None, rules_off=[])
  settings = engine_log._settings_before_the_config(old, 2)  # measured one step in two
  assert date.EngineConfig(**settings["config"]) == date.EngineConfig()
  assert settings["measure_every_steps"] == 2 and settings["watch"] is False
  assert settings["rules_off"] == ("signal_horizon",)  # one horizon for both EMAs
  with pytest.raises(ValueError, match="cannot replay"):
    engine_log._settings_before_the_config(dict(old, signal_decay=0.5), 2)


def test_an_old_record_resumes_only_under_the_knobs_and_watch_it_ran_with(tmp_path):
  """A recipe.json from before `Recipe.engine` ran with every knob at today's default (its
  growth knobs as fields of their own), and `divergence_patience` 0 was an unwatched run."""
  grown = date.plan(BASE, 256, "adaptive", grow_batch=True)
  (tmp_path / "checkpoints" / "10").mkdir(parents=True)
  stored = recipe_record.as_stored(grown)
  stored.update(stored.pop("engine"))  # step_price and noise_batch_exponent as fields
  stored = {k: v for k, v in stored.items() if k not in date.EngineConfig().to_dict()
            or k in ("step_price", "noise_batch_exponent")}
  run = {"divergence_patience": 0}
  (tmp_path / "recipe.json").write_text(json.dumps({"planned": stored, "run": run}))
  recipe_record.check_unchanged(str(tmp_path), grown, {"divergence_watch": False})
  with pytest.raises(recipe_record.RecipeChangedError, match='"horizon": 100'):
    recipe_record.check_unchanged(str(tmp_path), grown.replace(engine={"horizon": 200}),
                                  {"divergence_watch": False})
  with pytest.raises(recipe_record.RecipeChangedError, match="divergence_watch"):
    recipe_record.check_unchanged(str(tmp_path), grown, {"divergence_watch": True})
