"""PTB word-level LSTM language model, Zaremba et al. "small" (2x200, unroll 20).

Baseline: SGD lr 1.0 at batch 20, x0.5 per epoch after epoch 4, 13 epochs,
clip 5. DATE plans batch 320 (16x) with LEGW.
  dateopt-train --config configs/ptb_lstm_small.py --workdir runs/ptb_small \
      --config.data_dir=/path/to/ptb   # ptb.train.txt, ptb.valid.txt, ptb.test.txt
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "ptb"
  config.dataset_kwargs = dict(seq_len=20)
  config.model = "lstm_lm"
  config.model_kwargs = dict(preset="ptb_small")
  config.baseline = dict(
      batch_size=20, num_epochs=13, optimizer="sgd", learning_rate=1.0,
      warmup_epochs=0.1, decay="exponential", decay_rate=0.5, decay_every_epochs=1.0,
      grad_clip_norm=5.0, mask="all")
  config.batch_size = 320
  config.grad_groups = 4
  return config
