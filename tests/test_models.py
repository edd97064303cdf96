"""Tests for dateopt.models: shapes, parameter counts, zero-init, ghost BN, dtypes, LSTMs."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dateopt.models import (
    BN_EPSILON,
    BN_MOMENTUM,
    MODEL_NAMES,
    PTB_PRESETS,
    BasicBlock,
    BottleneckBlock,
    GhostBatchNorm,
    create_model,
)
from dateopt.models.resnet import _make_norm
from import_isolation import assert_not_loaded  # tests/import_isolation.py


def _key(seed: int) -> jax.Array:
  # unsafe_rbg keys: XLA compiles their random ops several times faster than threefry's on CPU.
  return jax.random.key(seed, impl="unsafe_rbg")


def _init(model, x, seed: int = 0):
  return jax.jit(lambda key: model.init(key, x, train=False))(_key(seed))


def _param_count(tree) -> int:
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(tree))


def _abstract_variables(model, x):
  return jax.eval_shape(lambda: model.init(_key(0), x, train=False))


# ---------------------------------------------------------------- create_model


def test_unknown_model_name_lists_the_allowed_names():
  with pytest.raises(ValueError, match="resnet50.*lstm_lm"):
    create_model("vgg16")


@pytest.mark.parametrize("name, kwargs, field", [
    ("lstm_classifier", {"hidden_size": 0}, "hidden_size"),
    ("resnet18", {"bn_group_size": 0}, "bn_group_size"),
    ("resnet_tiny", {"stem": "huge"}, "stem"),
    ("lstm_lm", {"vocab_size": 10, "dropout": 1.5}, "dropout"),
    ("lstm_lm", {"vocab_size": 10, "preset": "ptb_huge"}, "preset"),
    ("lstm_lm", {}, "vocab_size"),
    ("resnet_tiny", {"num_classes": 0}, "num_classes"),
    ("resnet_tiny", {"dtype": jnp.int32}, "dtype"),
])
def test_bad_arguments_name_the_field(name, kwargs, field):
  with pytest.raises(ValueError, match=field):
    create_model(name, **kwargs)


@pytest.mark.parametrize("name, kwargs, builder, keyword", [
    ("resnet50", {"hidden_size": 3}, "make_resnet", "hidden_size"),
    ("resnet_tiny", {"bn_group_size": 4, "foo": 1}, "make_resnet", "foo"),
    ("lstm_classifier", {"bn_group_size": 4}, "make_lstm_classifier", "bn_group_size"),
    ("lstm_lm", {"vocab_size": 10, "hiden_size": 8}, "make_lstm_lm", "hiden_size"),
])
def test_unknown_keyword_is_pythons_own_type_error_naming_the_builder(name, kwargs, builder,
                                                                       keyword):
  with pytest.raises(TypeError) as info:
    create_model(name, **kwargs)
  assert str(info.value) == f"{builder}() got an unexpected keyword argument {keyword!r}"


def test_type_error_inside_a_builder_is_not_relabelled(monkeypatch):
  import dateopt.models as models_module

  def builder(*, num_classes=None, dtype=None, hidden_size=128):
    raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

  monkeypatch.setitem(models_module._BUILDERS, "lstm_classifier", builder)
  with pytest.raises(TypeError, match="^unsupported operand") as info:
    create_model("lstm_classifier", hidden_size=3)
  assert info.value.__cause__ is None


def test_model_names():
  assert set(MODEL_NAMES) == {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
                              "resnet_tiny", "lstm_classifier", "lstm_lm", "transformer_lm"}


# ---------------------------------------------------------------- ResNet


# Parameter counts of torchvision's resnetXX with 1000 classes: an independent implementation.
@pytest.mark.parametrize("name, expected_params", [
    ("resnet18", 11_689_512), ("resnet34", 21_797_672), ("resnet50", 25_557_032),
    ("resnet101", 44_549_160), ("resnet152", 60_192_808),
])
def test_resnet_parameter_counts_and_output_shapes(name, expected_params):
  model = create_model(name)
  x = jnp.zeros((2, 32, 32, 3))  # parameter counts do not depend on the image size
  variables = _abstract_variables(model, x)
  assert _param_count(variables["params"]) == expected_params
  logits, updates = jax.eval_shape(
      lambda v: model.apply(v, x, train=True, mutable=["batch_stats"]), variables)
  assert logits.shape == (2, 1000) and logits.dtype == jnp.float32
  assert set(variables) == {"params", "batch_stats"}
  assert jax.tree.structure(updates["batch_stats"]) == jax.tree.structure(variables["batch_stats"])


def test_resnet50_is_v1_5_with_the_stride_in_the_3x3_conv():
  model = create_model("resnet50", num_classes=7)
  x = jnp.zeros((1, 64, 64, 3))
  variables = _abstract_variables(model, x)
  block = variables["params"]["stage2_block1"]
  assert block["conv1"]["kernel"].shape == (1, 1, 256, 128)
  assert block["conv2"]["kernel"].shape == (3, 3, 128, 128)
  assert variables["params"]["head"]["kernel"].shape == (2048, 7)
  _, state = jax.eval_shape(
      lambda v: model.apply(v, x, capture_intermediates=True, mutable=["intermediates"]),
      variables)
  inter = state["intermediates"]["stage2_block1"]
  assert inter["conv1"]["__call__"][0].shape == (1, 16, 16, 128)  # the 1x1 keeps the resolution
  assert inter["conv2"]["__call__"][0].shape == (1, 8, 8, 128)  # the 3x3 strides


@pytest.fixture(scope="module")
def tiny_resnet():
  model = create_model("resnet_tiny", num_classes=10)
  x = jax.random.normal(_key(1), (8, 8, 8, 1))
  variables = _init(model, x)
  return model, variables, x


def test_resnet_tiny_trains_one_step_and_updates_batch_stats(tiny_resnet):
  model, variables, x = tiny_resnet
  assert _param_count(variables["params"]) < 100_000
  logits, updates = jax.jit(
      lambda v: model.apply(v, x, train=True, mutable=["batch_stats"]))(variables)
  assert logits.shape == (8, 10)
  mean = updates["batch_stats"]["stem_bn"]["mean"]
  # Running mean after one step: 0.9 * 0 + 0.1 * batch mean.
  conv_out = jax.lax.conv_general_dilated(
      jnp.asarray(x), variables["params"]["stem_conv"]["kernel"], (1, 1), ((1, 1), (1, 1)),
      dimension_numbers=("NHWC", "HWIO", "NHWC"))
  np.testing.assert_allclose(mean, 0.1 * conv_out.mean((0, 1, 2)), rtol=1e-4, atol=1e-6)
  eval_logits = jax.jit(lambda v: model.apply(v, x, train=False))(variables)
  assert eval_logits.shape == (8, 10)


def test_last_bn_of_every_block_is_zero_initialised(tiny_resnet):
  _, variables, _ = tiny_resnet
  params = variables["params"]
  blocks = [k for k in params if k.startswith("stage")]
  assert len(blocks) == 3
  for block in blocks:
    np.testing.assert_array_equal(params[block]["bn2"]["scale"], 0.0)
    np.testing.assert_array_equal(params[block]["bn1"]["scale"], 1.0)
  np.testing.assert_allclose(jnp.std(params["head"]["kernel"]), 0.01, rtol=0.3)


@pytest.mark.parametrize("block_cls, filters, strides, in_features", [
    (BasicBlock, 4, 1, 4),        # identity shortcut
    (BasicBlock, 8, 2, 4),        # projection shortcut
    (BottleneckBlock, 2, 1, 8),   # identity shortcut (4 * 2 == 8)
    (BottleneckBlock, 4, 2, 8),   # projection shortcut
])
def test_fresh_block_is_its_shortcut(block_cls, filters, strides, in_features):
  block = block_cls(filters=filters, strides=strides, norm=_make_norm(False, None, jnp.float32))
  x = jax.random.normal(_key(0), (2, 6, 6, in_features))
  variables = jax.jit(block.init)(_key(1), x)
  last_bn = "bn2" if block_cls is BasicBlock else "bn3"
  np.testing.assert_array_equal(variables["params"][last_bn]["scale"], 0.0)
  out = jax.jit(block.apply)(variables, x)
  if "proj_conv" in variables["params"]:
    # 1x1 strided conv, then BN with the initial running stats (mean 0, var 1).
    kernel = variables["params"]["proj_conv"]["kernel"]
    shortcut = jax.lax.conv_general_dilated(x, kernel, (strides, strides), "VALID",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))
    shortcut = shortcut / np.sqrt(1.0 + BN_EPSILON)
  else:
    shortcut = x
  np.testing.assert_allclose(out, jax.nn.relu(shortcut), rtol=1e-5, atol=1e-5)


def test_bn_hyperparameters():
  assert BN_MOMENTUM == 0.9 and BN_EPSILON == 1e-5
  norm = _make_norm(True, None, jnp.float32)(name="bn")
  assert norm.momentum == 0.9 and norm.epsilon == 1e-5


# ---------------------------------------------------------------- ghost batch norm


@jax.jit
def _batch_norm(x, variables):
  return nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5).apply(
      variables, x, mutable=["batch_stats"])


def _train_apply(module, variables, x):
  return jax.jit(lambda v, x: module.apply(v, x, mutable=["batch_stats"]))(variables, x)


def _random_bn_variables(key, features):
  k1, k2, k3, k4 = jax.random.split(key, 4)
  return {"params": {"scale": 1 + 0.1 * jax.random.normal(k1, (features,)),
                     "bias": 0.1 * jax.random.normal(k2, (features,))},
          "batch_stats": {"mean": 0.1 * jax.random.normal(k3, (features,)),
                          "var": 1 + jax.random.uniform(k4, (features,))}}


def test_ghost_bn_with_group_equal_to_batch_is_batch_norm():
  x = 3.0 + 2.0 * jax.random.normal(_key(0), (8, 5, 5, 3))
  variables = _random_bn_variables(_key(1), 3)
  ghost = GhostBatchNorm(use_running_average=False, group_size=8, momentum=0.9, epsilon=1e-5)
  assert jax.tree.structure(jax.eval_shape(ghost.init, _key(2), x)) == jax.tree.structure(
      jax.eval_shape(nn.BatchNorm(use_running_average=False).init, _key(2), x))
  y, updates = _train_apply(ghost, variables, x)
  y_ref, updates_ref = _batch_norm(x, variables)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  for name in ("mean", "var"):
    np.testing.assert_allclose(updates["batch_stats"][name], updates_ref["batch_stats"][name],
                               rtol=1e-5, atol=1e-6)
  ghost_eval = GhostBatchNorm(use_running_average=True, group_size=8, epsilon=1e-5)
  y_eval = jax.jit(ghost_eval.apply)(variables, x)
  y_eval_ref = jax.jit(nn.BatchNorm(use_running_average=True, epsilon=1e-5).apply)(variables, x)
  np.testing.assert_allclose(y_eval, y_eval_ref, rtol=1e-5, atol=1e-5)


def test_ghost_bn_normalises_each_group_separately():
  x = jax.random.normal(_key(0), (12, 4, 4, 3)) * jnp.arange(1, 13)[:, None, None, None]
  variables = _random_bn_variables(_key(1), 3)
  ghost = GhostBatchNorm(use_running_average=False, group_size=4, momentum=0.9, epsilon=1e-5)
  y, updates = _train_apply(ghost, variables, x)
  # Independent computation: plain BN on each group of 4, running stats averaged over groups
  # (the update is linear in the batch statistic).
  per_group = [_batch_norm(x[i:i + 4], variables) for i in range(0, 12, 4)]
  np.testing.assert_allclose(y, jnp.concatenate([g[0] for g in per_group]), rtol=1e-5, atol=1e-5)
  for name in ("mean", "var"):
    expected = np.mean([g[1]["batch_stats"][name] for g in per_group], axis=0)
    np.testing.assert_allclose(updates["batch_stats"][name], expected, rtol=1e-5, atol=1e-6)
  y_whole, _ = _batch_norm(x, variables)
  assert not np.allclose(y, y_whole, atol=1e-3)


def test_ghost_bn_rejects_a_batch_it_cannot_split_but_inits_with_any_batch():
  ghost = GhostBatchNorm(use_running_average=False, group_size=4)
  variables = ghost.init(_key(0), jnp.ones((3, 2)))  # init: any dummy batch
  with pytest.raises(ValueError, match="bn_group_size=4"):
    ghost.apply(variables, jnp.ones((6, 2)), mutable=["batch_stats"])


def test_resnet_with_ghost_bn_uses_groups(tiny_resnet):
  _, variables, x = tiny_resnet
  ghost_model = create_model("resnet_tiny", num_classes=10, bn_group_size=2)
  plain_model = create_model("resnet_tiny", num_classes=10)
  # Non-zero last-BN scales so that every BN influences the output.
  params = jax.tree.map(lambda p: p + 0.5, variables["params"])
  variables = {"params": params, "batch_stats": variables["batch_stats"]}
  def logits(model):
    return jax.jit(lambda v: model.apply(v, x, train=True, mutable=["batch_stats"])[0])(variables)

  assert not np.allclose(logits(ghost_model), logits(plain_model), atol=1e-4)


# ---------------------------------------------------------------- bfloat16


def test_bf16_compute_keeps_params_and_stats_float32():
  model = create_model("resnet_tiny", num_classes=10, dtype="bfloat16", bn_group_size=4)
  x = jnp.ones((8, 8, 8, 1))
  # Abstract evaluation gives the exact dtypes without compiling anything.
  variables = _abstract_variables(model, x)
  assert {leaf.dtype for leaf in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
  logits, state = jax.eval_shape(lambda v: model.apply(
      v, x, train=True, mutable=["batch_stats", "intermediates"],
      capture_intermediates=True), variables)
  assert logits.dtype == jnp.float32
  block = state["intermediates"]["stage2_block1"]
  assert block["conv1"]["__call__"][0].dtype == jnp.bfloat16
  assert block["bn1"]["__call__"][0].dtype == jnp.bfloat16
  assert {leaf.dtype for leaf in jax.tree.leaves(state["batch_stats"])} == {jnp.dtype(jnp.float32)}


# ---------------------------------------------------------------- LSTM classifier


def _sigmoid(z):
  return 1 / (1 + np.exp(-z))


def _numpy_lstm_layer(x, p):
  """Reference LSTM (i, f, g, o gates), zero initial state; returns all hidden states."""
  batch, steps, _ = x.shape
  hidden = p["hi"]["kernel"].shape[0]
  h, c = np.zeros((batch, hidden)), np.zeros((batch, hidden))
  outputs = []
  for t in range(steps):
    gate = {g: x[:, t] @ p["i" + g]["kernel"] + h @ p["h" + g]["kernel"] + p["h" + g]["bias"]
            for g in "ifgo"}
    c = _sigmoid(gate["f"]) * c + _sigmoid(gate["i"]) * np.tanh(gate["g"])
    h = _sigmoid(gate["o"]) * np.tanh(c)
    outputs.append(h)
  return np.stack(outputs, axis=1)


def test_lstm_classifier_matches_a_numpy_lstm_in_one_compile():
  model = create_model("lstm_classifier", num_classes=5, hidden_size=16, num_layers=2)
  x = jax.random.normal(_key(0), (4, 28, 28))
  # Any parameters will do for the comparison: random ones, without compiling the initialisers.
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda leaf: rng.normal(0.0, 0.3, leaf.shape).astype(np.float32),
                        _abstract_variables(model, x)["params"])
  variables = {"params": params}
  assert set(params) == {"lstm1", "lstm2", "head"}
  forward = jax.jit(lambda v, x: model.apply(v, x, train=True))
  logits = forward(variables, x)
  forward(variables, x + 1.0)
  assert forward._cache_size() == 1
  hidden = _numpy_lstm_layer(_numpy_lstm_layer(np.asarray(x, np.float64), params["lstm1"]),
                             params["lstm2"])
  expected = hidden[:, -1] @ params["head"]["kernel"] + params["head"]["bias"]
  assert logits.shape == (4, 5) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


def test_lstm_classifier_rejects_unbatched_sequences():
  model = create_model("lstm_classifier")
  with pytest.raises(ValueError, match="batch, time, features"):
    model.init(_key(0), jnp.zeros((4, 40)))


# ---------------------------------------------------------------- LSTM language model


@pytest.fixture(scope="module")
def small_lm():
  model = create_model("lstm_lm", num_classes=50, hidden_size=8, init_scale=0.05, dropout=0.5)
  tokens = jnp.arange(24, dtype=jnp.int32).reshape(2, 12) % 50
  variables = _init(model, tokens)
  run = jax.jit(lambda tokens, key, train: model.apply(variables, tokens, train=train,
                                                       rngs={"dropout": key}), static_argnums=2)
  return model, variables, tokens, run


def test_lstm_lm_shapes_init_scale_and_causality(small_lm):
  model, variables, tokens, run = small_lm
  assert set(variables) == {"params"}
  assert set(variables["params"]) == {"embed", "lstm1", "lstm2", "head"}
  assert max(float(jnp.abs(leaf).max()) for leaf in jax.tree.leaves(variables)) <= 0.05
  logits = run(tokens, _key(0), False)
  assert logits.shape == (2, 12, 50) and logits.dtype == jnp.float32
  # Causal: changing a later token leaves earlier logits unchanged.
  changed = run(tokens.at[:, 8].set(0), _key(0), False)
  np.testing.assert_allclose(changed[:, :8], logits[:, :8], rtol=1e-6)
  assert not np.allclose(changed[:, 8:], logits[:, 8:])


def test_lstm_lm_presets():
  for preset, (layers, hidden, dropout) in {"ptb_small": (2, 200, 0.0),
                                            "ptb_medium": (2, 650, 0.5),
                                            "ptb_large": (2, 1500, 0.65)}.items():
    lm = create_model("lstm_lm", preset=preset, vocab_size=10_000)
    assert (lm.num_layers, lm.hidden_size, lm.dropout) == (layers, hidden, dropout)
  assert PTB_PRESETS["ptb_small"]["seq_len"] == 20 and PTB_PRESETS["ptb_large"]["seq_len"] == 35
  assert create_model("lstm_lm", preset="ptb_large", vocab_size=9, dropout=0.1).dropout == 0.1
  with pytest.raises(ValueError, match="vocab_size"):
    create_model("lstm_lm", num_classes=10, vocab_size=11)


def test_lstm_lm_dropout_only_in_train_mode(small_lm):
  model, variables, tokens, run = small_lm
  eval_a, eval_b = run(tokens, _key(1), False), run(tokens, _key(2), False)
  np.testing.assert_array_equal(eval_a, eval_b)
  train_a, train_b = run(tokens, _key(1), True), run(tokens, _key(2), True)
  assert not np.allclose(train_a, train_b) and not np.allclose(train_a, eval_a)
  with pytest.raises(Exception, match="dropout"):
    model.apply(variables, tokens, train=True)  # train mode needs the "dropout" rng


def test_lstm_lm_tied_embeddings_share_the_matrix():
  model = create_model("lstm_lm", vocab_size=30, hidden_size=8, tie_embeddings=True)
  tokens = jnp.zeros((2, 5), jnp.int32)
  variables = _abstract_variables(model, tokens)
  assert "head" not in variables["params"]
  assert jax.eval_shape(model.apply, variables, tokens).shape == (2, 5, 30)


# ---------------------------------------------------------------- layering


def test_models_import_no_data_pipeline_or_tensorflow():
  assert_not_loaded("import dateopt.models", ("tensorflow", "tensorflow_datasets", "grain"),
                    ("dateopt.data", "dateopt.train"))
