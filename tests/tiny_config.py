"""A tiny MNIST-1D LSTM config for the subprocess tests (resume, multi-host)."""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset_kwargs = dict(num_samples=1200)
  config.model_kwargs = dict(hidden_size=16)
  config.baseline = dict(batch_size=16, num_epochs=2, optimizer="adam", learning_rate=3e-3,
                         warmup_epochs=0.1, decay="cosine")
  config.batch_size = 64
  config.log_every_steps = 10
  config.eval_every_steps = 0
  config.progress_bar = False
  # Its 120 baseline steps end on the LSTM's chance plateau: an adaptive run of it has not
  # learnt by a quarter of its progress, and DATE's divergence watch rightly stops it
  # (tests/test_divergence.py). The tests of resume, growth and faults run it anyway.
  config.divergence_watch = False
  return config


def with_fields(**fields):
  """`get_config()` with `fields` set: how the tests vary it (`tiny(...)` in conftest.py)."""
  config = get_config()
  for key, value in fields.items():
    setattr(config, key, value)
  return config
