"""A byte-level decoder-only Transformer on Shakespeare's plays: the language-model workload.

The model is `transformer_lm`'s "char_small" preset (GPT-2's shape at CPU size: 4 pre-norm
blocks of width 128, causal attention through `jax.nn.dot_product_attention`, learned
positions, tied embeddings; 0.86M parameters), reading 128-byte windows of the 38 training
works of the pinned `shakespeare` 0.6 corpus (`python scripts/prepare_data.py shakespeare`);
the 4 validation works are held out whole and evaluated on 512 windows spread over them.

The baseline is AdamW (β2 0.99, weight decay 0.1 off the norms, biases and position table),
2% linear warmup then cosine to 2e-4 (a tenth of the tuned peak), the global norm clipped
at 1.0, at batch 4 windows (512 tokens a step) for 0.4 epochs: 3,618 steps, 1.85M tokens,
about 4 minutes on 2 CPU cores. The batch sits below the gradient noise scale the runs
measure (10 to 400 windows over the run); at batch 16 the noise scale read 1 to 33 windows
until the last tenth of the run, too little for a 16x batch to save 8x the steps
(docs/results/language_model.md). Its LR was tuned once at batch 4, by the sweep below,
and is frozen: every batch size and strategy of the study starts from it.

LR sweep at batch 4, seed 0, every other field as here (final validation loss in nats,
and bits per byte; the training bytes' unigram entropy is 4.81 bits per byte):

  peak LR       5e-4    1e-3    2e-3    4e-3    8e-3
  loss, nats    1.9697  1.8567  1.7237  1.7425  1.7470
  bits / byte   2.842   2.679   2.487   2.514   2.520

  dateopt-train --config lm_shakespeare --workdir runs/lm_sweep_b4/lr2e-3 \
      --config.baseline.learning_rate=2e-3
  python scripts/main_job.py --config configs/lm_shakespeare.py --workdir runs/lm_shakespeare
  python -m dateopt.study --workload lm   # the study's cheaper LM: study_lm_shakespeare
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
