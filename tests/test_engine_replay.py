"""`date.replay`: the engine's decisions re-run from the readings a run recorded.

The second code path is the optax transformation itself: a scripted run through
`date.adaptive`, jitted with its inner optimizer, records `AdaptiveState.observation`
after each step; `replay` runs the engine alone on those readings and must decide the
same, bit for bit, at every step and through every phase. A trained run's
`engine.jsonl` is replayed the same way in tests/test_batch_growth.py and
tests/test_lm_training.py (`dateopt.train.engine_log.replay_run`).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import date
from dateopt.date import _progress as progress_lib

SCHEDULE = optax.cosine_decay_schedule(1e-2, 4000)
SETTINGS = dict(base_batch_size=8, batch_size=256, base_steps=4000, warmup_steps=20)


def _loss_at(step: int, rng: np.random.Generator, explode_from: int | None) -> float:
  """A plateau, a fall, a bump, and (from `explode_from`) a run that blows up."""
  if explode_from is not None and step >= explode_from:
    return 50.0 * (1 + step - explode_from)
  fall = 2.3 if step < 40 else 0.4 + 1.9 * math.exp(-(step - 40) / 40)
  bump = 0.8 if 150 <= step < 175 else 0.0
  return fall + bump + 0.02 * rng.random()


def _scripted_run(settings: dict, *, steps: int, explode_from: int | None = None):
  """(observations, decisions) of a jitted `date.adaptive` over scripted readings: a NaN
  gradient at step 100 and a gradient jump at step 120 (both skipped)."""
  rng = np.random.default_rng(0)
  tx = date.adaptive(lambda learning_rate: optax.adamw(learning_rate, weight_decay=0.1),
                     SCHEDULE, **settings)
  params = {"w": jnp.ones(4)}
  state = tx.init(params)

  @jax.jit
  def step(state, grads, small, big, loss, share, big_batch):
    norms = date.GradientSqNorms(small, big, 4, big_batch)
    return tx.update({"w": grads}, state, params, grad_sq_norms=norms, value=loss,
                     lr_multiplier=share)[1]

  observations, decisions = [], []
  for t in range(steps):
    big_batch = int(state.batch_size)
    grads = jnp.asarray(rng.normal(size=4), jnp.float32)
    if t == 100:
      grads = grads.at[0].set(jnp.nan)
    trace, signal = 40.0 * (1 + t / 40), 1.0 / (1 + t / 30)
    small = signal + trace / 4 * (1 + 0.2 * rng.random())
    big = 1e9 if t == 120 else signal + trace / big_batch * (1 + 0.2 * rng.random())
    state = step(state, grads, jnp.float32(small), jnp.float32(big),
                 jnp.float32(_loss_at(t, rng, explode_from)),
                 jnp.float32(0.5 if t == 60 else 1.0), big_batch)
    observations.append(jax.tree.map(lambda x: x.item(), state.observation._asdict()))
    decisions.append(progress_lib.decisions(state))
  return observations, decisions


def _same(decisions, replayed):
  """The first step whose replayed decisions are not the recorded ones (None: none)."""
  for t, (recorded, again) in enumerate(zip(decisions, replayed, strict=True)):
    if any(recorded[k] != again[k] for k in recorded):
      return t, recorded, again
  return None


@pytest.fixture(scope="module", params=["fixed", "grown"])
def run(request):
  settings = dict(SETTINGS, batch_sizes=date.batch_ladder(8, 256)
                  if request.param == "grown" else None)
  return settings, *_scripted_run(settings, steps=300)


def test_replay_decides_every_step_as_the_run_did(run):
  settings, observations, decisions = run
  assert _same(decisions, date.replay(observations, SCHEDULE, **settings)) is None
  phases = {d["phase"] for d in decisions}
  assert {"warmup", "plateau", "learning", "hold", "done"} <= phases  # every healthy phase
  assert observations[100]["grads_finite"] is False  # the NaN gradient: skipped
  assert decisions[100]["count"] == decisions[99]["count"]
  assert decisions[120]["count"] == decisions[119]["count"]  # the jump: skipped too


def test_replay_reads_the_runs_json_back_exactly(run):
  """Through JSON, as engine.jsonl holds it: the non-finite values as strings."""
  settings, observations, decisions = run
  as_json = lambda v: str(v) if isinstance(v, float) and not math.isfinite(v) else v
  lines = [json.dumps({k: as_json(v) for k, v in o.items()}, allow_nan=False)
           for o in observations]
  read_back = [json.loads(line) for line in lines]
  assert _same(decisions, date.replay(read_back, SCHEDULE, **settings)) is None


def test_replay_follows_a_run_into_divergence_and_giving_up():
  settings = dict(SETTINGS, config=date.EngineConfig(horizon=20))
  observations, decisions = _scripted_run(settings, steps=230, explode_from=190)
  assert {"diverged", "gave_up"} <= {d["phase"] for d in decisions}
  assert decisions[-1]["gave_up"] and decisions[-1]["diverged_steps"] > 0
  assert _same(decisions, date.replay(observations, SCHEDULE, **settings)) is None


@pytest.mark.parametrize("run", ["fixed"], indirect=True)  # a ladder compiles once a rung
def test_where_a_rule_first_acts_is_where_a_run_without_it_first_decides_otherwise(run):
  """`first_actions` (a replay with each rule off) against the optax transformation run with
  the rule off on the same scripted readings: the same first step, or none for both."""
  from dateopt.train import engine_log  # the train extra
  settings, observations, decisions = run
  actions = {a.rule: a for a in engine_log.first_actions(
      observations, SCHEDULE, ("rising_hold", "relapse", "early_climb"), **settings)}
  compared = [k for k in engine_log.ACTION if k != "learning_rate"]  # a replay's alone
  for rule in ("rising_hold", "relapse"):
    _, off = _scripted_run(dict(settings, rules_off=(rule,)), steps=300)
    differs = next((t for t, (a, b) in enumerate(zip(decisions, off), start=1)
                    if any(a[k] != b[k] for k in compared)), None)
    assert actions[rule].step == differs, rule
  assert actions["relapse"].step is None  # no relapse in this run: off, nothing changes
  assert 150 <= actions["rising_hold"].step < 200  # the bump's hold, not before the bump
  assert "early_climb" not in actions  # a ladder's rule: a fixed batch has none


def test_replay_refuses_what_adaptive_refuses():
  with pytest.raises(ValueError, match="warmup_steps"):
    date.replay([], SCHEDULE, **dict(SETTINGS, warmup_steps=4000))
  with pytest.raises(ValueError, match="rules_off"):
    date.replay([], SCHEDULE, **dict(SETTINGS, rules_off=("no_such_rule",)))
  assert date.replay([], SCHEDULE, **SETTINGS) == []


# --- Recorded runs (scripts/record_engine_runs.py) ---------------------------------------------

RECORDED = pathlib.Path(__file__).parent / "data" / "engine_runs"
# What each recorded run shows the engine doing: the phases it must pass through.
SHOWS = {"plateau": {"warmup", "plateau", "learning", "hold", "done"},
         "lm_climb": {"warmup", "learning", "done"},
         "resnet_climb": {"warmup", "plateau", "learning", "done"},
         "spike": {"plateau", "learning", "done"},
         "divergence": {"plateau", "gave_up"}}


# The jaxlib that recorded the runs (scripts/record_engine_runs.py). On it the replay is bit
# for bit; another XLA may round a float's last bit otherwise (`make test-oldest`, jaxlib 0.8).
RECORDED_WITH_JAXLIB = "0.10.2"


@pytest.mark.xla_defaults  # the runs were recorded at XLA's defaults
@pytest.mark.parametrize("name", sorted(SHOWS))
def test_a_recorded_trainer_run_replays_bit_for_bit(name):
  from dateopt.train import engine_log  # the train extra: the recorded runs' own reader
  report = engine_log.replay_run(RECORDED / name)
  if importlib.metadata.version("jaxlib") == RECORDED_WITH_JAXLIB or report.exact:
    assert report.exact, report.first_mismatch
  else:  # another XLA: the first difference is a float's last bits, never a phase or a batch
    step, differing = report.first_mismatch
    for recorded, replayed in differing.values():
      assert isinstance(recorded, float), (step, differing)
      assert replayed == pytest.approx(recorded, rel=1e-6), (step, differing)
  assert SHOWS[name] <= {d["phase"] for d in report.replayed}
  if name == "spike":  # the gradient x1000 at step 50: skipped, nothing credited
    assert report.replayed[49]["count"] == report.replayed[48]["count"]
    assert report.replayed[49]["progress"] == report.replayed[48]["progress"]
  if name.endswith("_climb"):  # the batch climbed from B0 (4 windows; 32 images)
    assert report.replayed[0]["step_batch"] == {"lm_climb": 4, "resnet_climb": 32}[name]
    assert max(d["batch_size"] for d in report.replayed) >= 64


@pytest.mark.xla_defaults
def test_the_replay_cli_says_where_each_rule_acts_on_a_recorded_run(capsys):
  """The recorded 1000x-LR run's gradients explode from step 91 (the jump skip acts there:
  off, the step is taken and counted) and its loss never relapses; an unknown rule is an
  error that names the allowed ones."""
  from dateopt.train import engine_log  # the train extra
  status = engine_log.main([str(RECORDED / "divergence"), "--rules",
                            "relapse,gradient_jump_skip"])
  if not engine_log.replay_run(RECORDED / "divergence").exact:  # another XLA: see above
    assert status == 1 and "acts" not in capsys.readouterr().out  # no rule judged on it
    return
  assert status == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].split() == ["relapse", "never", "acts:", "off,", "every", "step", "decides",
                              "the", "same"]
  assert lines[1].startswith("gradient_jump_skip") and "acts from step 91:" in lines[1]
  assert "count 90 → 91" in lines[1]
  assert engine_log.main([str(RECORDED / "divergence"), "--rules", "no_such_rule"]) == 2
  assert "rules_off" in capsys.readouterr().err


def test_the_rung_table_groups_the_steps_by_the_batch_each_had(run):
  from dateopt.train import engine_log  # the train extra
  settings, observations, decisions = run
  replayed = date.replay(observations, SCHEDULE, **settings)
  rows = engine_log.rung_table(replayed).splitlines()[2:]
  batches = [int(row.split("|")[1].replace(",", "")) for row in rows]
  steps = [int(row.split("|")[3]) for row in rows]
  had = [o["big_batch"] for o in observations]  # the batch each step had
  assert batches == list(dict.fromkeys(had)) and sum(steps) == len(observations)
  assert steps == [had.count(b) for b in batches]


def test_a_step_the_guard_outside_rejects_never_reaches_the_engine_and_replays():
  """`divergence_guard(adaptive(...))`: a NaN loss and a loss spike are rejected by the guard
  before the engine reads them; the engine's state, and its `seen` count, stay as they were,
  and the replay passes over those rows."""
  rng = np.random.default_rng(3)
  settings = dict(SETTINGS, base_steps=600)
  tx = date.divergence_guard(date.adaptive(
      lambda learning_rate: optax.adamw(learning_rate, weight_decay=0.1), SCHEDULE, **settings))
  params = {"w": jnp.ones(4)}
  state = tx.init(params)

  @jax.jit
  def step(state, grads, small, big, loss):
    norms = date.GradientSqNorms(small, big, 4, 256)
    return tx.update({"w": grads}, state, params, grad_sq_norms=norms, value=loss)[1]

  observations, decisions, rejected = [], [], []
  for t in range(120):
    loss = float("nan") if t in (50, 51) else (40.0 if t == 70 else 2.3 * math.exp(-t / 60))
    skipped = int(optax.tree.get(state, "DivergenceGuardState").num_skipped)
    state = step(state, jnp.asarray(rng.normal(size=4), jnp.float32),
                 jnp.float32(5.0 + 10 * rng.random()), jnp.float32(1.0 + rng.random()),
                 jnp.float32(loss))
    rejected.append(int(optax.tree.get(state, "DivergenceGuardState").num_skipped) > skipped)
    engine = optax.tree.get(state, "AdaptiveState")
    observations.append(jax.tree.map(lambda x: x.item(), engine.observation._asdict()))
    decisions.append(progress_lib.decisions(engine))
  seen = [o["seen"] for o in observations]
  assert rejected[50] and rejected[51]  # the NaN losses at least
  # A step the guard rejected was never read: the count stands; every other one moves it.
  assert [b - a for a, b in zip([0] + seen, seen)] == [int(not r) for r in rejected]
  assert _same(decisions, [{k: d[k] for k in decisions[0]}
                           for d in date.replay(observations, SCHEDULE, **settings)]) is None


def test_a_replay_needs_every_step_from_the_first(tmp_path):
  import gzip  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  from dateopt.train import engine_log  # the train extra
  shutil.copy(RECORDED / "divergence" / "recipe.json", tmp_path / "recipe.json")
  with gzip.open(RECORDED / "divergence" / "engine.jsonl.gz", "rt") as f:
    lines = f.read().splitlines()
  (tmp_path / "engine.jsonl").write_text("\n".join(lines[4:]) + "\n")  # resumed elsewhere
  with pytest.raises(ValueError, match="every step from 1, and step 5 comes where step 1"):
    engine_log.replay_run(tmp_path)
  (tmp_path / "engine.jsonl").write_text("")
  with pytest.raises(ValueError, match="has no rows"):
    engine_log.replay_run(tmp_path)
  assert engine_log.main([str(tmp_path / "nowhere")]) == 2  # one line, status 2
