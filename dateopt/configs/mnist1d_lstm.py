"""The offline default: an LSTM reads MNIST-1D (40 steps), DATE grows its batch 16x.

The baseline is a tuned small-batch Adam recipe (batch 32); `batch_size` is the
target DATE plans for with LEGW (peak LR x sqrt(k), warmup epochs x k).

  dateopt-train --config configs/mnist1d_lstm.py --workdir runs/mnist1d_lstm
  dateopt-train --config configs/mnist1d_lstm.py --workdir runs/b32 --config.batch_size=32
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "mnist1d"
  config.dataset_kwargs = dict(num_samples=10_000)
  config.model = "lstm_classifier"
  config.model_kwargs = dict(hidden_size=64, num_layers=1)
  config.baseline = dict(
      batch_size=32, num_epochs=30, optimizer="adam", learning_rate=2e-3,
      warmup_epochs=0.25, decay="cosine", end_value=0.0)
  config.batch_size = 512  # 16x the baseline
  config.strategy = "legw"
  config.grad_groups = 8
  config.log_every_steps = 20
  config.checkpoint_every_steps = 500
  return config
