"""LSTM models: a sequence classifier and the PTB word-level language model.

Both scan an `nn.OptimizedLSTMCell` over time with `nn.RNN` (one compiled
loop body, whatever the sequence length) and start every batch from a zero
state: no hidden state is carried between batches.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dateopt.validation import check_choice, check_range, check_type

#: Zaremba et al. 2014, "Recurrent Neural Network Regularization", Sec. 4.1: two layers; small
#: 200 units unrolled 20 steps, no dropout, init U(-0.1, 0.1); medium 650 units, 35 steps,
#: dropout 0.5, U(-0.05, 0.05); large 1500 units, 35 steps, dropout 0.65, U(-0.04, 0.04).
#: `seq_len` is the unrolled length: a data setting (pass it to `get_dataset("ptb",
#: seq_len=...)`), not a model field.
PTB_PRESETS: dict[str, dict[str, Any]] = {
    "ptb_small": dict(num_layers=2, hidden_size=200, dropout=0.0, init_scale=0.1, seq_len=20),
    "ptb_medium": dict(num_layers=2, hidden_size=650, dropout=0.5, init_scale=0.05, seq_len=35),
    "ptb_large": dict(num_layers=2, hidden_size=1500, dropout=0.65, init_scale=0.04, seq_len=35),
}


def symmetric_uniform(scale: float) -> nn.initializers.Initializer:
  """Initialiser drawing from U(-scale, scale), as Zaremba et al. 2014 do for every weight.

  Example:
    >>> w = symmetric_uniform(0.1)(jax.random.key(0), (3, 4))
  """

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, minval=-scale, maxval=scale)

  return init


def _lstm_stack(x: jax.Array, hidden_size: int, num_layers: int, dtype: Any,
                dropout: nn.Module | None = None, **cell_kwargs) -> jax.Array:
  """Runs `num_layers` LSTM layers over (B, T, F); applies `dropout` after each layer."""
  for layer in range(num_layers):
    # The cell carries the name, so parameters read "lstm1/ii/kernel", ...
    cell = nn.OptimizedLSTMCell(hidden_size, dtype=dtype, name=f"lstm{layer + 1}", **cell_kwargs)
    x = nn.RNN(cell)(x)
    if dropout is not None:
      x = dropout(x)
  return x


class LSTMClassifier(nn.Module):
  """Reads a sequence (B, T, F) step by step and classifies it from the last hidden state.

  The MNIST-LSTM of You et al. 2019 ("Large-Batch Training for LSTM and
  Beyond") reads the 28 rows of an MNIST image as 28 steps of 28 features;
  MNIST-1D (Greydanus 2020) is 40 steps of one feature.

  Attributes:
    num_classes: classifier outputs.
    hidden_size: LSTM units per layer.
    num_layers: stacked LSTM layers.
    dtype: compute dtype; parameters stay float32, logits are float32.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> model = LSTMClassifier(num_classes=10, hidden_size=128)
    >>> x = jnp.zeros((4, 28, 28))
    >>> variables = model.init(jax.random.key(0), x, train=False)
    >>> logits = model.apply(variables, x, train=True)  # (4, 10)
  """

  num_classes: int = 10
  hidden_size: int = 128
  num_layers: int = 1
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    del train  # no dropout or batch statistics: same function in both modes.
    if x.ndim != 3:
      raise ValueError("LSTMClassifier expects inputs (batch, time, features); "
                       f"got shape {x.shape}.")
    x = _lstm_stack(jnp.asarray(x, self.dtype), self.hidden_size, self.num_layers, self.dtype)
    logits = nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x[:, -1])
    return jnp.asarray(logits, jnp.float32)


class LSTMLanguageModel(nn.Module):
  """Word-level LSTM language model of Zaremba et al. 2014: tokens (B, T) -> logits (B, T, V).

  Dropout sits on the non-recurrent connections only, as in the paper: on the
  embeddings, between LSTM layers and before the softmax layer. Every weight
  starts from U(-init_scale, init_scale). Each batch starts from a zero state
  (no truncated-BPTT state carried between batches), so windows can be
  shuffled and batches fetched by random access.

  Attributes:
    vocab_size: vocabulary size (also the output size).
    hidden_size: embedding size and LSTM units per layer.
    num_layers: stacked LSTM layers.
    dropout: drop rate on non-recurrent connections (train mode only).
    init_scale: half-width of the uniform initialisation.
    tie_embeddings: reuse the embedding matrix as the output layer.
    dtype: compute dtype; parameters stay float32, logits are float32.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> model = LSTMLanguageModel(vocab_size=100, hidden_size=32, dropout=0.5)
    >>> tokens = jnp.zeros((4, 20), jnp.int32)
    >>> variables = model.init(jax.random.key(0), tokens, train=False)
    >>> logits = model.apply(variables, tokens, train=True,
    ...                      rngs={"dropout": jax.random.key(1)})  # (4, 20, 100)
  """

  vocab_size: int
  hidden_size: int = 200
  num_layers: int = 2
  dropout: float = 0.0
  init_scale: float = 0.1
  tie_embeddings: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
    init = symmetric_uniform(self.init_scale)
    drop = nn.Dropout(self.dropout, deterministic=not train)
    embed = nn.Embed(self.vocab_size, self.hidden_size, embedding_init=init, dtype=self.dtype,
                     name="embed")
    x = drop(embed(tokens))
    x = _lstm_stack(x, self.hidden_size, self.num_layers, self.dtype, dropout=drop,
                    kernel_init=init, recurrent_kernel_init=init, bias_init=init)
    if self.tie_embeddings:
      logits = embed.attend(x)
    else:
      logits = nn.Dense(self.vocab_size, kernel_init=init, bias_init=init, dtype=self.dtype,
                        name="head")(x)
    return jnp.asarray(logits, jnp.float32)


def _check_positive_int(name: str, value: Any) -> None:
  check_type(name, value, int, what="a positive int")
  check_range(name, value, low=1)


def make_lstm_classifier(*, num_classes: int | None = None, dtype: Any = jnp.float32,
                         hidden_size: int = 128, num_layers: int = 1) -> LSTMClassifier:
  """Builds an `LSTMClassifier` (10 classes unless told), checking every field.

  Example:
    >>> model = make_lstm_classifier(num_classes=10, hidden_size=128, num_layers=1)
  """
  num_classes = 10 if num_classes is None else num_classes
  for name, value in [("num_classes", num_classes), ("hidden_size", hidden_size),
                      ("num_layers", num_layers)]:
    _check_positive_int(name, value)
  return LSTMClassifier(num_classes=num_classes, hidden_size=hidden_size,
                        num_layers=num_layers, dtype=dtype)


def make_lstm_lm(*, num_classes: int | None = None, dtype: Any = jnp.float32,
                 vocab_size: int | None = None, preset: str | None = None,
                 hidden_size: int | None = None, num_layers: int | None = None,
                 dropout: float | None = None, init_scale: float | None = None,
                 tie_embeddings: bool = False) -> LSTMLanguageModel:
  """Builds an `LSTMLanguageModel` from an optional PTB preset plus explicit overrides.

  `num_classes` and `vocab_size` are the same thing (a trainer passes
  `Dataset.num_classes`, the vocabulary size, as `num_classes`); give either.
  Without a preset the defaults are those of "ptb_small".

  Example:
    >>> model = make_lstm_lm(preset="ptb_medium", vocab_size=10_000)
  """
  if num_classes is not None and vocab_size is not None and num_classes != vocab_size:
    raise ValueError(f"vocab_size ({vocab_size}) and num_classes ({num_classes}) are the same "
                     "field for lstm_lm; give one of them.")
  vocab_size = vocab_size if vocab_size is not None else num_classes
  if vocab_size is None:
    raise ValueError("lstm_lm needs vocab_size (or num_classes): the dataset's vocabulary size.")
  _check_positive_int("vocab_size", vocab_size)
  check_choice("preset", preset, (None,) + tuple(PTB_PRESETS))
  fields = dict(PTB_PRESETS[preset or "ptb_small"])
  del fields["seq_len"]
  overrides = dict(hidden_size=hidden_size, num_layers=num_layers, dropout=dropout,
                   init_scale=init_scale)
  fields.update({k: v for k, v in overrides.items() if v is not None})
  _check_positive_int("hidden_size", fields["hidden_size"])
  _check_positive_int("num_layers", fields["num_layers"])
  check_type("dropout", fields["dropout"], (int, float), what="a number in [0, 1)")
  check_range("dropout", fields["dropout"], low=0.0, high=1.0, high_inclusive=False)
  check_type("init_scale", fields["init_scale"], (int, float), what="a positive number")
  check_range("init_scale", fields["init_scale"], low=0.0, low_inclusive=False)
  check_type("tie_embeddings", tie_embeddings, bool, what="a bool")
  return LSTMLanguageModel(vocab_size=vocab_size, tie_embeddings=tie_embeddings, dtype=dtype,
                           **fields)
