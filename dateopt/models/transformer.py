"""A decoder-only Transformer language model, GPT-2 shaped: tokens (B, T) -> logits (B, T, V).

Pre-norm blocks (Radford et al. 2019, "Language Models are Unsupervised
Multitask Learners", GPT-2) over the attention of Vaswani et al. 2017
("Attention Is All You Need"), with three modern options: RMSNorm (Zhang &
Sennrich 2019, "Root Mean Square Layer Normalization"), a SwiGLU feed-forward
(Shazeer 2020, "GLU Variants Improve Transformer") and rotary position
embeddings (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position
Embedding").

Attention goes through `jax.nn.dot_product_attention(..., is_causal=True)`, so
`attention_implementation="cudnn"` gives a GPU its fused (flash) kernel without
touching the model. Mixed precision: parameters are float32, matmuls run in
`dtype`, while the residual stream, the norms, the softmax statistics and the
logits are float32.

Example:
  >>> import jax, jax.numpy as jnp
  >>> model = make_transformer_lm(preset="tiny", vocab_size=256)
  >>> tokens = jnp.zeros((4, 16), jnp.int32)
  >>> variables = model.init(jax.random.key(0), tokens, train=False)
  >>> logits = model.apply(variables, tokens, train=True)  # (4, 16, 256) float32
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dateopt.validation import check_choice, check_range, check_type

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rotary")
ATTENTION_IMPLEMENTATIONS = (None, "xla", "cudnn")  # jax.nn.dot_product_attention's

# GPT-2's layer-norm epsilon; RMSNorm uses the same.
NORM_EPSILON = 1e-5
# GPT-2 (and nanoGPT) initialise every kernel and embedding from N(0, 0.02^2).
INIT_STD = 0.02
ROTARY_BASE = 10_000.0  # Su et al. 2021, Eq. 15

#: The Transformer presets; each gives every field but the vocabulary, which comes from the
#: dataset.
TRANSFORMER_PRESETS: dict[str, dict[str, Any]] = {
    # For tests: compiles in about a second on a CPU.
    "tiny": dict(num_layers=2, num_heads=2, embed_dim=32, mlp_dim=64, max_len=64,
                 norm="layernorm", mlp="gelu", positions="learned", dropout=0.0,
                 tie_embeddings=True, use_bias=True),
    # The character-level study model that a CPU trains (0.86M parameters at vocab 256).
    "char_small": dict(num_layers=4, num_heads=4, embed_dim=128, mlp_dim=512, max_len=256,
                       norm="layernorm", mlp="gelu", positions="learned", dropout=0.0,
                       tie_embeddings=True, use_bias=True),
    # GPT-2 small: 124,439,808 parameters with its 50257-token vocabulary.
    "gpt2_small": dict(num_layers=12, num_heads=12, embed_dim=768, mlp_dim=3072, max_len=1024,
                       norm="layernorm", mlp="gelu", positions="learned", dropout=0.0,
                       tie_embeddings=True, use_bias=True),
}
DEFAULT_PRESET = "char_small"


def rotary_embedding(x: jax.Array, positions: jax.Array, *,
                     base: float = ROTARY_BASE) -> jax.Array:
  """Rotates each pair of features of x (B, T, N, H) by an angle proportional to its position.

  Feature j is paired with feature j + H/2 (the "rotate half" layout; Su et al.
  pair 2j with 2j+1, which differs by one fixed permutation of the features of
  q and k, so q.k is the same). Pair j turns by `positions * base^(-2j/H)`, so
  the dot product of a rotated query at position m and a rotated key at n
  depends on m - n only. Computed in float32, returned in x's dtype.

  Example:
    >>> q = jnp.ones((1, 8, 2, 16))
    >>> q_rotated = rotary_embedding(q, jnp.arange(8))
  """
  half = x.shape[-1] // 2
  inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles = jnp.asarray(positions, jnp.float32)[:, None] * inv_freq  # (T, H/2)
  cos = jnp.cos(angles)[None, :, None, :]  # broadcast over batch and heads
  sin = jnp.sin(angles)[None, :, None, :]
  x1, x2 = jnp.split(jnp.asarray(x, jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


def _make_norm(kind: str, use_bias: bool, name: str) -> nn.Module:
  check_choice("norm", kind, NORMS)
  # dtype float32: the statistics and the output stay float32 whatever the compute dtype.
  if kind == "layernorm":
    return nn.LayerNorm(epsilon=NORM_EPSILON, use_bias=use_bias, dtype=jnp.float32, name=name)
  return nn.RMSNorm(epsilon=NORM_EPSILON, dtype=jnp.float32, name=name)


def _normal(std: float) -> nn.initializers.Initializer:
  return nn.initializers.normal(stddev=std)


class CausalSelfAttention(nn.Module):
  """Multi-head causal self-attention over (B, T, D), heads laid out (B, T, N, H).

  Attributes:
    num_heads: N; the head size H is D / N.
    rotary: rotate queries and keys by position (`rotary_embedding`) before attending.
    use_bias: biases on the four projections.
    out_init_std: init std of the output projection (GPT-2 shrinks it with depth).
    attention_implementation: `jax.nn.dot_product_attention`'s `implementation`
      (None or "xla": plain XLA; "cudnn": the fused GPU kernel, bf16/fp16 only).
    dtype: compute dtype of the projections and of the attention.
  """

  num_heads: int
  rotary: bool = False
  use_bias: bool = True
  out_init_std: float = INIT_STD
  attention_implementation: str | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    embed_dim = x.shape[-1]
    project = functools.partial(
        nn.DenseGeneral, features=(self.num_heads, embed_dim // self.num_heads),
        use_bias=self.use_bias, dtype=self.dtype, kernel_init=_normal(INIT_STD))
    q, k, v = (project(name=name)(x) for name in ("query", "key", "value"))
    if self.rotary:
      positions = jnp.arange(x.shape[1])
      q, k = rotary_embedding(q, positions), rotary_embedding(k, positions)
    # The XLA path computes the softmax in float32 for bf16 inputs; cuDNN keeps float32
    # statistics internally. No dropout on the attention weights: the fused kernel has none.
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                     implementation=self.attention_implementation)
    return nn.DenseGeneral(embed_dim, axis=(-2, -1), use_bias=self.use_bias, dtype=self.dtype,
                           kernel_init=_normal(self.out_init_std), name="out")(y)


class FeedForward(nn.Module):
  """The position-wise MLP: GELU (GPT-2: fc, gelu, proj) or SwiGLU (gate, up, proj).

  SwiGLU computes `proj(silu(gate(x)) * up(x))` (Shazeer 2020); with the same
  `hidden_dim` it has 1.5x the parameters of the GELU MLP (Shazeer scales
  hidden_dim by 2/3 to match; here that is the caller's choice).

  Attributes:
    hidden_dim: the inner width (`mlp_dim`).
    kind: "gelu" or "swiglu".
    use_bias: biases on every projection.
    out_init_std: init std of `proj` (GPT-2 shrinks it with depth).
    dtype: compute dtype.
  """

  hidden_dim: int
  kind: str = "gelu"
  use_bias: bool = True
  out_init_std: float = INIT_STD
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    check_choice("mlp", self.kind, MLPS)
    dense = functools.partial(nn.Dense, use_bias=self.use_bias, dtype=self.dtype)
    if self.kind == "gelu":
      # GPT-2 uses the tanh approximation of GELU (jax.nn.gelu's default).
      h = jax.nn.gelu(dense(self.hidden_dim, kernel_init=_normal(INIT_STD), name="fc")(x))
    else:
      gate = dense(self.hidden_dim, kernel_init=_normal(INIT_STD), name="gate")(x)
      h = jax.nn.silu(gate) * dense(self.hidden_dim, kernel_init=_normal(INIT_STD), name="up")(x)
    return dense(x.shape[-1], kernel_init=_normal(self.out_init_std), name="proj")(h)


class DecoderBlock(nn.Module):
  """A pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)), dropout on each branch.

  The residual stream x stays float32 (as under PyTorch autocast in GPT-2
  reproductions): it sums many small updates, which bf16's 8 bits of precision would drop.

  Attributes: as `TransformerLM`'s; `out_init_std` is the residual projections' init std.
  """

  num_heads: int
  mlp_dim: int
  norm: str = "layernorm"
  mlp: str = "gelu"
  rotary: bool = False
  dropout: float = 0.0
  use_bias: bool = True
  out_init_std: float = INIT_STD
  attention_implementation: str | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    drop = nn.Dropout(self.dropout, deterministic=not train)
    attn = CausalSelfAttention(self.num_heads, rotary=self.rotary, use_bias=self.use_bias,
                               out_init_std=self.out_init_std, dtype=self.dtype,
                               attention_implementation=self.attention_implementation,
                               name="attn")
    x = x + drop(attn(_make_norm(self.norm, self.use_bias, "attn_norm")(x)))
    mlp = FeedForward(self.mlp_dim, kind=self.mlp, use_bias=self.use_bias,
                      out_init_std=self.out_init_std, dtype=self.dtype, name="mlp")
    return x + drop(mlp(_make_norm(self.norm, self.use_bias, "mlp_norm")(x)))


def _float32_dot_general(*args, **kwargs) -> jax.Array:
  """`lax.dot_general` accumulating and returning float32, for the untied head."""
  return jax.lax.dot_general(*args, preferred_element_type=jnp.float32, **kwargs)


def _float32_logits(x: jax.Array, table: jax.Array, dtype: Any) -> jax.Array:
  """x (B, T, D) @ table (V, D)^T in `dtype`, accumulated and returned in float32."""
  return jnp.einsum("btd,vd->btv", x.astype(dtype), table.astype(dtype),
                    preferred_element_type=jnp.float32)


class TransformerLM(nn.Module):
  """Decoder-only Transformer language model: tokens (B, T) int -> float32 logits (B, T, V).

  GPT-2's shape (Radford et al. 2019): token (and learned position) embeddings,
  dropout, `num_layers` pre-norm blocks of causal self-attention (Vaswani et al.
  2017) and an MLP, a final norm, and the token embedding reused as the output
  layer. Init as GPT-2: N(0, 0.02^2) kernels and embeddings, zero biases, and
  the residual projections (`attn/out`, `mlp/proj`) at 0.02 / sqrt(2 * num_layers)
  so the residual stream's variance does not grow with depth.

  Parameters: `token_embed/embedding` (V, D); `position_embed/embedding`
  (max_len, D) with learned positions; `block{i}/attn_norm`,
  `block{i}/attn/{query,key,value}` (kernel (D, N, H)), `block{i}/attn/out`
  (kernel (N, H, D)), `block{i}/mlp_norm`, `block{i}/mlp/{fc,proj}` (gelu) or
  `block{i}/mlp/{gate,up,proj}` (swiglu); `final_norm`; `head/kernel` (D, V) only
  when the embeddings are not tied.

  Attributes:
    vocab_size: V, the token ids' range and the logits' size.
    num_layers: decoder blocks.
    num_heads: attention heads N; embed_dim must divide by it.
    embed_dim: D, the residual stream's width.
    mlp_dim: the MLP's inner width.
    max_len: the context length; a longer input is refused. Sizes the learned
      position table.
    norm: "layernorm" (GPT-2) or "rmsnorm" (Zhang & Sennrich 2019; no bias).
    mlp: "gelu" (GPT-2) or "swiglu" (Shazeer 2020).
    positions: "learned" (GPT-2's table) or "rotary" (Su et al. 2021, base 10000).
    dropout: drop rate on the embeddings and on each residual branch, in train
      mode only (GPT-2's embd/resid dropout; none on attention weights).
    tie_embeddings: logits from the token embedding (GPT-2); else a separate
      bias-free `head`, the same shape as the tied one.
    use_bias: biases in the dense layers and the layer norms (GPT-2 has them).
    attention_implementation: None/"xla" or "cudnn" (fused GPU kernel, bf16/fp16).
    dtype: compute dtype of the matmuls; parameters, the residual stream, norms,
      softmax statistics and logits are float32.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> model = TransformerLM(vocab_size=256, num_layers=2, num_heads=2, embed_dim=32,
    ...                       mlp_dim=64, max_len=64, positions="rotary", dropout=0.1)
    >>> tokens = jnp.zeros((4, 16), jnp.int32)
    >>> variables = model.init(jax.random.key(0), tokens, train=False)
    >>> logits = model.apply(variables, tokens, train=True,
    ...                      rngs={"dropout": jax.random.key(1)})  # (4, 16, 256)
  """

  vocab_size: int
  num_layers: int = 4
  num_heads: int = 4
  embed_dim: int = 128
  mlp_dim: int = 512
  max_len: int = 256
  norm: str = "layernorm"
  mlp: str = "gelu"
  positions: str = "learned"
  dropout: float = 0.0
  tie_embeddings: bool = True
  use_bias: bool = True
  attention_implementation: str | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
    self._check_tokens(tokens)
    check_choice("positions", self.positions, POSITIONS)
    drop = nn.Dropout(self.dropout, deterministic=not train)
    token_embed = nn.Embed(self.vocab_size, self.embed_dim, embedding_init=_normal(INIT_STD),
                           dtype=jnp.float32, name="token_embed")
    x = token_embed(tokens)
    if self.positions == "learned":
      x = x + nn.Embed(self.max_len, self.embed_dim, embedding_init=_normal(INIT_STD),
                       dtype=jnp.float32, name="position_embed")(jnp.arange(tokens.shape[1]))
    x = drop(x)
    out_init_std = INIT_STD / math.sqrt(2 * self.num_layers)
    for layer in range(self.num_layers):
      x = DecoderBlock(self.num_heads, self.mlp_dim, norm=self.norm, mlp=self.mlp,
                       rotary=self.positions == "rotary", dropout=self.dropout,
                       use_bias=self.use_bias, out_init_std=out_init_std,
                       attention_implementation=self.attention_implementation,
                       dtype=self.dtype, name=f"block{layer}")(x, train)
    x = _make_norm(self.norm, self.use_bias, "final_norm")(x)
    if self.tie_embeddings:
      return _float32_logits(x, token_embed.embedding, self.dtype)
    head = nn.Dense(self.vocab_size, use_bias=False, dtype=self.dtype,
                    kernel_init=_normal(INIT_STD), dot_general=_float32_dot_general, name="head")
    return head(x)

  def _check_tokens(self, tokens: jax.Array) -> None:
    if tokens.ndim != 2:
      raise ValueError(f"TransformerLM expects tokens (batch, time); got shape {tokens.shape}.")
    if tokens.shape[1] > self.max_len:
      raise ValueError(f"TransformerLM got {tokens.shape[1]} tokens per sequence, more than "
                       f"its context length max_len={self.max_len}; cut the input into "
                       f"windows of at most max_len tokens or build the model with a larger "
                       f"max_len.")


def _check_positive_int(name: str, value: Any) -> None:
  check_type(name, value, int, what="a positive int")
  check_range(name, value, low=1)


def _check_fields(fields: dict[str, Any]) -> None:
  """Checks a complete set of `TransformerLM` fields (vocab_size and dtype aside)."""
  for name in ("num_layers", "num_heads", "embed_dim", "mlp_dim", "max_len"):
    _check_positive_int(name, fields[name])
  check_choice("norm", fields["norm"], NORMS)
  check_choice("mlp", fields["mlp"], MLPS)
  check_choice("positions", fields["positions"], POSITIONS)
  check_choice("attention_implementation", fields["attention_implementation"],
               ATTENTION_IMPLEMENTATIONS)
  check_type("dropout", fields["dropout"], (int, float), what="a number in [0, 1)")
  check_range("dropout", fields["dropout"], low=0.0, high=1.0, high_inclusive=False)
  for name in ("tie_embeddings", "use_bias"):
    check_type(name, fields[name], bool, what="a bool")
  embed_dim, num_heads = fields["embed_dim"], fields["num_heads"]
  if embed_dim % num_heads:
    raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}): "
                     "each head gets embed_dim / num_heads features.")
  if fields["positions"] == "rotary" and (embed_dim // num_heads) % 2:
    raise ValueError(f"positions='rotary' needs an even head size embed_dim / num_heads; got "
                     f"embed_dim={embed_dim}, num_heads={num_heads} (head size "
                     f"{embed_dim // num_heads}): rotary turns features in pairs.")


def make_transformer_lm(*, num_classes: int | None = None, dtype: Any = jnp.float32,
                        vocab_size: int | None = None, preset: str | None = None,
                        num_layers: int | None = None, num_heads: int | None = None,
                        embed_dim: int | None = None, mlp_dim: int | None = None,
                        max_len: int | None = None, norm: str | None = None,
                        mlp: str | None = None, positions: str | None = None,
                        dropout: float | None = None, tie_embeddings: bool | None = None,
                        use_bias: bool | None = None,
                        attention_implementation: str | None = None) -> TransformerLM:
  """Builds a `TransformerLM` from a preset plus explicit overrides, checking every field.

  `num_classes` and `vocab_size` are the same thing (a trainer passes
  `Dataset.num_classes`, the vocabulary size, as `num_classes`); give either.
  Without a preset the fields are those of "char_small"; a keyword that is
  given (not None) wins over the preset.

  Raises:
    ValueError: a bad value; the message names the field (and the allowed values).
    TypeError: a value of the wrong type, naming the field; Python's own for an
      unknown keyword.

  Example:
    >>> model = make_transformer_lm(preset="gpt2_small", vocab_size=50257, dtype=jnp.bfloat16)
    >>> modern = make_transformer_lm(preset="char_small", vocab_size=256, norm="rmsnorm",
    ...                              mlp="swiglu", positions="rotary")
  """
  if num_classes is not None and vocab_size is not None and num_classes != vocab_size:
    raise ValueError(f"vocab_size ({vocab_size}) and num_classes ({num_classes}) are the same "
                     "field for transformer_lm; give one of them.")
  vocab_size = vocab_size if vocab_size is not None else num_classes
  if vocab_size is None:
    raise ValueError("transformer_lm needs vocab_size (or num_classes): the dataset's "
                     "vocabulary size.")
  _check_positive_int("vocab_size", vocab_size)
  check_choice("preset", preset, (None,) + tuple(TRANSFORMER_PRESETS))
  fields = dict(TRANSFORMER_PRESETS[preset or DEFAULT_PRESET],
                attention_implementation=attention_implementation)
  overrides = dict(num_layers=num_layers, num_heads=num_heads, embed_dim=embed_dim,
                   mlp_dim=mlp_dim, max_len=max_len, norm=norm, mlp=mlp, positions=positions,
                   dropout=dropout, tie_embeddings=tie_embeddings, use_bias=use_bias)
  fields.update({k: v for k, v in overrides.items() if v is not None})
  _check_fields(fields)
  return TransformerLM(vocab_size=vocab_size, dtype=dtype, **fields)
