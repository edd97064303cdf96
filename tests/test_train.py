"""End-to-end training: every model family, 1 vs 8 devices, kill-and-resume, multi-host."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from dateopt import date, train
from dateopt.date import _noise as noise_lib
from dateopt.date import _progress as progress_lib

import conftest  # tests/conftest.py: the XLA flags the subprocesses need too
import tiny_config  # tests/tiny_config.py, also used by the subprocess runs

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**overrides):
  """The subprocess tests' tiny MNIST-1D LSTM config, shortened for in-process runs."""
  return tiny_config.with_fields(**{"num_train_steps": 6, "log_every_steps": 2,
                                    "eval_every_steps": -1, "checkpoint_every_steps": -1,
                                    **overrides})


def _write_ptb(tmp_path):
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(30)]
  for split, n in (("train", 400), ("valid", 60), ("test", 60)):
    lines = [" ".join(rng.choice(words, size=12)) for _ in range(n // 12 + 1)]
    (tmp_path / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
  return str(tmp_path)


def _assert_learning(result, workdir):
  assert np.isfinite(result.train_metrics["loss"])
  assert 0.0 <= result.eval_metrics["accuracy"] <= 1.0
  with open(os.path.join(workdir, "recipe.json")) as f:
    stored = json.load(f)
  assert stored["planned"]["batch_size"] == result.recipe.batch_size
  assert stored["polish"]["mode"] in ("none", "precise_bn", "final_epochs", "both")
  assert not [name for name in os.listdir(workdir) if name.endswith(".tmp")]  # staged, renamed
  lines = open(os.path.join(workdir, "metrics.jsonl")).read().splitlines()
  assert any("train/date/noise_scale" in line for line in lines)
  assert any("train/examples_per_second" in line for line in lines)
  # Statistics are computed on the logged steps only: each logged one is fresh, not NaN.
  logged = [json.loads(line) for line in lines if "train/date/grad_norm" in line]
  assert logged and all(np.isfinite(r["train/date/grad_norm"]) for r in logged)
  assert os.listdir(os.path.join(workdir, "tensorboard"))


def test_lstm_classifier_end_to_end(tmp_path):
  result = train.train_and_evaluate(_config(), str(tmp_path))
  assert result.recipe.batch_size == 64 and result.baseline.batch_size == 16
  # LEGW: peak LR x sqrt(4), warmup epochs x 4.
  assert result.recipe.learning_rate == pytest.approx(2 * 3e-3)
  assert result.recipe.warmup_epochs == pytest.approx(0.4)
  _assert_learning(result, str(tmp_path))


def test_resnet_tiny_with_lars_and_polishing(tmp_path):
  config = _config(dataset="digits", model="resnet_tiny")
  config.polish.mode, config.polish.batches = "precise_bn", 2
  config.dataset_kwargs = {}
  config.model_kwargs = dict(bn_group_size=8)  # = the gradient groups' size: 64 / 8
  config.baseline = dict(batch_size=16, num_epochs=1, optimizer="lars", learning_rate=0.5,
                         weight_decay=1e-4, warmup_epochs=0.1, decay="polynomial")
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result.recipe.optimizer == "lars"
  assert "before_polish_accuracy" in result.eval_metrics
  _assert_learning(result, str(tmp_path))


def test_lstm_language_model_end_to_end(tmp_path):
  config = _config(dataset="ptb", data_dir=_write_ptb(tmp_path),
                   model="lstm_lm")
  config.dataset_kwargs = dict(seq_len=5)
  config.model_kwargs = dict(preset="ptb_small", hidden_size=16, num_layers=1)
  config.baseline = dict(batch_size=8, num_epochs=1, optimizer="momentum", learning_rate=0.5,
                         decay="constant")
  config.batch_size = 16
  config.num_train_steps = 4
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  assert np.isfinite(result.eval_metrics["perplexity"])
  _assert_learning(result, str(tmp_path / "run"))


def test_one_device_and_eight_devices_give_the_same_parameters(tmp_path):
  config = _config(num_train_steps=5)
  one = train.train_and_evaluate(config, str(tmp_path / "one"), devices=jax.devices()[:1])
  eight = train.train_and_evaluate(config, str(tmp_path / "eight"))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
               one.state.params, eight.state.params)


@pytest.mark.parametrize("overrides, match", [
    (dict(batch_sise=64), "batch_sise"),
    (dict(model="resnet9000"), "model"),
    (dict(dataset="imagenet9000"), "dataset"),
    (dict(batch_size=60), "batch_size"),
    (dict(eval_batch_size=12), "eval_batch_size"),
    (dict(model="resnet_tiny", dataset="digits", dataset_kwargs={}, model_kwargs={}),
     "grad_groups"),
    (dict(plan={"stratgy": "x"}), "config.plan"),
    (dict(guard_kwargs={"spike": 2.0}), "config.guard_kwargs"),
    (dict(strategy="adaptive", plan={"engine": {"horizon": 1}}), "EngineConfig.horizon"),
])
def test_bad_configs_fail_before_compiling(tmp_path, overrides, match):
  config = _config()
  with config.unlocked():
    for key, value in overrides.items():
      config[key] = value
  with pytest.raises(ValueError, match=match):  # both builders run before any compile
    experiment = train.build_experiment(config)
    train.build_optimizer(config, experiment.recipe)


def test_missing_dataset_files_fail_before_compiling(tmp_path):
  config = _config(dataset="ptb", data_dir=str(tmp_path / "nowhere"), model="lstm_lm")
  config.dataset_kwargs = {}
  config.model_kwargs = {}
  with pytest.raises((FileNotFoundError, ValueError), match="nowhere"):
    train.build_experiment(config)


@pytest.mark.parametrize("field", ["model_kwargs", "dataset_kwargs"])
def test_unknown_registry_keyword_names_the_config_field(field):
  config = _config()
  setattr(config, field, dict(hidden_sise=8))
  # Python's own TypeError, re-raised with the config field in front.
  with pytest.raises(ValueError, match=(rf"^config\.{field}: \w+\(\) got an unexpected "
                                        "keyword argument 'hidden_sise'$")):
    train.build_experiment(config)


def test_adaptive_needs_gradient_groups():
  with pytest.raises(ValueError, match="config.grad_groups"):
    train.build_experiment(_config(strategy="adaptive", grad_groups=0))


def test_adaptive_lars_measures_the_noise_of_the_step_it_takes(tmp_path):
  """plan.noise_of reaches the train step: the same first step logs another noise scale for
  "lars_step" than for "gradient", and the default ("auto") is LARS's step (the arithmetic:
  tests/test_date_dynamic.py)."""
  lars = dict(batch_size=16, num_epochs=2, optimizer="lars", learning_rate=1.0,
              weight_decay=1e-4, warmup_epochs=0.1, decay="polynomial")

  def first_logged(noise_of):
    config = _config(strategy="adaptive", baseline=lars, plan=dict(noise_of=noise_of),
                     num_train_steps=1, log_every_steps=1)
    result = train.train_and_evaluate(config, str(tmp_path / noise_of))
    rows = [json.loads(line) for line in open(tmp_path / noise_of / "metrics.jsonl")]
    return result, next(r for r in rows if "train/date/noise_scale" in r)

  plain, plain_row = first_logged("gradient")
  step, step_row = first_logged("lars_step")
  assert (plain.recipe.noise_of, step.recipe.noise_of) == ("gradient", "lars_step")
  assert plain_row["step"] == step_row["step"] and plain_row["train/loss"] == step_row["train/loss"]
  assert step_row["train/date/noise_scale"] != pytest.approx(plain_row["train/date/noise_scale"],
                                                             rel=0.01)
  # The default plans LARS's step: the recipe the train step above measured from.
  _, auto = train.plan_recipe(_config(strategy="adaptive", baseline=lars), 1200)
  assert auto.noise_of == "auto" and auto.measured_noise_of == step.recipe.measured_noise_of


def test_adaptive_adam_step_measures_in_adams_metric_from_the_second_step(tmp_path):
  """noise_of="adam_step" reaches the train step with the optimizer's state: the first step
  (no second moments yet) reads the gradient's noise, the next ones, from the same
  parameters, another (the arithmetic: tests/test_date_dynamic.py)."""
  adam = dict(batch_size=16, num_epochs=2, optimizer="adam", learning_rate=1e-3,
              warmup_epochs=0.1, decay="cosine")

  def logged(noise_of):
    config = _config(strategy="adaptive", baseline=adam, plan=dict(noise_of=noise_of),
                     num_train_steps=3, log_every_steps=1)
    result = train.train_and_evaluate(config, str(tmp_path / noise_of))
    rows = [json.loads(line) for line in open(tmp_path / noise_of / "metrics.jsonl")]
    return result, [r for r in rows if "train/loss" in r]

  plain, plain_rows = logged("gradient")
  step, step_rows = logged("adam_step")
  assert step.recipe.measured_noise_of == "adam_step"
  assert plain.recipe.measured_noise_of == "gradient"
  first, second = (plain_rows[0], step_rows[0]), (plain_rows[1], step_rows[1])
  assert first[0]["step"] == 1 and first[0]["train/loss"] == first[1]["train/loss"]
  assert first[0]["train/date/noise_scale"] == first[1]["train/date/noise_scale"]
  assert second[0]["train/loss"] == second[1]["train/loss"]
  # After one update v̂ = g₁², the metric is far from the identity (here the reading is
  # infinite: logged as null).
  plain_reading, step_reading = (row["train/date/noise_scale"] for row in second)
  assert plain_reading is not None
  assert step_reading is None or step_reading != pytest.approx(plain_reading, rel=0.01)


def test_bad_baseline_field_is_named(tmp_path):
  config = _config()
  config.baseline = dict(batch_size=16, num_epochs=1, optimizer="adamm", learning_rate=1e-3)
  with pytest.raises(ValueError, match="optimizer"):
    train.build_experiment(config)


# --- Subprocess runs: multi-host ----------------------------------------------
# A run killed by SIGKILL and resumed: tests/test_faults.py (the CLI) and the resumes on 8
# devices in tests/test_batch_growth.py and tests/test_lm_training.py.

def _cli(workdir, *flags, env_devices=8, extra_env=None):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={env_devices} "
                                  f"{conftest.SLOW_COLLECTIVES} {conftest.CHILD_FLAG}",
             JAX_PLATFORMS="cpu", **(extra_env or {}))
  return ([sys.executable, "-m", "dateopt.cli", "--config",
           os.path.join(REPO, "tests", "tiny_config.py"), "--workdir", str(workdir), *flags],
          env)


def _final_state(workdir, like=None):
  """The latest checkpoint; `like` gives the layout when it was saved on other devices."""
  import orbax.checkpoint as ocp
  target = None
  if like is not None:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), like)
  with ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints")) as manager:
    step = manager.latest_step()
    return step, manager.restore(step, args=ocp.args.StandardRestore(target))


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_equal_one_process(tmp_path):
  steps = ("--config.num_train_steps=8", "--config.checkpoint_every_steps=8")
  cmd, env = _cli(tmp_path / "single", *steps)
  subprocess.run(cmd, env=env, check=True, capture_output=True)
  port = _free_port()
  procs = []
  for pid in range(2):
    cmd, env = _cli(tmp_path / "multi", *steps, f"--coordinator_address=localhost:{port}",
                    "--num_processes=2", f"--process_id={pid}", env_devices=4)
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
  for p in procs:
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out.decode()[-3000:]
  _, single = _final_state(tmp_path / "single")
  _, multi = _final_state(tmp_path / "multi", like=single)
  single, multi = single["params"], multi["params"]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), single, multi)


def test_logged_learning_rate_is_the_one_the_guarded_optimizer_applies():
  import jax.numpy as jnp
  import optax
  from dateopt.train import steps
  schedule = optax.linear_schedule(0.0, 1.0, 10)
  tx = date.divergence_guard(optax.inject_hyperparams(optax.sgd)(learning_rate=schedule))
  params, grads = {"w": jnp.ones(3)}, {"w": jnp.full(3, 2.0)}
  state = tx.init(params)
  nan = {"w": jnp.full(3, jnp.nan)}
  for g in [grads, grads, nan, nan, grads, grads]:
    updates, new_state = tx.update(g, state, params, value=jnp.float32(1.0))
    logged = steps.applied_learning_rate(state, new_state)
    # Accepted: the update is −lr·g with exactly the logged lr; skipped: 0 applied.
    np.testing.assert_allclose(updates["w"], -2.0 * float(logged) if g is grads else 0.0,
                               rtol=1e-6)
    state = new_state
  # Two skips: the schedule lags the step count, and the multiplier has backed off.
  assert int(state.num_skipped) == 2 and float(state.lr_multiplier) < 1.0
  assert float(logged) != pytest.approx(float(schedule(5)))
  assert steps.applied_learning_rate(optax.sgd(0.1).init(params),
                                     optax.sgd(0.1).init(params)) is None


def test_adaptive_run_stops_by_itself_and_reports_its_steps(tmp_path):
  """DATE adaptive end to end: the run ends when its progress covers the baseline's steps."""
  config = tiny_config.get_config()
  config.strategy, config.grad_groups, config.log_every_steps = "adaptive", 4, 1
  config.plan = dict(noise_scale=50.0)
  result = train.train_and_evaluate(config, str(tmp_path))
  baseline_steps = result.baseline.total_steps           # 2 epochs of 960 at batch 16
  assert result.recipe.adaptive and baseline_steps == 120
  assert baseline_steps // 4 <= result.steps < baseline_steps   # 1 ≤ gain ≤ k = 4
  assert result.predicted_steps == noise_lib.predicted_steps(  # B_noise 50 read × 4^0.2 at 64
      50.0 * 4 ** 0.2, base_batch_size=16, batch_size=64, base_steps=120,
      warmup_steps=result.recipe.warmup_steps)
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  progress = [r["train/date/progress"] for r in rows if "train/date/progress" in r]
  assert progress[-1] >= baseline_steps > progress[-2]     # stopped at the crossing step
  assert max(r["step"] for r in rows if "train/loss" in r) == result.steps
  gains = [r["train/date/gain"] for r in rows if "train/date/gain" in r]
  assert all(1.0 <= g <= 4.0 for g in gains)
  # The phase every logged step: it warms up first, ends done, and never diverges.
  phases = [progress_lib.PHASES[int(r["train/date/phase"])] for r in rows
            if "train/date/phase" in r]
  assert len(phases) == len(progress) and phases[0] == "warmup" and phases[-1] == "done"
  assert not {"diverged", "gave_up"} & set(phases)
  assert any(r.get("run/steps") == result.steps for r in rows)
  timed = [r for r in rows if "train/step_seconds" in r]
  assert timed and all(r["train/examples_per_second"] > 0 for r in timed)
  # The wait for input, apart from the step time: a share of the wall time.
  assert all(0.0 <= r["train/input_share"] <= 1.0 and 0.0 <= r["train/input_seconds"]
             <= r["train/step_seconds"] for r in timed)


def test_an_adaptive_run_writes_nothing_past_its_end(tmp_path):
  """Evals and saves between log steps read the end too: no row or checkpoint after it."""
  config = tiny_config.get_config()
  config.strategy, config.grad_groups = "adaptive", 4
  config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps = 1000, 3, 4
  config.plan = dict(noise_scale=50.0)
  result = train.train_and_evaluate(config, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert max(r["step"] for r in rows) == result.steps < result.recipe.max_steps
  evals = [r["step"] for r in rows if "eval/accuracy" in r]
  assert evals[-1] == result.steps and len(evals) == len(set(evals))
  saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert saved[-1] == result.steps


def test_train_step_static_measure_flag_and_covered_progress():
  """The trainer's step: a Python `measure_noise` flag computes what a traced one does; once
  the progress covers the baseline's steps, the step changes nothing."""
  import functools
  import jax.numpy as jnp
  import optax
  from dateopt.train import experiment, steps
  config = tiny_config.get_config()
  config.strategy, config.grad_groups = "adaptive", 4
  exp = experiment.build_experiment(config)
  tx, _ = experiment.build_optimizer(config, exp.recipe)
  state = steps.create_train_state(exp.model, tx, jnp.zeros((1,) + tuple(exp.dataset.input_shape),
                                                            exp.dataset.input_dtype), seed=0)
  batch = {k: jnp.asarray(v) for k, v in exp.dataset.train_batch(0, 64, seed=0).items()}
  step = functools.partial(steps.train_step, model=exp.model, tx=tx,
                           num_classes=exp.dataset.num_classes, seed=0,
                           grad_groups=4, recipe=exp.recipe)
  static = jax.jit(step, static_argnames="measure_noise")
  traced = jax.jit(step)
  for flag in (True, False):
    want_state, want_metrics = traced(state, batch, measure_noise=jnp.asarray(flag))
    got_state, got_metrics = static(state, batch, measure_noise=flag)
    close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)  # fusion bits
    jax.tree.map(close, got_state, want_state)
    jax.tree.map(close, got_metrics, want_metrics)
  assert float(got_metrics["date/progress"]) > 0
  covered = state.replace(opt_state=optax.tree.set(
      state.opt_state, progress=jnp.float32(exp.recipe.total_steps)))
  idle_state, idle_metrics = static(covered, batch, measure_noise=True)
  jax.tree.map(np.testing.assert_array_equal, idle_state, covered)
  assert np.isnan(float(idle_metrics["loss"]))
  assert float(idle_metrics["date/progress"]) == exp.recipe.total_steps


def test_profile_steps_write_a_trace_tensorboard_opens(tmp_path):
  train.train_and_evaluate(_config(profile_steps="2:3"), str(tmp_path))
  traces = list((tmp_path / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0


@pytest.mark.parametrize("value", ["3:2", "0:4", "10-15", "a:b"])
def test_bad_profile_steps_are_named(value):
  with pytest.raises(ValueError, match=r'config.profile_steps must be a string "first:last"'):
    train.build_experiment(_config(profile_steps=value))
  with pytest.raises(TypeError, match="profile_steps"):  # ml_collections keeps it a string
    _config(profile_steps=10)
