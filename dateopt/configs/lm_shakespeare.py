"""A byte-level decoder-only Transformer on Shakespeare's plays: the language-model workload.

The model is `transformer_lm`'s "char_small" preset (GPT-2's shape at CPU size: pre-norm
blocks, causal attention through `jax.nn.dot_product_attention`, learned positions, tied
embeddings), reading 128-byte windows of the 38 training works of the pinned `shakespeare`
0.6 corpus (`python scripts/prepare_data.py shakespeare`); the 4 validation works are
held out whole, and evaluated on 1,024 windows spread over them.

The baseline is AdamW (β2 0.99, weight decay 0.1 off the norms, biases and position table),
2% linear warmup then cosine to 10% of the peak, the global norm clipped at 1.0, at batch
16 (2,048 tokens a step). Its LR was tuned once at that batch, by the sweep below, and is
frozen: every batch size and strategy of the study starts from it.

LR sweep at batch 16, seed 0 (final validation loss in nats / bits per byte; the unigram
entropy of the training bytes is 4.81 bits per byte):
SWEEP_TABLE

  dateopt-train --config lm_shakespeare --workdir runs/lm_b16
  python scripts/main_job.py --config configs/lm_shakespeare.py --workdir runs/lm_shakespeare
  python -m dateopt.study --workload lm --strategies baseline,adaptive,adaptive_grow,legw
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "shakespeare"
  config.dataset_kwargs = dict(seq_len=128, eval_windows=512)
  config.model = "transformer_lm"
  config.model_kwargs = dict(preset="char_small")
  config.baseline = dict(
      batch_size=4, num_epochs=0.4, optimizer="adamw", learning_rate=2e-3, b2=0.99,
      weight_decay=0.1, warmup_epochs=0.008, decay="cosine", end_value=2e-4,
      grad_clip_norm=1.0)
  config.grad_groups = 4
  config.eval_batch_size = 256
  config.eval_every_steps = 600
  config.log_every_steps = 50
  config.checkpoint_every_steps = 500
  return config
