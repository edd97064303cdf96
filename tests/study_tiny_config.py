"""A tiny MNIST-1D LSTM workload for the scaling study's --quick test."""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset_kwargs = dict(num_samples=2000)
  config.model_kwargs = dict(hidden_size=16)
  config.baseline = dict(batch_size=8, num_epochs=2, optimizer="adam", learning_rate=1e-2,
                         warmup_epochs=0.02, decay="cosine")
  config.grad_groups = 4
  config.eval_batch_size = 400
  config.log_every_steps = 10
  # Its baseline stays at chance (10%): DATE's divergence watch would rightly stop the
  # adaptive cells (no learning by a quarter of the progress). The test is of the grid.
  config.divergence_watch = False
  return config
