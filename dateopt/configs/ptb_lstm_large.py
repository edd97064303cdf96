"""PTB word-level LSTM language model, Zaremba et al. "large" (2x1500, unroll 35, dropout 0.65).

Baseline: SGD lr 1.0 at batch 20, 55 epochs, clip 10; DATE plans batch 640 (32x).
  dateopt-train --config configs/ptb_lstm_large.py --workdir runs/ptb_large \
      --config.data_dir=/path/to/ptb
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "ptb"
  config.dataset_kwargs = dict(seq_len=35)
  config.model = "lstm_lm"
  config.model_kwargs = dict(preset="ptb_large")
  config.baseline = dict(
      batch_size=20, num_epochs=55, optimizer="sgd", learning_rate=1.0,
      warmup_epochs=0.1, decay="exponential", decay_rate=0.87, decay_every_epochs=1.0,
      grad_clip_norm=10.0, mask="all")
  config.batch_size = 640
  config.grad_groups = 4
  return config
