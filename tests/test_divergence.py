"""DATE never reports a diverged run as finished (step 10): trust in the progress, the watch,
the optax API and the trainer's stop."""

import dataclasses
import doctest
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import date, transforms
from dateopt.date import _divergence as divergence
from dateopt.date import _noise as noise_lib

import conftest

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_docstring_examples():
  result = doctest.testmod(divergence, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0


# --- The watch, on loss sequences -------------------------------------------------------------

def _watch(losses, progress=0.1, horizon=date.EngineConfig().horizon):
  """The watch after `losses`, and the steps it judged diverged."""
  state, flagged = divergence.init_watch(), []
  update = jax.jit(divergence.update_watch, static_argnames="config")
  for step, loss in enumerate(losses):
    fraction = progress(step) if callable(progress) else progress
    state = update(state, jnp.float32(loss), step=jnp.int32(step),
                   progress_fraction=jnp.float32(fraction),
                   config=date.EngineConfig(horizon=horizon))
    if int(state.diverged_steps):
      flagged.append(step)
  return state, flagged


def _healthy_losses(steps=600, seed=0):
  """A chance-level plateau, a fall to a low loss, and heavy-tailed batch noise with spikes."""
  rng = np.random.default_rng(seed)
  t = np.arange(steps)
  level = np.where(t < 60, 2.3, 0.05 + 2.25 * np.exp(-(t - 60) / 80.0))
  noisy = level * rng.lognormal(0.0, 0.3, steps)
  noisy[rng.choice(np.arange(100, steps), 8, replace=False)] *= 40  # single-batch spikes
  noisy[rng.choice(np.arange(100, steps), 4, replace=False)] = 1e4  # and wild ones
  return noisy


def test_healthy_losses_never_fire():
  for seed in range(3):
    _, flagged = _watch(_healthy_losses(seed=seed), progress=lambda s: s / 600)
    assert flagged == []


def test_relapse_to_chance_is_diverged_and_recovery_needs_the_loss_back_near_its_best():
  losses = [2.3] * 10 + [1.5] * 100 + [2.3] * 60 + [1.8] * 60 + [1.5] * 100
  state, flagged = _watch(losses, horizon=1000)  # a patience far beyond its ~110 diverged steps
  first = flagged[0]
  assert 110 < first < 130  # relapsed half of 0.8 above its best of 1.5
  assert 170 + 1 < 10 + 100 + 60 + 60 < flagged[-1]  # 1.8 is not back near 1.5: still diverged
  assert not int(state.diverged_steps)  # 1.5 is: healthy again
  assert int(state.divergences) == 1 and float(state.lr_scale) < 1.0


def test_blow_up_and_no_learning_are_diverged():
  _, flagged = _watch([2.3] * 10 + [9.0] * 20)
  assert flagged and flagged[0] < 20
  progress = lambda step: step / 100  # a quarter of the baseline's steps at step 25
  _, flagged = _watch([2.3] * 150, progress=progress)
  assert flagged[0] == date.EngineConfig().horizon - 1  # and not before `horizon` losses
  _, flagged = _watch([2.3] * 10 + [1.0] * 140, progress=progress)  # learnt: no alarm
  assert flagged == []


def test_a_non_finite_loss_counts_as_diverged_and_leaves_the_statistics_alone():
  state, flagged = _watch([2.3] * 20 + [float("nan")])
  assert flagged == [20] and np.isfinite(float(state.ema))


def test_patience_gives_up_and_the_lr_scale_halves_every_ten_steps():
  """A diverged run's LR halves every `warm_in` (10) steps, down to its floor, and the run is
  given up after `horizon` (25) diverged steps."""
  state, _ = _watch([2.3] * 10 + [9.0] * 40, horizon=25)
  assert bool(state.gave_up)
  flagged_steps = int(state.diverged_steps)
  floor = date.EngineConfig(horizon=25).min_lr_scale
  assert float(state.lr_scale) == pytest.approx(max(0.5 ** -(-flagged_steps // 10), floor))


def _watch_states(losses, horizon):
  """The watch after each of `losses` (progress 0.1 throughout)."""
  state, states = divergence.init_watch(), []
  update = jax.jit(divergence.update_watch, static_argnames="config")
  for step, loss in enumerate(losses):
    state = update(state, jnp.float32(loss), step=jnp.int32(step),
                   progress_fraction=jnp.float32(0.1),
                   config=date.EngineConfig(horizon=horizon))
    states.append(state)
  return states


def test_a_recovering_run_keeps_its_lr_and_its_patience():
  # Learnt to 0.5, relapsed to 2.0 (diverged), then falling back by 0.1 every 10 steps:
  # 4x `fall_share` · start (0.023 a look) -- the grown main-job run's recovery after its spike.
  relapse = [2.3] * 10 + [0.5] * 100 + [2.0] * 20
  falling = list(np.linspace(2.0, 0.55, 146))
  states = _watch_states(relapse + falling + [0.5] * 40, horizon=40)
  diverged = [i for i, s in enumerate(states) if int(s.diverged_steps)]
  assert diverged[0] < len(relapse) <= diverged[-1]  # diverged through most of the fall
  in_fall = [states[i] for i in diverged if i >= len(relapse) + CUT_LAG]
  assert len(in_fall) > 40  # more diverged steps than the patience...
  assert len({float(s.lr_scale) for s in in_fall}) == 1  # ...yet no cut while it falls
  assert not bool(states[-1].gave_up) and not int(states[-1].diverged_steps)  # recovered
  assert int(states[-1].stalled_total) < 40 < int(states[-1].diverged_total)
  # The same relapse held at 2.0 is cut every CUT_EVERY steps and given up at the patience.
  stuck = _watch_states(relapse + [2.0] * 146, horizon=40)
  assert bool(stuck[-1].gave_up) and int(stuck[-1].stalled_total) >= 40
  assert float(stuck[-1].lr_scale) < float(states[-1].lr_scale)


CUT_LAG = 10  # the 5-step loss needs a few steps to turn from the plateau into the fall


# --- The engine: credit only the progress made ------------------------------------------------

def _sq_norms(noise_scale, batch, grad_sq=1.0, groups=4):
  trace = noise_scale * grad_sq
  small = batch // groups
  return date.GradientSqNorms(grad_sq + trace / small, grad_sq + trace / batch, small, batch)


def _engine(**kwargs):
  options = dict(base_batch_size=32, batch_size=512, base_steps=10_000)
  options.update(kwargs)
  return date.adaptive(lambda learning_rate: optax.sgd(learning_rate),
                       optax.constant_schedule(0.1), **options)


def test_the_gain_does_not_rise_while_the_signal_reads_as_noise_alone():
  """Readings whose |G|² estimate is negative (noise only) pull the |G|² EMA below 0, where
  the measured gain is k = 16 and says nothing: from then on the gain does not rise. How fast
  the gain may rise is test_batch_growth's hold-release test."""
  tx, params = _engine(), {"w": jnp.ones(2)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  for _ in range(3 * date.EngineConfig().warm_in):
    _, state = update(params, state, params, grad_sq_norms=_sq_norms(300.0, 512))
  negative_signal = date.GradientSqNorms(10.0, 1.0, 128, 512)  # |G|² estimate < 0: noise only
  untrusted = 0
  for _ in range(60):
    before = float(state.gain)
    _, state = update(params, state, params, grad_sq_norms=negative_signal)
    if float(state.noise.grad_sq_ema) <= 0:
      untrusted += 1
      assert float(state.gain) <= before * (1 + 1e-6)
  assert untrusted > 10 and float(state.gain) < 16.0


def test_guard_backoff_credits_its_share_and_a_skipped_step_credits_nothing():
  tx = date.divergence_guard(_engine(batch_size=32))  # k = 1: each step's gain is 1
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  _, state = update(params, state, params, grad_sq_norms=_sq_norms(10.0, 32), value=1.0)
  assert float(state.inner_state.progress) == pytest.approx(1.0)
  state = state._replace(lr_multiplier=jnp.float32(0.25))  # as after two back-offs
  _, state = update(params, state, params, grad_sq_norms=_sq_norms(10.0, 32), value=1.0)
  assert float(state.inner_state.progress) == pytest.approx(1.25)
  nan = {"w": jnp.array([jnp.nan, 1.0])}
  _, state = update(nan, state, params, grad_sq_norms=_sq_norms(10.0, 32), value=1.0)
  assert int(state.num_nonfinite) == 1 and float(state.inner_state.progress) == pytest.approx(1.25)


def test_a_diverged_engine_holds_progress_cuts_the_lr_and_gives_up():
  tx, params = _engine(config=date.EngineConfig(horizon=15)), {"w": jnp.ones(2)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  sq = _sq_norms(100.0, 512)
  for _ in range(10):
    _, state = update(params, state, params, grad_sq_norms=sq, value=2.3)
  lr = float(optax.tree.get(state, "learning_rate"))
  while not bool(date.diverged(state)):  # blowing up: a few steps until the mean is 2x
    progress = float(state.progress)
    _, state = update(params, state, params, grad_sq_norms=sq, value=50.0)
    assert int(state.count) < 20
  assert float(state.progress) == progress  # the diverged step credits nothing
  assert float(optax.tree.get(state, "learning_rate")) == pytest.approx(lr * 0.5, rel=1e-5)
  for _ in range(14):
    updates, state = update(params, state, params, grad_sq_norms=sq, value=50.0)
  assert bool(date.gave_up(state)) and float(state.progress) == progress
  assert not np.any(np.asarray(updates["w"]))  # nothing more is applied
  with pytest.raises(ValueError, match="EngineConfig.horizon"):  # the patience is the horizon
    _engine(config={"horizon": 0})


# --- Where the watch never fires, it changes nothing, bit for bit ---------------------------------

def _family(name):
  return {"sgd": lambda learning_rate: optax.sgd(learning_rate, momentum=0.9),
          "adam": lambda learning_rate: optax.adam(learning_rate),
          "lars": lambda learning_rate: transforms.lars(learning_rate, momentum=0.9,
                                                        weight_decay=1e-4)}[name]


def _train(family, multiple, watch):
  """40 guarded steps of a small regression at `multiple` x batch 16; its final params."""
  key = jax.random.PRNGKey(0)
  w_true = jax.random.normal(key, (8,))
  params = {"w": jnp.zeros(8), "b": jnp.zeros(())}
  loss_fn = lambda p, batch: 0.5 * jnp.mean((batch["x"] @ p["w"] + p["b"] - batch["y"]) ** 2)
  grad_fn = date.grouped_value_and_grad(loss_fn, 4)
  lr = {"sgd": 0.05, "adam": 0.01, "lars": 0.1}[family]
  tx = date.divergence_guard(date.adaptive(
      _family(family), optax.cosine_decay_schedule(lr, 200), base_batch_size=16,
      batch_size=16 * multiple, base_steps=200, warmup_steps=5, watch=watch))
  state = tx.init(params)

  @jax.jit
  def step(params, state, batch):
    loss, grads, sq = grad_fn(params, batch)
    updates, state = tx.update(grads, state, params, grad_sq_norms=sq, value=loss)
    return optax.apply_updates(params, updates), state

  for i in range(40):
    x = jax.random.normal(jax.random.fold_in(key, i), (16 * multiple, 8))
    batch = {"x": x, "y": x @ w_true + 0.3 * jax.random.normal(jax.random.fold_in(key, 1000 + i),
                                                               (16 * multiple,))}
    params, state = step(params, state, batch)
  return params, state


@pytest.mark.parametrize("family", ["sgd", "adam", "lars"])
@pytest.mark.parametrize("multiple", [1, 8])
def test_params_are_bit_identical_with_the_watch_on_and_off(family, multiple):
  on, on_state = _train(family, multiple, watch=True)
  off, off_state = _train(family, multiple, watch=False)
  assert int(optax.tree.get(on_state, "DivergenceWatchState").count) == 40  # it watched
  watch = optax.tree.get(on_state, "DivergenceWatchState")
  assert int(watch.divergences) == 0 and int(watch.holds) == 0  # it never fired
  jax.tree.map(np.testing.assert_array_equal, on, off)
  assert float(on_state.inner_state.progress) == float(off_state.inner_state.progress)


# --- The trainer: status 1, one line, the last healthy checkpoint kept ------------------------

_ENV = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=conftest.SLOW_COLLECTIVES)


def _diverging_command(workdir, *flags):
  """`dateopt-train` on the LSTM at 1,000x its tuned LR, a checkpoint every 5 steps."""
  return [sys.executable, "-m", "dateopt.cli", "--config",
          os.path.join(REPO, "configs", "mnist1d_lstm.py"), "--workdir", str(workdir),
          "--config.strategy=adaptive", "--config.baseline.learning_rate=2.0",
          "--config.progress_bar=False", "--config.checkpoint_every_steps=5",
          "--config.dataset_kwargs.num_samples=4000", "--config.eval_every_steps=0", *flags]


def test_a_diverged_adaptive_run_stops_with_status_1_and_keeps_its_healthy_checkpoint(tmp_path):
  done = subprocess.run(_diverging_command(tmp_path), capture_output=True, text=True, env=_ENV,
                        timeout=600, check=False)
  assert done.returncode == 1, done.stderr[-3000:]
  last_line = done.stderr.strip().splitlines()[-1]
  assert last_line.startswith("dateopt-train: stopped: the adaptive run diverged at step ")
  for word in ("loss", "gain", "LR", "last healthy checkpoint"):
    assert word in last_line
  assert "Traceback" not in done.stderr and "final:" not in done.stdout
  diverged_at = int(last_line.split("diverged at step ")[1].split()[0])
  saved = sorted(int(name) for name in os.listdir(tmp_path / "checkpoints") if name.isdigit())
  assert saved and max(saved) < diverged_at  # nothing saved while diverged
  assert f"step {max(saved)}," in last_line
  assert not os.path.exists(tmp_path / "final_metrics.json")


def _diverging_run(workdir):
  """`_diverging_command`, slow to give up, with 2 checkpoints kept and every step logged."""
  return subprocess.Popen(
      _diverging_command(workdir, "--config.divergence_watch=True",
                         "--config.keep_checkpoints=2", "--config.log_every_steps=1"),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_ENV)


def _rows(metrics):
  """The complete rows of metrics.jsonl (a line still being written is left out)."""
  if not os.path.exists(metrics):
    return []
  with open(metrics, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.endswith("\n")]


def _keep_rows_up_to(metrics, step):
  """What a resumed run does to metrics.jsonl first: here before it starts, so that every
  row past `step` is the new run's."""
  if os.path.exists(metrics):
    kept = [row for row in _rows(metrics) if row["step"] <= step]
    with open(metrics, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(row) + "\n" for row in kept)


def _wait_until_diverged(proc, metrics, deadline_seconds=300):
  """Until metrics.jsonl shows 8 steps the engine calls diverged."""
  deadline = time.monotonic() + deadline_seconds
  while time.monotonic() < deadline:
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    if sum(row.get("train/date/diverged_steps", 0) > 0 for row in _rows(metrics)) >= 8:
      return
    time.sleep(0.2)
  raise AssertionError("the run never diverged")


def test_a_stop_while_diverged_saves_nothing_and_keeps_the_last_healthy_checkpoint(tmp_path):
  """Three SIGTERMs, each while DATE calls the run diverged: each used to save the diverged
  state, and with 2 kept the third had rotated every healthy checkpoint out."""
  saved_before = None
  for _ in range(3):
    _keep_rows_up_to(tmp_path / "metrics.jsonl", max(saved_before or [0]))
    proc = _diverging_run(tmp_path)
    _wait_until_diverged(proc, tmp_path / "metrics.jsonl")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr[-3000:]
    message = stderr.strip().splitlines()[-1]
    saved = sorted(int(n) for n in os.listdir(tmp_path / "checkpoints") if n.isdigit())
    assert message.startswith("dateopt-train: preempted (SIGTERM) at step "), message
    since = int(message.split("diverged (since step ")[1].split(")")[0])
    assert saved and max(saved) < since, (saved, message)  # nothing saved while diverged
    assert message.endswith(f"The last healthy checkpoint, step {max(saved)}, is kept in "
                            f"{tmp_path / 'checkpoints'}; rerun the same command to resume "
                            "from it."), message
    assert saved_before is None or saved == saved_before  # the reruns replay to the same end
    saved_before = saved


def test_the_last_healthy_checkpoint_is_the_newest_before_the_divergence_began():
  from dateopt.train.diverged import EngineHealth
  health = EngineHealth(diverged=True, gave_up=False, diverged_at=12, diverged_steps=6,
                        stalled_steps=0, gradient_jumps=0, loss=9.0, first_loss=2.3,
                        best_loss=2.0, gain=1.0, lr_scale=0.5)
  # The divergence began at the 13th step: the checkpoint of step 15 was saved as it began,
  # before the smoothed loss showed it.
  assert health.last_healthy([5, 10, 15]) == 10
  assert health.last_healthy([12]) == 12 and health.last_healthy([13, 15]) is None
  assert dataclasses.replace(health, diverged_at=-1).last_healthy([5, 10, 15]) == 15


def test_an_exploding_gradient_is_skipped_before_it_reaches_the_optimizer():
  tx = date.adaptive(lambda learning_rate: optax.adam(learning_rate),
                     optax.constant_schedule(1e-2), base_batch_size=32, batch_size=512,
                     base_steps=10_000)
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  for _ in range(12):
    _, state = update(params, state, params, grad_sq_norms=_sq_norms(100.0, 512), value=2.0)
  before = state
  big = _sq_norms(100.0, 512, grad_sq=1e5)  # |G_B|² 1e5 x what the EMAs expect
  updates, state = update({"w": jnp.full(2, 300.0)}, state, params, grad_sq_norms=big, value=2.0)
  assert int(state.watch.gradient_jumps) == 1 and not np.any(np.asarray(updates["w"]))
  assert float(state.progress) == float(before.progress) and int(state.count) == 12
  jax.tree.map(np.testing.assert_array_equal, state.inner_state, before.inner_state)
  jax.tree.map(np.testing.assert_array_equal, state.noise, before.noise)  # not measured
  _, state = update(params, state, params, grad_sq_norms=_sq_norms(100.0, 512, grad_sq=30.0),
                    value=2.0)  # 30x: a large gradient, not an explosion
  assert int(state.watch.gradient_jumps) == 1 and int(state.count) == 13


def test_gradients_that_keep_exploding_give_up_at_the_patience():
  # Every step skipped leaves the loss, the EMAs and the progress as they were: without a
  # count the run would walk to its last step and "finish" (the main job at 1000x its LR).
  tx = date.adaptive(lambda learning_rate: optax.adam(learning_rate),
                     optax.constant_schedule(1e-2), base_batch_size=32, batch_size=512,
                     base_steps=10_000, config=date.EngineConfig(horizon=20))
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  for _ in range(12):
    _, state = update(params, state, params, grad_sq_norms=_sq_norms(100.0, 512), value=2.0)
  big = _sq_norms(100.0, 512, grad_sq=1e5)
  for step in range(20):
    assert not bool(date.gave_up(state)), step
    _, state = update(params, state, params, grad_sq_norms=big, value=2.0)
  assert int(state.watch.gradient_jumps) == 20 and bool(date.gave_up(state))
  assert not int(state.watch.divergences)  # the loss rules never fired: the jumps alone


def test_the_stop_message_names_the_skipped_gradients():
  from dateopt.train.diverged import DivergedError, EngineHealth
  health = EngineHealth(diverged=False, gave_up=True, diverged_at=-1, diverged_steps=0,
                        stalled_steps=0, gradient_jumps=100, loss=3.5, first_loss=2.3,
                        best_loss=2.3, gain=3.17, lr_scale=1.0)
  with pytest.raises(DivergedError, match=r"^stopped: the adaptive run skipped 100 steps whose "
                     r"gradient exploded or was not finite \(smoothed loss 3.5, against 2.3 "
                     r"at the start and 2.3 at its best; gain 3.17, LR 3.93\)\. No checkpoint "
                     r"was saved before it\."):
    health.raise_if_gave_up(3.93, None, None)


def test_has_learnt_waits_for_the_smoothed_loss_at_learnt_times_the_start():
  """0.8 · 2.3 = 1.84. The watch's mean weighs its first 20 losses equally (2.05 after ten 2.3s
  and ten 1.8s), then decays at 0.95: 1.8 + 0.25 · 0.95ᵐ ≤ 1.84 at m = 36, the 46th 1.8.
  A 1.9 plateau never gets there."""
  for losses, learnt in [([2.3] * 10 + [1.9] * 200, False), ([2.3] * 10 + [1.8] * 30, False),
                         ([2.3] * 10 + [1.8] * 60, True), ([2.3] * 5, False)]:
    watch, _ = _watch(losses)
    assert bool(divergence.has_learnt(watch, date.EngineConfig())) == learnt, losses[-1]


def test_a_rising_loss_walks_at_the_baselines_pace_without_measuring():
  tx, params = _engine(), {"w": jnp.ones(2)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  for loss in [2.3] * 10 + [0.5] * 100:  # learnt
    _, state = update(params, state, params, grad_sq_norms=_sq_norms(300.0, 512), value=loss)
  assert float(state.gain) > 5 and not bool(divergence.loss_rising(state.watch, date.EngineConfig()))
  rising = _sq_norms(9000.0, 512)  # the gradient of a loss on its way up looks like noise
  for _ in range(5):  # 0.5 -> 1.0 is 28% of the way back to 2.3: seen within a few steps
    _, state = update(params, state, params, grad_sq_norms=rising, value=1.0)
  assert bool(divergence.loss_rising(state.watch, date.EngineConfig())) and not bool(date.diverged(state))
  noise, progress = state.noise, float(state.progress)
  _, state = update(params, state, params, grad_sq_norms=rising, value=1.0)
  assert float(state.gain) == 1.0 and int(state.watch.holds) >= 2
  assert float(state.progress) - progress == pytest.approx(1.0)  # the baseline's pace
  jax.tree.map(np.testing.assert_array_equal, state.noise, noise)  # not measured


def test_a_wobble_under_the_hold_leaves_the_gain_to_its_readings():
  """Five losses of 0.7 after a best of 0.519 put the 5-step mean 6.5% of the gains above it
  (test_batch_growth's wobble), under hold_share: no hold. Readings of 3,000 lift the gain
  as the same steps without the loss do."""
  tx, params = _engine(), {"w": jnp.ones(2)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  for loss in [2.3] * 10 + [0.5] * 85:
    _, state = update(params, state, params, grad_sq_norms=_sq_norms(300.0, 512), value=loss)
  assert float(state.gain) == pytest.approx(noise_lib.adascale_gain(300.0, 32, 512), rel=1e-5)
  bump = _sq_norms(3000.0, 512)
  watched, unwatched = state, state
  for _ in range(5):
    previous = float(watched.gain)
    _, watched = update(params, watched, params, grad_sq_norms=bump, value=0.7)
    _, unwatched = update(params, unwatched, params, grad_sq_norms=bump)
    assert float(watched.gain) == float(unwatched.gain) > previous  # measured, not held
  assert not bool(divergence.loss_rising(watched.watch, date.EngineConfig()))


def test_after_a_bump_the_gain_and_the_batch_follow_the_readings_once_the_loss_is_back():
  """A growing run sits at 512 on readings of 300 (512 · 1,024 > λ · B_noise = 1,024 · 300).
  Three losses of 1.0 after a best of ~0.5 are a hold (gain 1). Back at 0.52, near its best,
  with readings of 3,000: the gain follows them again, at
  most `gain_rise` a step, past the gain it had before the bump, and the batch climbs at the
  growth rule's next look."""
  tx = _engine(batch_size=1024, batch_sizes=date.batch_ladder(32, 1024),
               config=date.EngineConfig(noise_batch_exponent=0.0))  # the readings as measured
  params = {"w": jnp.ones(2)}
  update = jax.jit(tx.update)
  state = tx.init(params)

  def train(state, losses, noise_scale):
    gains = []
    for loss in losses:
      sq_norms = _sq_norms(noise_scale, int(date.next_batch_size(state)))
      _, state = update(params, state, params, grad_sq_norms=sq_norms, value=loss)
      gains.append(float(state.gain))
    return state, gains

  state, _ = train(state, [2.3] * 10 + [0.5] * 110, 300.0)
  before = float(state.gain)
  assert int(state.batch_size) == 512
  assert before == pytest.approx(noise_lib.adascale_gain(300.0, 32, 512), rel=1e-5)
  state, _ = train(state, [1.0] * 3, 300.0)
  assert bool(divergence.loss_rising(state.watch, date.EngineConfig())) and float(state.gain) == 1.0
  state, gains = train(state, [0.52] * 60, 3000.0)
  assert not bool(divergence.loss_rising(state.watch, date.EngineConfig()))
  rises = [b / a for a, b in zip(gains, gains[1:])]
  assert max(rises) <= 2 * (1 + date.EngineConfig().gain_rise) + 1e-6  # a rung up may double it
  assert max(gains) > before * (1 + date.EngineConfig().gain_rise)
  assert int(state.batch_size) == 1024

def _gave_up_on(losses):
  """An engine fed `losses` until it gives up; its health as the trainer reads it."""
  from dateopt.train.diverged import EngineHealth
  tx, params = _engine(base_steps=400, config=date.EngineConfig(horizon=20)), {"w": jnp.ones(2)}
  state, update = tx.init(params), jax.jit(tx.update)
  for loss in losses:
    _, state = update(params, state, params, grad_sq_norms=_sq_norms(100.0, 512), value=loss)
    if bool(date.gave_up(state)):
      return EngineHealth.read(state)
  raise AssertionError("the engine never gave up")


def test_a_run_that_never_learns_is_told_to_check_its_data_not_its_lr():
  """Shuffled labels: the loss sits at chance. That is no divergence of the LR's making."""
  from dateopt.train.diverged import DivergedError
  health = _gave_up_on([2.3] * 2000)
  assert health.never_learnt
  with pytest.raises(DivergedError) as stopped:
    health.raise_if_gave_up(0.1, "/run/checkpoints", 40)
  message = str(stopped.value)
  assert message.startswith(f"stopped: the adaptive run has not learnt: in "
                            f"{health.losses_seen} steps its smoothed loss never fell 10% below "
                            f"its start (2.3 at the start, 2.3 at its best, 2.3 now). The last "
                            f"healthy checkpoint, step 40, is kept in /run/checkpoints."), message
  assert "the data" in message and "plateau" in message and "Lower the" not in message


def test_a_run_that_blows_up_is_still_told_to_lower_its_lr():
  from dateopt.train.diverged import DivergedError
  health = _gave_up_on([2.3] * 20 + [50.0] * 2000)
  assert not health.never_learnt
  with pytest.raises(DivergedError, match=r"diverged at step \d+ .* Lower the baseline's "
                                          r"learning rate"):
    health.raise_if_gave_up(0.1, None, None)
