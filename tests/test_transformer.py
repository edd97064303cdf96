"""Tests for dateopt.models.transformer: shapes, a NumPy reference, causality, rotary, dtypes."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dateopt import masks
from dateopt.models import TRANSFORMER_PRESETS, TransformerLM, create_model, make_transformer_lm
from dateopt.models.transformer import CausalSelfAttention, rotary_embedding

VOCAB = 61  # prime: a vocabulary/width mix-up cannot hide behind equal sizes
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (2, 16)), jnp.int32)


def _key(seed: int) -> jax.Array:
  # unsafe_rbg keys: XLA compiles their random ops several times faster than threefry's on CPU.
  return jax.random.key(seed, impl="unsafe_rbg")


def _tiny(**overrides) -> TransformerLM:
  return create_model("transformer_lm", preset="tiny", vocab_size=VOCAB, **overrides)


def _abstract_params(model, tokens=TOKENS):
  return jax.eval_shape(lambda: model.init(_key(0), tokens, train=False))["params"]


def _flat(tree) -> dict:
  return {masks.path_to_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _param_count(tree) -> int:
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


def _random_params(abstract, seed: int = 0):
  """O(1) activations everywhere: kernels N(0, 0.1^2), embeddings N(0, 1), scales near 1."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = masks.path_to_str(path).rsplit("/", 1)[-1]
    std = 1.0 if name == "embedding" else 0.1
    return (rng.normal(0.0, std, leaf.shape) + (name == "scale")).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, abstract)


def _forward(model):
  """One compiled forward per model; `train` and the rng key are arguments."""
  return jax.jit(lambda params, tokens, key, train: model.apply(
      {"params": params}, tokens, train=train, rngs={"dropout": key}), static_argnums=3)


# ---------------------------------------------------------------- shapes and structure


@pytest.mark.parametrize("norm, mlp, positions", list(itertools.product(
    ("layernorm", "rmsnorm"), ("gelu", "swiglu"), ("learned", "rotary"))))
def test_every_variant_gives_float32_logits_and_its_parameter_tree(norm, mlp, positions):
  model = _tiny(norm=norm, mlp=mlp, positions=positions)
  run = jax.jit(lambda key: model.apply(model.init(key, TOKENS[:, :8], train=False),
                                        TOKENS[:, :8], train=True))
  logits = run(_key(0))
  assert logits.shape == (2, 8, VOCAB) and logits.dtype == jnp.float32
  assert np.isfinite(np.asarray(logits)).all()
  params = _abstract_params(model)
  assert set(params) == {"token_embed", "block0", "block1", "final_norm"} | (
      {"position_embed"} if positions == "learned" else set())
  block = params["block1"]
  assert set(block) == {"attn_norm", "attn", "mlp_norm", "mlp"}
  assert set(block["attn"]) == {"query", "key", "value", "out"}
  assert set(block["mlp"]) == ({"fc", "proj"} if mlp == "gelu" else {"gate", "up", "proj"})
  assert set(block["attn_norm"]) == ({"scale", "bias"} if norm == "layernorm" else {"scale"})
  assert block["attn"]["query"]["kernel"].shape == (32, 2, 16)  # DenseGeneral to (N, H)
  assert block["attn"]["out"]["kernel"].shape == (2, 16, 32)
  assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}


def test_tied_and_untied_parameter_trees():
  tied, untied = _abstract_params(_tiny()), _abstract_params(_tiny(tie_embeddings=False))
  assert "head" not in tied and tied["token_embed"]["embedding"].shape == (VOCAB, 32)
  assert set(untied["head"]) == {"kernel"} and untied["head"]["kernel"].shape == (32, VOCAB)
  assert _param_count(untied) - _param_count(tied) == 32 * VOCAB
  no_bias = _flat(_abstract_params(_tiny(use_bias=False)))
  assert not [path for path in no_bias if path.endswith("bias")]


def test_attention_goes_through_jax_dot_product_attention(monkeypatch):
  calls = []
  original = jax.nn.dot_product_attention

  def spy(q, k, v, *args, **kwargs):
    calls.append((q.shape, kwargs))
    return original(q, k, v, *args, **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
  _abstract_params(_tiny(attention_implementation="xla"))
  assert [shape for shape, _ in calls] == [(2, 16, 2, 16)] * 2  # (B, T, N, H), one per block
  assert all(kw["is_causal"] and kw["implementation"] == "xla" for _, kw in calls)


# ---------------------------------------------------------------- NumPy reference


def _np_layernorm(x, p):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-5) * p["scale"] + p["bias"]


def _np_gelu(x):  # GPT-2's tanh approximation
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _np_rotate(x, positions):
  """Rotary as a complex product: feature j + i * feature j+H/2, times e^{i pos theta_j}."""
  half = x.shape[-1] // 2
  theta = 10_000.0 ** (-np.arange(half) / half)
  z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * positions[:, None] * theta)[:, None]
  return np.concatenate([z.real, z.imag], axis=-1)


def _np_attention(x, p, rotary=False):
  """Multi-head attention with an explicit lower-triangular mask and a plain softmax."""
  q, k, v = (np.einsum("btd,dnh->btnh", x, p[n]["kernel"]) + p[n]["bias"]
             for n in ("query", "key", "value"))
  if rotary:
    positions = np.arange(x.shape[1])
    q, k = _np_rotate(q, positions), _np_rotate(k, positions)
  scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
  future = np.triu(np.ones((x.shape[1],) * 2, bool), k=1)
  scores = np.where(future, -np.inf, scores)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads = np.einsum("bnts,bsnh->btnh", weights, v)
  return np.einsum("btnh,nhd->btd", heads, p["out"]["kernel"]) + p["out"]["bias"]


def _np_transformer(params, tokens):
  """GPT-2 in NumPy float64: layernorm, gelu, learned positions, tied embeddings."""
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  wte = params["token_embed"]["embedding"]
  x = wte[tokens] + params["position_embed"]["embedding"][:tokens.shape[1]]
  for i in range(len([k for k in params if k.startswith("block")])):
    p = params[f"block{i}"]
    x = x + _np_attention(_np_layernorm(x, p["attn_norm"]), p["attn"])
    h = _np_gelu(_np_layernorm(x, p["mlp_norm"]) @ p["mlp"]["fc"]["kernel"]
                 + p["mlp"]["fc"]["bias"])
    x = x + h @ p["mlp"]["proj"]["kernel"] + p["mlp"]["proj"]["bias"]
  return _np_layernorm(x, params["final_norm"]) @ wte.T


@pytest.fixture(scope="module")
def gpt_tiny():
  """The tiny GPT-2 (layernorm, gelu, learned, tied), its compiled forward and random params."""
  model = _tiny()
  params = _random_params(_abstract_params(model))
  return model, params, _forward(model)


def test_tiny_gpt_matches_a_numpy_forward(gpt_tiny):
  model, params, forward = gpt_tiny
  logits = forward(params, TOKENS, _key(0), False)
  expected = _np_transformer(params, np.asarray(TOKENS))
  assert np.abs(expected).max() > 1.0  # the comparison is not between near-zero numbers
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rotary", [False, True])
def test_attention_matches_a_numpy_masked_softmax(rotary):
  attn = CausalSelfAttention(num_heads=4, rotary=rotary)
  x = jax.random.normal(_key(0), (2, 12, 32))
  params = _random_params(jax.eval_shape(attn.init, _key(1), x)["params"], seed=1)
  got = jax.jit(attn.apply)({"params": params}, x)
  np.testing.assert_allclose(got, _np_attention(np.asarray(x, np.float64), params, rotary),
                             rtol=1e-5, atol=1e-5)


def test_init_is_gpt2s():
  model = create_model("transformer_lm", preset="tiny", vocab_size=512, num_layers=4)
  params = jax.jit(lambda key: model.init(key, TOKENS, train=False))(_key(0))["params"]
  np.testing.assert_allclose(np.std(params["token_embed"]["embedding"]), 0.02, rtol=0.05)
  np.testing.assert_allclose(np.std(params["position_embed"]["embedding"]), 0.02, rtol=0.05)
  block = params["block3"]
  np.testing.assert_allclose(np.std(block["mlp"]["fc"]["kernel"]), 0.02, rtol=0.1)
  np.testing.assert_allclose(np.std(block["attn"]["query"]["kernel"]), 0.02, rtol=0.1)
  residual_std = 0.02 / math.sqrt(2 * 4)
  np.testing.assert_allclose(np.std(block["attn"]["out"]["kernel"]), residual_std, rtol=0.1)
  np.testing.assert_allclose(np.std(block["mlp"]["proj"]["kernel"]), residual_std, rtol=0.1)
  for path, leaf in _flat(params).items():
    if path.endswith("bias"):
      np.testing.assert_array_equal(leaf, 0.0, err_msg=path)
    if path.endswith("scale"):
      np.testing.assert_array_equal(leaf, 1.0, err_msg=path)


# ---------------------------------------------------------------- causality and rotary


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_a_token_changes_no_earlier_logit_and_its_own(positions, gpt_tiny):
  model = _tiny(positions=positions)
  forward = gpt_tiny[2] if positions == "learned" else _forward(model)
  params = _random_params(_abstract_params(model))
  logits = np.asarray(forward(params, TOKENS, _key(0), False))
  for t in (0, 7, 15):
    changed = np.asarray(forward(params, TOKENS.at[:, t].set((TOKENS[:, t] + 1) % VOCAB),
                                 _key(0), False))
    np.testing.assert_allclose(changed[:, :t], logits[:, :t], rtol=1e-6, atol=1e-6)
    assert (np.abs(changed[:, t] - logits[:, t]).max(axis=-1) > 1e-3).all()  # in every row


def test_rotary_scores_depend_only_on_the_offset():
  rng = np.random.default_rng(0)
  q, k = (jnp.asarray(rng.normal(size=16), jnp.float32) for _ in range(2))
  positions = jnp.arange(40)
  # The same query and key at every position: (1, T, 1, H).
  rq = rotary_embedding(jnp.broadcast_to(q, (1, 40, 1, 16)), positions)[0, :, 0]
  rk = rotary_embedding(jnp.broadcast_to(k, (1, 40, 1, 16)), positions)[0, :, 0]
  scores = np.asarray(rq @ rk.T)  # scores[m, n] = rot(q, m) . rot(k, n)
  by_offset = [np.diagonal(scores, offset=-d) for d in range(0, 30, 3)]
  for diagonal in by_offset:
    np.testing.assert_allclose(diagonal, diagonal[0], rtol=1e-5, atol=1e-5)
  assert len({round(float(d[0]), 3) for d in by_offset}) == len(by_offset)  # offsets differ
  np.testing.assert_allclose(scores[0, 0], q @ k, rtol=1e-6)  # position 0 is no rotation
  np.testing.assert_allclose(jnp.linalg.norm(rq, axis=-1), jnp.linalg.norm(q), rtol=1e-5)


# ---------------------------------------------------------------- dtypes and dropout


def test_bf16_compute_keeps_float32_params_norms_and_logits():
  kwargs = dict(norm="rmsnorm", mlp="swiglu", positions="rotary", tie_embeddings=False)
  f32, bf16 = _tiny(**kwargs), _tiny(dtype=jnp.bfloat16, **kwargs)
  assert {leaf.dtype for leaf in jax.tree.leaves(_abstract_params(bf16))} == {
      jnp.dtype(jnp.float32)}
  params = jax.jit(lambda key: f32.init(key, TOKENS, train=False))(_key(0))["params"]
  _, state = jax.eval_shape(lambda p: bf16.apply(
      {"params": p}, TOKENS, capture_intermediates=True, mutable=["intermediates"]), params)
  block = state["intermediates"]["block0"]
  assert block["attn"]["query"]["__call__"][0].dtype == jnp.bfloat16
  assert block["mlp"]["up"]["__call__"][0].dtype == jnp.bfloat16
  assert block["attn_norm"]["__call__"][0].dtype == jnp.float32
  assert block["__call__"][0].dtype == jnp.float32  # the residual stream
  reference = np.asarray(_forward(f32)(params, TOKENS, _key(0), False))
  logits = _forward(bf16)(params, TOKENS, _key(0), False)
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, reference, atol=0.03 * np.abs(reference).max())


def test_dropout_is_off_by_default_and_draws_per_key_when_on(gpt_tiny):
  _, params, forward = gpt_tiny
  eval_logits = forward(params, TOKENS, _key(1), False)
  np.testing.assert_array_equal(forward(params, TOKENS, _key(1), True), eval_logits)
  np.testing.assert_array_equal(forward(params, TOKENS, _key(2), True), eval_logits)
  dropping = _forward(_tiny(dropout=0.1))
  a, b = dropping(params, TOKENS, _key(1), True), dropping(params, TOKENS, _key(2), True)
  assert not np.allclose(a, b) and not np.allclose(a, eval_logits)
  np.testing.assert_array_equal(dropping(params, TOKENS, _key(1), False), eval_logits)


# ---------------------------------------------------------------- weight decay mask


def test_default_mask_decays_kernels_and_token_embeddings_only():
  params = _abstract_params(_tiny(tie_embeddings=False))
  selected = _flat(masks.resolve(masks.exclude_bias_and_norm, params))
  assert selected["position_embed/embedding"] is False
  assert selected["token_embed/embedding"] is True and selected["head/kernel"] is True
  for path, decays in selected.items():
    name = path.rsplit("/", 1)[-1]
    if name == "kernel":
      assert decays, path
    if name in ("bias", "scale") or "norm" in path:
      assert not decays, path
  assert sum(selected.values()) == 2 + 2 * 6  # embedding, head; 6 kernels per block
  assert "position_embed" in masks.POSITION_TABLE_NAMES


# ---------------------------------------------------------------- presets and GPT-2 small


def test_presets_and_overrides():
  assert set(TRANSFORMER_PRESETS) >= {"tiny", "char_small", "gpt2_small"}
  sizes = lambda m: (m.num_layers, m.num_heads, m.embed_dim, m.mlp_dim, m.max_len)  # noqa: E731
  assert sizes(_tiny()) == (2, 2, 32, 64, 64)
  assert sizes(make_transformer_lm(preset="char_small", vocab_size=256)) == (4, 4, 128, 512, 256)
  gpt2 = make_transformer_lm(preset="gpt2_small", num_classes=50257)
  assert sizes(gpt2) == (12, 12, 768, 3072, 1024) and gpt2.vocab_size == 50257
  assert (gpt2.norm, gpt2.mlp, gpt2.positions, gpt2.tie_embeddings) == (
      "layernorm", "gelu", "learned", True)
  assert all("vocab_size" not in fields for fields in TRANSFORMER_PRESETS.values())
  assert sizes(make_transformer_lm(vocab_size=256)) == sizes(
      make_transformer_lm(preset="char_small", vocab_size=256))
  custom = _tiny(num_layers=3, positions="rotary", dropout=0.2, tie_embeddings=False)
  assert (custom.num_layers, custom.num_heads, custom.positions, custom.dropout,
          custom.tie_embeddings) == (3, 2, "rotary", 0.2, False)
  assert create_model("transformer_lm", vocab_size=9, dtype="bfloat16").dtype == jnp.bfloat16


def test_gpt2_small_has_gpt2s_124m_parameters():
  model = create_model("transformer_lm", preset="gpt2_small", vocab_size=50257)
  params = _abstract_params(model, jnp.zeros((1, 8), jnp.int32))
  assert _param_count(params) == 124_439_808  # GPT-2 small (Hugging Face's "gpt2")


@pytest.mark.slow
@pytest.mark.xla_defaults  # running GPT-2 small's step, not compiling it, is its time
def test_gpt2_small_trains_one_step():
  model = create_model("transformer_lm", preset="gpt2_small", vocab_size=50257)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50257, (1, 33)), jnp.int32)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  params = jax.jit(lambda key: model.init(key, inputs, train=False))(_key(0))["params"]
  tx = optax.adamw(3e-4, weight_decay=0.1,
                   mask=lambda p: masks.resolve(masks.exclude_bias_and_norm, p))

  @jax.jit
  def step(params, opt_state):
    def loss_fn(params):
      logits = model.apply({"params": params}, inputs, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  new_params, _, loss = step(params, tx.init(params))
  # A fresh model predicts about uniformly: the loss is near log(vocab).
  assert np.isfinite(float(loss)) and abs(float(loss) - np.log(50257)) < 0.5
  moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), params, new_params)
  assert all(jax.tree.leaves(moved))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, field", [
    ({"norm": "batchnorm"}, "norm must be one of 'layernorm', 'rmsnorm'"),
    ({"mlp": "relu"}, "mlp must be one of 'gelu', 'swiglu'"),
    ({"positions": "sinusoidal"}, "positions must be one of 'learned', 'rotary'"),
    ({"embed_dim": 30, "num_heads": 4}, r"embed_dim \(30\) must be divisible by num_heads"),
    ({"embed_dim": 6, "num_heads": 2, "positions": "rotary"}, "rotary.*even head size"),
    ({"dropout": 1.0}, "dropout"),
    ({"num_layers": 0}, "num_layers"),
    ({"preset": "gpt5"}, "preset must be one of None, 'tiny'"),
    ({"attention_implementation": "flash"}, "attention_implementation"),
    ({"num_classes": 10, "vocab_size": 11}, "vocab_size"),
])
def test_bad_fields_raise_naming_the_field(kwargs, field):
  kwargs = {"vocab_size": VOCAB, **kwargs}
  with pytest.raises(ValueError, match=field):
    create_model("transformer_lm", **kwargs)


def test_bad_types_unknown_keywords_and_a_missing_vocabulary():
  with pytest.raises(ValueError, match="vocab_size"):
    create_model("transformer_lm", preset="tiny")
  with pytest.raises(TypeError, match="tie_embeddings"):
    _tiny(tie_embeddings="yes")
  with pytest.raises(TypeError, match="num_heads"):
    _tiny(num_heads=2.0)
  with pytest.raises(TypeError) as info:
    _tiny(hidden_size=8)
  assert str(info.value) == "make_transformer_lm() got an unexpected keyword argument 'hidden_size'"


def test_a_sequence_longer_than_the_context_is_refused():
  model = _tiny()
  jax.eval_shape(lambda: model.init(_key(0), jnp.zeros((1, 64), jnp.int32)))  # max_len fits
  with pytest.raises(ValueError, match="65 tokens.*max_len=64"):
    jax.eval_shape(lambda: model.init(_key(0), jnp.zeros((1, 65), jnp.int32)))
  with pytest.raises(ValueError, match=r"\(batch, time\)"):
    jax.eval_shape(lambda: model.init(_key(0), jnp.zeros((65,), jnp.int32)))
