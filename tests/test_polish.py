"""Final Polishing: precise BN against hand-computed moments, and the final-epochs switch."""

import json
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import data as data_lib
from dateopt import train
from dateopt.data.augment import ShiftScaleNoise, augment_level
from dateopt.models import GhostBatchNorm, create_model
from dateopt.train import parallel, polish
from dateopt.train.steps import create_train_state

import tiny_config

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow


class TwoBatchNorms(nn.Module):
  """dense -> BN -> relu -> BN: the second BN's inputs depend on the first's train mode."""

  group_size: int | None = None

  @nn.compact
  def __call__(self, x, train=False):
    x = nn.Dense(6, name="dense")(x)
    x = GhostBatchNorm(use_running_average=not train, group_size=self.group_size,
                       momentum=0.9, name="bn1")(x)
    x = nn.relu(x)
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, name="bn2")(x)


def _state(model, inputs):
  return create_train_state(model, optax.sgd(0.1), jnp.asarray(inputs[:2]), seed=0)


def _batches(num_batches=3, batch_size=16, features=5, seed=0):
  rng = np.random.default_rng(seed)
  return [{"inputs": (rng.standard_normal((batch_size, features)) * 3 + 1).astype(np.float32)}
          for _ in range(num_batches)]


def _group_normalize(x, group_size, eps=1e-5):
  groups = x.reshape(len(x) // group_size, group_size, -1).astype(np.float64)
  mean = groups.mean(1, keepdims=True)
  var = groups.var(1, keepdims=True)
  return ((groups - mean) / np.sqrt(var + eps)).reshape(x.shape)


@pytest.mark.parametrize("group_size", [None, 4])
def test_polished_statistics_are_the_exact_moments_of_each_layers_inputs(group_size):
  model = TwoBatchNorms(group_size=group_size)
  batches = _batches()
  state = _state(model, batches[0]["inputs"])
  mesh = parallel.make_mesh()  # 8 simulated devices
  polished = polish.polish_batch_stats(model, state, batches, mesh=mesh)

  # Independent arithmetic: bn1 sees the dense outputs; bn2 sees relu(bn1 in training mode),
  # bn1 normalising each batch (or each group of `group_size` rows) with its own moments.
  kernel = np.asarray(state.params["dense"]["kernel"], np.float64)
  bias = np.asarray(state.params["dense"]["bias"], np.float64)
  dense_out = [b["inputs"].astype(np.float64) @ kernel + bias for b in batches]
  bn1_out = [np.maximum(_group_normalize(h, group_size or len(h)), 0.0) for h in dense_out]
  for name, inputs in (("bn1", np.concatenate(dense_out)), ("bn2", np.concatenate(bn1_out))):
    np.testing.assert_allclose(polished.batch_stats[name]["mean"], inputs.mean(0), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(polished.batch_stats[name]["var"], inputs.var(0), rtol=1e-4,
                               atol=1e-5)


def test_precise_bn_leaves_the_weights_bit_identical():
  model = TwoBatchNorms()
  batches = _batches()
  state = _state(model, batches[0]["inputs"])
  polished = polish.polish_batch_stats(model, state, batches, mesh=parallel.make_mesh())
  for before, after in zip(jax.tree.leaves((state.params, state.opt_state, state.step)),
                           jax.tree.leaves((polished.params, polished.opt_state, polished.step))):
    np.testing.assert_array_equal(np.asarray(before), np.asarray(after))
  assert not np.allclose(polished.batch_stats["bn1"]["mean"], state.batch_stats["bn1"]["mean"])


def test_one_device_and_eight_devices_polish_alike():
  model = create_model("resnet_tiny", num_classes=10, bn_group_size=4)
  inputs = np.random.default_rng(1).standard_normal((3, 32, 40, 1)).astype(np.float32)
  batches = [{"inputs": x} for x in inputs]
  state = _state(model, inputs[0])
  one = polish.polish_batch_stats(model, state, batches,
                                  mesh=parallel.make_mesh(jax.devices()[:1]))
  eight = polish.polish_batch_stats(model, state, batches, mesh=parallel.make_mesh())
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               one.batch_stats, eight.batch_stats)


class NoBatchNorm(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    return nn.Dense(3)(x)


def test_a_model_without_batch_norm_is_returned_unchanged():
  model = NoBatchNorm()
  batches = _batches(1)
  state = _state(model, batches[0]["inputs"])
  assert polish.polish_batch_stats(model, state, batches, mesh=parallel.make_mesh()) is state


def test_weak_augmentation_is_a_quarter_of_the_full_one():
  aug = ShiftScaleNoise(max_shift=8, scale=0.4, noise_std=0.2)
  assert aug.magnitudes("full") == (8, 0.4, 0.2)
  assert aug.magnitudes("weak") == (2, pytest.approx(0.1), pytest.approx(0.05))
  assert aug.magnitudes("none") == (0, 0.0, 0.0)
  assert ShiftScaleNoise(max_shift=1).magnitudes("weak")[0] == 1  # a shift stays a shift
  assert [augment_level(a) for a in (True, False, "weak")] == ["full", "none", "weak"]
  with pytest.raises(ValueError, match="augment must be one of 'full', 'weak', 'none'"):
    augment_level("strong")


def test_training_batches_at_each_augmentation_level():
  ds = data_lib.get_dataset("digits", augment_shift=2, augment_scale=0.2, augment_noise=0.1)
  full, again = ds.train_batch(3, 32, seed=0), ds.train_batch(3, 32, seed=0)
  weak = ds.train_batch(3, 32, seed=0, augment="weak")
  clean = ds.train_batch(3, 32, seed=0, augment=False)
  np.testing.assert_array_equal(full["inputs"], again["inputs"])  # a pure function of the step
  np.testing.assert_array_equal(full["labels"], clean["labels"])
  np.testing.assert_array_equal(clean["inputs"],
                                data_lib.get_dataset("digits").train_batch(3, 32, seed=0)["inputs"])
  distance = lambda batch: np.abs(batch["inputs"] - clean["inputs"]).mean()
  assert 0 < distance(weak) < distance(full)


def test_polish_config_errors_name_the_field(tmp_path):
  config = _polish_config("final_epochs", epochs=50.0)
  with pytest.raises(train.StartupError, match=r"config.polish.epochs=50.0 covers"):
    train.train_and_evaluate(config, str(tmp_path / "a"))
  config = _polish_config("precise")
  with pytest.raises(train.StartupError, match="config.polish.mode must be one of"):
    train.train_and_evaluate(config, str(tmp_path / "b"))
  config = tiny_config.get_config()  # an LSTM: no batch norm to re-estimate
  config.polish.mode = "precise_bn"
  with pytest.raises(train.StartupError, match="has no batch norm"):
    train.train_and_evaluate(config, str(tmp_path / "c"))


STEPS, WINDOW_EPOCHS = 10, 0.2  # digits: 1,437 train examples / 64 = 22 steps an epoch -> 5 steps


def _polish_config(mode, epochs=WINDOW_EPOCHS, checkpoint_every=-1):
  config = train.default_config()
  config.dataset = "digits"
  config.dataset_kwargs = dict(augment_shift=1, augment_scale=0.2, augment_noise=0.1)
  config.model = "resnet_tiny"
  config.model_kwargs = dict(num_filters=4)
  config.baseline = dict(batch_size=64, num_epochs=2, optimizer="momentum", learning_rate=0.05,
                         momentum=0.9, warmup_epochs=0.1, decay="cosine")
  config.statistics, config.grad_groups = False, 0
  config.num_train_steps = STEPS
  config.log_every_steps = 5
  config.eval_every_steps = 0
  config.checkpoint_every_steps = checkpoint_every
  config.keep_checkpoints = 20
  config.progress_bar = False
  config.polish.mode, config.polish.epochs, config.polish.batches = mode, epochs, 2
  return config


@pytest.fixture
def data_spy(monkeypatch):
  """Records (step, augmentation level) of every training batch the pipeline makes."""
  calls = []
  original = data_lib.Dataset.train_batch

  def spy(self, step, global_batch_size, **kwargs):
    calls.append((step, augment_level(kwargs.get("augment", True))))
    return original(self, step, global_batch_size, **kwargs)

  monkeypatch.setattr(data_lib.Dataset, "train_batch", spy)
  return calls


@pytest.fixture
def pipelines(monkeypatch):
  """Every training pipeline the trainer opens: [augment, closed] for each, in order."""
  opened = []
  original = data_lib.Dataset.train_iterator

  class Recorded:
    def __init__(self, batches, record):
      self._batches, self._record = batches, record

    def __next__(self):
      return next(self._batches)

    def close(self):
      self._record[1] = True
      self._batches.close()

  def spy(self, *args, **kwargs):
    opened.append([kwargs.get("augment", True), False])
    return Recorded(original(self, *args, **kwargs), opened[-1])

  monkeypatch.setattr(data_lib.Dataset, "train_iterator", spy)
  return opened


def test_final_epochs_close_each_pipeline_they_leave(tmp_path, pipelines):
  train.train_and_evaluate(_polish_config("final_epochs"), str(tmp_path))
  # The augmented pipeline is closed at the switch, the clean one when the run ends.
  assert pipelines == [[True, True], [False, True]]


def _params(state):
  return jax.tree.leaves(state.params)


def test_final_epochs_switch_to_clean_data_at_the_window_and_log_both_evaluations(
    tmp_path, data_spy):
  result = train.train_and_evaluate(_polish_config("both"), str(tmp_path))
  window = 5  # ceil(0.2 epochs x 22 steps)
  # The feed makes each batch one step ahead (its copy to the devices overlaps the step
  # before): step 5's augmented batch is made before the switch and dropped there, and one
  # clean batch past the last step is made and never served.
  assert data_spy[:-2] == ([(s, "full") for s in range(STEPS - window + 1)]
                           + [(s, "none") for s in range(STEPS - window, STEPS + 1)])
  assert data_spy[-2:] == [(0, "none"), (1, "none")]  # precise BN's 2 clean batches
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
  before = [r for r in rows if "eval/before_polish_accuracy" in r]
  after = [r for r in rows if "eval/polished_accuracy" in r]
  assert [r["step"] for r in before] == [STEPS - window] and [r["step"] for r in after] == [STEPS]
  assert {"accuracy", "before_polish_accuracy"} <= set(result.eval_metrics)
  assert result.eval_metrics["accuracy"] == pytest.approx(after[0]["eval/polished_accuracy"])


def test_a_run_resumed_inside_the_window_trains_on_clean_data_as_the_uninterrupted_one(
    tmp_path, data_spy):
  config = _polish_config("final_epochs", checkpoint_every=1)
  whole = train.train_and_evaluate(config, str(tmp_path / "whole"))
  resume_at = STEPS - 2  # inside the 5-step window
  resumed_dir = tmp_path / "resumed"
  shutil.copytree(tmp_path / "whole" / "checkpoints" / str(resume_at),
                  resumed_dir / "checkpoints" / str(resume_at))
  data_spy.clear()
  resumed = train.train_and_evaluate(config, str(resumed_dir))
  # Steps 8 and 9 on clean data (and step 10's batch, made ahead and never served).
  assert data_spy == [(resume_at, "none"), (resume_at + 1, "none"), (resume_at + 2, "none")]
  for a, b in zip(_params(whole.state), _params(resumed.state)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_an_adaptive_run_enters_its_window_between_logged_steps(tmp_path, data_spy, tiny):
  # MNIST-1D LSTM; its 960 examples at B0=16: 60 steps an epoch. No logged step before the
  # end: progress is read every step.
  config = tiny(strategy="adaptive", checkpoint_every_steps=-1, log_every_steps=1000)
  config.polish.mode, config.polish.epochs = "final_epochs", 0.2  # the last 12 baseline steps
  result = train.train_and_evaluate(config, str(tmp_path))
  levels = [level for _, level in data_spy]
  switch = levels.index("none")
  assert set(levels[:switch]) == {"full"} and set(levels[switch:]) == {"none"}
  assert 0 < switch < result.steps  # the window began before the run's last step
  assert "before_polish_accuracy" in result.eval_metrics
