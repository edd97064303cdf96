"""A tiny ResNet on scikit-learn's 8x8 digits with LARS; DATE plans a 16x batch (offline).

  dateopt-train --config configs/digits_resnet.py --workdir runs/digits_resnet
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "digits"
  config.model = "resnet_tiny"
  config.baseline = dict(
      batch_size=16, num_epochs=30, optimizer="lars", learning_rate=1.0, momentum=0.9,
      weight_decay=1e-4, warmup_epochs=0.5, decay="polynomial", power=2.0,
      end_value=1e-4, label_smoothing=0.1)
  config.batch_size = 256
  config.log_every_steps = 10
  config.grad_groups = 2  # groups of 128 = 8 ghost-BN groups of 16
  config.model_kwargs = dict(bn_group_size=16)
  config.polish.mode = "precise_bn"  # Final Polishing: BN statistics on non-augmented data
  config.polish.batches = 4
  return config
