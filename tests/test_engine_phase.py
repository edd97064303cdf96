"""The engine's phase (`date/phase`): which of PHASES a run is in, read from its state."""

import jax
import jax.numpy as jnp
import optax
import pytest

from dateopt import date
from dateopt.date import _noise as noise_lib
from dateopt.date import _progress as progress_lib

PHASES = progress_lib.PHASES
WARMUP = 5


def _engine(base_steps=10_000, **kwargs):
  return date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                       optax.constant_schedule(0.1), base_batch_size=32, batch_size=512,
                       base_steps=base_steps, warmup_steps=WARMUP, **kwargs)


def _sq_norms(noise_scale, batch=512, small=128):
  """Readings whose noise scale (tr Σ / |G|²) is `noise_scale`."""
  g2 = 1.0
  trace = noise_scale * g2
  return noise_lib.GradientSqNorms(small=jnp.float32(g2 + trace / small),
                                   big=jnp.float32(g2 + trace / batch),
                                   small_batch_size=small, big_batch_size=batch)


def _walk(losses, *, base_steps=10_000, **kwargs):
  """The phase name after each step of an engine fed `losses`."""
  tx, params = _engine(base_steps, **kwargs), {"w": jnp.ones(2)}
  state, update = tx.init(params), jax.jit(tx.update)
  read = jax.jit(lambda s: progress_lib.phase(s, base_steps=base_steps, warmup_steps=WARMUP,
                                                config=date.EngineConfig()))
  names = []
  for loss in losses:
    _, state = update(params, state, params, grad_sq_norms=_sq_norms(300.0), value=loss)
    names.append(PHASES[int(read(state))])
  return names, state


@pytest.fixture(scope="module")
def healthy():
  return _walk([2.3] * 20 + [0.5] * 60 + [1.0] * 6)


@pytest.fixture(scope="module")
def blown_up():
  return _walk([2.3] * 10 + [50.0] * 40, config=date.EngineConfig(horizon=15))


@pytest.fixture(scope="module")
def finished():
  return _walk([2.3] * 10 + [0.5] * 100, base_steps=200)


def test_a_healthy_run_warms_up_leaves_its_plateau_learns_and_holds_on_a_bump(healthy):
  names, _ = healthy
  assert names[:WARMUP - 1] == ["warmup"] * (WARMUP - 1)
  assert set(names[WARMUP:20]) == {"plateau"}  # the loss has not fallen yet
  assert names[40:80] == ["learning"] * 40
  assert names[-1] == "hold"  # 0.5 -> 1.0 gives back 28% of the gains
  assert "diverged" not in names and "gave_up" not in names


def test_a_run_that_blows_up_is_diverged_then_gives_up(blown_up):
  names, state = blown_up
  assert names[-1] == "gave_up" and bool(date.gave_up(state))
  first = names.index("diverged")
  assert set(names[first:names.index("gave_up")]) == {"diverged"}


def test_a_run_that_covers_the_baseline_s_steps_is_done(finished):
  names, state = finished
  assert bool(date.progress_done(state, 200)) and names[-1] == "done"
  assert names.index("done") > names.index("learning")


def test_a_run_without_a_loss_has_no_plateau_or_hold():
  tx, params = _engine(), {"w": jnp.ones(2)}
  state = tx.init(params)
  for _ in range(WARMUP + 1):
    _, state = tx.update(params, state, params, grad_sq_norms=_sq_norms(300.0))
  assert PHASES[int(progress_lib.phase(state, base_steps=10_000, warmup_steps=WARMUP,
                                            config=date.EngineConfig()))] == (
      "learning")


def test_the_walks_above_reach_every_phase(healthy, blown_up, finished):
  assert {name for names, _ in (healthy, blown_up, finished) for name in names} == set(PHASES)


def test_each_step_does_what_its_phase_s_row_of_the_table_says():
  """PHASE_RULES read back from a growing run's steps: the gain's bound, the measurement and
  the climb of each phase the loss put a step in (`loss_phase`, the decision's own)."""
  ladder = (32, 64, 128, 256, 512)
  tx = date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                     optax.constant_schedule(0.1), base_batch_size=32, batch_size=512,
                     base_steps=10_000, warmup_steps=WARMUP, batch_sizes=ladder)
  params = {"w": jnp.ones(2)}
  state, update = tx.init(params), jax.jit(tx.update)
  seen = {}
  for loss in [2.3] * 20 + [0.5] * 100 + [1.0] * 6 + [50.0] * 20:
    before = state
    _, state = update(params, state, params, value=loss,
                      grad_sq_norms=_sq_norms(300.0, batch=int(before.batch_size), small=16))
    name = PHASES[int(progress_lib.loss_phase(state.watch, date.EngineConfig()))]
    rule = progress_lib.PHASE_RULES[name]
    seen[name] = seen.get(name, 0) + 1
    measured = state.noise.count > before.noise.count
    assert bool(measured) == rule.measures, (name, loss)
    gain, batch = float(state.gain), int(before.batch_size)
    bound = {"none": float("inf"), "no_rise": float(before.gain), "one": 1.0}[rule.gain]
    assert gain <= bound * (1 + 1e-6), (name, gain, bound)
    if rule.climb == "stay":
      assert int(state.batch_size) == batch, name
  assert set(seen) == set(progress_lib.PHASE_RULES), seen
