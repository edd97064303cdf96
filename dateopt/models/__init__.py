"""Reference models for large-batch training (Flax Linen).

Every model is called as
`model.apply(variables, inputs, train=..., mutable=[...], rngs={"dropout": key})`
and returns float32 logits: (B, num_classes) for classifiers, (B, T, vocab)
for the language models. ResNets keep batch-norm statistics in the
"batch_stats" collection (`mutable=["batch_stats"]` when `train=True`); the
LSTMs and the Transformer have none, and the language models draw dropout from
the "dropout" rng.

This package is independent of `dateopt.data` and `dateopt.train` and never
imports TensorFlow, tensorflow-datasets or grain.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from dateopt.models import create_model
  >>> model = create_model("resnet_tiny", num_classes=10)
  >>> x = jnp.zeros((8, 8, 8, 1))
  >>> variables = model.init(jax.random.key(0), x, train=False)
  >>> logits, updates = model.apply(variables, x, train=True, mutable=["batch_stats"])
"""

from __future__ import annotations

from dateopt import extras

# Before the imports that need it: a missing Flax is one line naming the extra.
extras.require_extra("dateopt.models", extra="train", modules=extras.MODELS_MODULES)

# ruff: noqa: E402
import functools
from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from dateopt.models.lstm import (
    PTB_PRESETS,
    LSTMClassifier,
    LSTMLanguageModel,
    make_lstm_classifier,
    make_lstm_lm,
    symmetric_uniform,
)
from dateopt.models.resnet import (
    BN_EPSILON,
    BN_MOMENTUM,
    RESNET_CONFIGS,
    BasicBlock,
    BottleneckBlock,
    GhostBatchNorm,
    ResNet,
    make_resnet,
)
from dateopt.models.transformer import (
    TRANSFORMER_PRESETS,
    TransformerLM,
    make_transformer_lm,
)
from dateopt.validation import check_choice


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    # partial keeps make_resnet's name in Python's own TypeError for an unknown keyword.
    **{name: functools.partial(make_resnet, name) for name in RESNET_CONFIGS},
    "lstm_classifier": make_lstm_classifier,
    "lstm_lm": make_lstm_lm,
    "transformer_lm": make_transformer_lm,
}
#: The names `create_model` builds.
MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)

_COMPUTE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def create_model(name: str, *, num_classes: int | None = None, dtype: Any = jnp.float32,
                 **kwargs: Any) -> nn.Module:
  """Builds a reference model by name.

  Names and their extra keyword arguments:
    - "resnet18", "resnet34", "resnet50", "resnet101", "resnet152": ResNet v1.5
      (He et al. 2016), 1000 classes unless told; `bn_group_size` (ghost batch
      norm, Hoffer et al. 2017), `bn_momentum` (0.9), `num_filters`,
      `stage_sizes`, `stem`, `input_normalization` ((mean, std) per channel,
      applied on the accelerator to uint8 images).
    - "resnet_tiny": 3 stages x 1 basic block, 16 filters, 3x3 stem, no
      max-pool (8x8 digits to 32x32 images), 10 classes unless told.
    - "lstm_classifier": `hidden_size` (128), `num_layers` (1); 10 classes
      unless told; inputs (B, T, F).
    - "lstm_lm": Zaremba et al. 2014; `vocab_size` (or `num_classes`, the same
      thing), `preset` ("ptb_small", "ptb_medium", "ptb_large"; default
      shapes are ptb_small's), `hidden_size`, `num_layers`, `dropout`,
      `init_scale`, `tie_embeddings` (False). Explicit kwargs override the
      preset. The preset's unrolled length is `PTB_PRESETS[preset]["seq_len"]`.
    - "transformer_lm": decoder-only Transformer (GPT-2 shape); `vocab_size`
      (or `num_classes`), `preset` ("tiny", "char_small", "gpt2_small"; default
      shapes are char_small's), `num_layers`, `num_heads`, `embed_dim`,
      `mlp_dim`, `max_len` (the context length), `norm` ("layernorm",
      "rmsnorm"), `mlp` ("gelu", "swiglu"), `positions` ("learned", "rotary"),
      `dropout`, `tie_embeddings` (True), `use_bias` (True),
      `attention_implementation` (None/"xla", or "cudnn" for the fused GPU
      kernel). Explicit kwargs override the preset; `TRANSFORMER_PRESETS` holds
      the presets' fields.

  Args:
    name: one of `MODEL_NAMES`.
    num_classes: classifier outputs (the vocabulary size for the language models).
    dtype: compute dtype: float32, bfloat16 or float16 (or their names).
      Parameters and batch-norm statistics stay float32.
    **kwargs: model-specific fields, listed above; passed straight to the
      model's builder.

  Returns:
    A `flax.linen.Module`.

  Raises:
    ValueError: unknown name (the message lists the allowed ones) or bad
      value (the message names the field).
    TypeError: Python's own, for a keyword argument the model's builder does
      not take: "make_resnet() got an unexpected keyword argument 'foo'".

  Example:
    >>> model = create_model("resnet50", num_classes=1000, dtype=jnp.bfloat16,
    ...                      bn_group_size=32)
    >>> lm = create_model("lstm_lm", preset="ptb_small", vocab_size=10_000)
    >>> gpt = create_model("transformer_lm", preset="gpt2_small", vocab_size=50257)
  """
  check_choice("model name", name, MODEL_NAMES)
  return _BUILDERS[name](num_classes=num_classes, dtype=_compute_dtype(dtype), **kwargs)


def _compute_dtype(dtype: Any) -> jnp.dtype:
  try:
    canonical = jnp.dtype(dtype)
  except TypeError as error:
    raise ValueError(
        f"dtype must be a floating dtype such as jnp.bfloat16; got {dtype!r}.") from error
  check_choice("dtype", canonical, _COMPUTE_DTYPES)
  return canonical


__all__ = [
    "BN_EPSILON",
    "BN_MOMENTUM",
    "BasicBlock",
    "BottleneckBlock",
    "GhostBatchNorm",
    "LSTMClassifier",
    "LSTMLanguageModel",
    "MODEL_NAMES",
    "PTB_PRESETS",
    "RESNET_CONFIGS",
    "ResNet",
    "TRANSFORMER_PRESETS",
    "TransformerLM",
    "create_model",
    "make_lstm_classifier",
    "make_lstm_lm",
    "make_resnet",
    "make_transformer_lm",
    "symmetric_uniform",
]
