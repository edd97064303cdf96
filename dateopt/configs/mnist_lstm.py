"""MNIST read row by row by an LSTM (TFDS), batch 128 -> 8K with LEGW (the SC'19 setting).

Needs MNIST prepared in a TFDS data dir (array_record format):
  dateopt-train --config configs/mnist_lstm.py --workdir runs/mnist_lstm \
      --config.data_dir=/path/to/tensorflow_datasets
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "mnist"
  config.dataset_kwargs = dict(layout="sequence")
  config.model = "lstm_classifier"
  config.model_kwargs = dict(hidden_size=128, num_layers=1)
  config.baseline = dict(
      batch_size=128, num_epochs=25, optimizer="adam", learning_rate=1e-3,
      warmup_epochs=0.2, decay="cosine")
  config.batch_size = 8192
  return config
