"""Properties DATE's engine keeps in every phase, over random loss and noise profiles.

Whatever the readings, at every step of `date.adaptive` (fixed batch and grown):

  * the gain is in [1, k], k = B/B0 of the step's batch (AdaScale's bounds,
    Johnson et al. 2020, arXiv:2007.05105, section 3);
  * the LR the inner optimizer gets is at most k · lr0, lr0 the baseline's peak LR;
  * the batch a growing run asks for never shrinks, and stays on its ladder;
  * the progress τ never decreases, and a step credits at most k baseline steps;
  * a healthy run (its loss falls with noise and small bumps) never enters the
    "diverged" or "gave_up" phase;
  * together, the walks pass through every phase.

The profiles are drawn from seeded numpy generators: healthy runs, and runs that
blow up, relapse or sit at chance. The engine is the real one, under `jax.jit`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import date
from dateopt.date import _noise as noise_lib
from dateopt.date import _progress as progress_lib

B0, B_MAX, LR0 = 32, 512, 0.1
BASE_STEPS, WARMUP, STEPS = 1_200, 10, 160  # some healthy walks finish
SEEDS = range(8)
LADDER = date.batch_ladder(B0, B_MAX)


def _engine(grows: bool):
  schedule = optax.warmup_cosine_decay_schedule(0.0, LR0, WARMUP, BASE_STEPS)
  return date.adaptive(lambda learning_rate: optax.sgd(learning_rate), schedule,
                       base_batch_size=B0, batch_size=B_MAX, base_steps=BASE_STEPS,
                       warmup_steps=WARMUP, batch_sizes=LADDER if grows else None,
                       config=date.EngineConfig(horizon=60, warm_in=3))


def _noise_profile(rng) -> np.ndarray:
  """B_noise as a random walk in log space, from 10 to 10⁴ (a run's B_noise grows ~10×)."""
  walk = np.cumsum(rng.normal(0.0, 0.15, STEPS)) + np.linspace(0.0, np.log(10.0), STEPS)
  return np.exp(np.clip(np.log(rng.uniform(20, 400)) + walk, np.log(10), np.log(1e4)))


def _healthy_losses(rng) -> np.ndarray:
  """A loss that falls from ~2.3 to a floor within ~100 steps, with 5% batch noise and a few
  small bumps."""
  t = np.arange(STEPS)
  floor, start = rng.uniform(0.1, 0.6), rng.uniform(2.0, 2.5)
  plateau = rng.integers(0, 30)  # some runs sit at chance first
  fall = floor + (start - floor) * np.exp(-np.maximum(t - plateau, 0) / rng.uniform(15, 50))
  bumps = np.zeros(STEPS)
  for at in rng.integers(40, STEPS, size=2):
    bumps += 0.04 * (start - floor) * np.exp(-np.abs(t - at) / 3.0)
  return fall * (1 + 0.05 * rng.normal(size=STEPS)) + bumps


def _unhealthy_losses(rng, kind: str) -> np.ndarray:
  """A run that blows up, relapses after learning, or never leaves chance."""
  healthy = _healthy_losses(rng)
  learnt = int(np.argmax(healthy < 0.5 * healthy[0]))  # the watch's relapse needs a gain first
  at = min(learnt + int(rng.integers(10, 30)), STEPS - 50)
  if kind == "blow_up":
    return np.concatenate([healthy[:at], healthy[at] * np.exp(np.arange(STEPS - at) / 8.0)])
  if kind == "relapse":
    return np.concatenate([healthy[:at], np.full(STEPS - at, healthy[0])])
  return healthy[0] * (1 + 0.05 * rng.normal(size=STEPS))  # "chance"


def _walk(grows: bool, losses, noise_scales):
  """Every step's batch, gain, LR, progress and phase name."""
  columns = _walker(grows)(jnp.asarray(losses, jnp.float32),
                           jnp.asarray(noise_scales, jnp.float32))
  columns = {name: np.asarray(values) for name, values in columns.items()}
  return [{"batch": int(columns["batch"][t]), "next_batch": int(columns["next_batch"][t]),
           "gain": float(columns["gain"][t]), "lr": float(columns["lr"][t]),
           "progress": float(columns["progress"][t]),
           "phase": progress_lib.PHASES[int(columns["phase"][t])]}
          for t in range(len(losses))]


@functools.lru_cache(maxsize=None)
def _walker(grows: bool):
  """The engine's steps over a (losses, noise scales) profile, one `lax.scan` compiled once
  for every walk of its kind. Each step reads |G_b|² at b = B/4 and at the batch B it asked
  for, with |G|² = 1 and tr Σ = the step's noise scale."""
  tx, params = _engine(grows), {"w": jnp.ones(2)}

  def step(state, reading):
    loss, noise_scale = reading
    batch = date.next_batch_size(state)
    small = batch // 4
    norms = noise_lib.GradientSqNorms(small=1 + noise_scale / small, big=1 + noise_scale / batch,
                                      small_batch_size=small, big_batch_size=batch)
    _, after = tx.update(params, state, params, grad_sq_norms=norms, value=loss)
    return after, {"batch": batch, "next_batch": after.batch_size, "gain": after.gain,
                   "lr": after.inner_state.hyperparams["learning_rate"],
                   "progress": after.progress,
                   "phase": progress_lib.phase(after, base_steps=BASE_STEPS,
                                               warmup_steps=WARMUP, config=date.EngineConfig())}

  return jax.jit(lambda losses, noise: jax.lax.scan(step, tx.init(params), (losses, noise))[1])


def _profiles(kind: str):
  for seed in SEEDS:
    rng = np.random.default_rng([seed, len(kind)])
    losses = _healthy_losses(rng) if kind == "healthy" else _unhealthy_losses(rng, kind)
    yield seed, losses, _noise_profile(rng)


@pytest.fixture(scope="module", params=[False, True], ids=["fixed", "grown"])
def walks(request):
  """Each kind of profile: the walks of every seed, for a fixed and a growing batch."""
  return {kind: [_walk(request.param, losses, noise) for _, losses, noise in _profiles(kind)]
          for kind in ("healthy", "blow_up", "relapse", "chance")}


def _all_rows(walks):
  return [row for rows_of_kind in walks.values() for rows in rows_of_kind for row in rows]


def test_the_gain_stays_in_1_to_k_of_the_step_s_batch(walks):
  for row in _all_rows(walks):
    assert 1.0 - 1e-6 <= row["gain"] <= row["batch"] / B0 * (1 + 1e-6), row


def test_the_lr_never_exceeds_k_times_the_baseline_s_peak(walks):
  for row in _all_rows(walks):
    assert row["lr"] <= row["batch"] / B0 * LR0 * (1 + 1e-5), row


def test_the_batch_never_shrinks_and_stays_on_its_ladder(walks):
  for rows in (rows for rows_of_kind in walks.values() for rows in rows_of_kind):
    batches = [row["batch"] for row in rows] + [rows[-1]["next_batch"]]
    assert batches == sorted(batches) and set(batches) <= set(LADDER)


def test_progress_never_falls_and_a_step_credits_at_most_k_baseline_steps(walks):
  for rows in (rows for rows_of_kind in walks.values() for rows in rows_of_kind):
    before = 0.0
    for row in rows:
      assert before <= row["progress"] <= before + row["batch"] / B0 * (1 + 1e-5), row
      before = row["progress"]


def test_a_healthy_run_never_diverges(walks):
  for rows in walks["healthy"]:
    phases = {row["phase"] for row in rows}
    assert not phases & {"diverged", "gave_up"}, phases
    assert "learning" in phases


def test_the_unhealthy_profiles_are_caught(walks):
  """The properties above are not vacuous: the watch fires on these profiles."""
  for kind in ("blow_up", "relapse"):
    caught = [any(row["phase"] in ("diverged", "gave_up") for row in rows)
              for rows in walks[kind]]
    assert all(caught), (kind, caught)
  chance = [{row["phase"] for row in rows} for rows in walks["chance"]]
  assert all("learning" not in phases for phases in chance)


def test_the_walks_pass_through_every_phase(walks):
  assert {row["phase"] for row in _all_rows(walks)} == set(progress_lib.PHASES)


# --- Convergence targets (as optax's common tests have them) ---------------------------------
# A noisy least-squares problem trained for real: date.adaptive over SGD, Adam and LARS, at a
# fixed 8x batch and grown to 8x, must reach the baseline's loss target, end "done" with no
# divergence, and take fewer steps than the baseline's (the noise is small next to the
# signal early, so the gain is well above 1).

REGRESSION_FEATURES, REGRESSION_BASE_STEPS, REGRESSION_LR = 16, 300, 0.05


def _regression(seed: int = 0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(8192, REGRESSION_FEATURES)).astype(np.float32)
  w = rng.normal(size=REGRESSION_FEATURES).astype(np.float32)
  y = x @ w + 0.5 * rng.normal(size=8192).astype(np.float32)
  return x, y


def _mse(w, batch):
  return jnp.mean((batch["x"] @ w - batch["y"]) ** 2)


@pytest.mark.parametrize("family", ["sgd", "adam", "lars"])
@pytest.mark.parametrize("grows", [False, True])
def test_the_engine_trains_a_noisy_regression_to_its_target(family, grows):
  from dateopt import lars  # pylint: disable=import-outside-toplevel
  make = {"sgd": lambda learning_rate: optax.sgd(learning_rate, momentum=0.9),
          "adam": lambda learning_rate: optax.adam(learning_rate),
          "lars": lambda learning_rate: lars(learning_rate, momentum=0.9)}[family]
  x, y = _regression()
  schedule = optax.warmup_cosine_decay_schedule(0.0, REGRESSION_LR, 10, REGRESSION_BASE_STEPS)
  tx = date.adaptive(make, schedule, base_batch_size=16, batch_size=128,
                     base_steps=REGRESSION_BASE_STEPS, warmup_steps=10,
                     batch_sizes=date.batch_ladder(16, 128) if grows else None)
  grad_fn = date.grouped_value_and_grad(_mse, num_groups=4)

  @jax.jit
  def step(w, opt_state, batch):
    loss, grads, sq_norms = grad_fn(w, batch)
    updates, opt_state = tx.update(grads, opt_state, w, grad_sq_norms=sq_norms, value=loss)
    return optax.apply_updates(w, updates), opt_state

  w = jnp.zeros(REGRESSION_FEATURES)
  opt_state, position, steps = tx.init(w), 0, 0
  while not date.progress_done(opt_state, REGRESSION_BASE_STEPS) and steps < 400:
    batch_size = int(date.next_batch_size(opt_state))
    rows = np.arange(position, position + batch_size) % len(x)
    w, opt_state = step(w, opt_state, {"x": x[rows], "y": y[rows]})
    position, steps = position + batch_size, steps + 1
  final = float(_mse(w, {"x": x, "y": y}))
  assert final < 0.3, final  # the noise floor is 0.25
  assert date.progress_done(opt_state, REGRESSION_BASE_STEPS) and not date.diverged(opt_state)
  assert steps < REGRESSION_BASE_STEPS  # the gain bought steps
