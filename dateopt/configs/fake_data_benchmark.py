"""ResNet-50 on random 224x224 images: input-free step timing (no dataset needed).

  dateopt-train --config configs/fake_data_benchmark.py --workdir /tmp/fake \
      --config.batch_size=256 --config.num_train_steps=100
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "fake_images"
  # uint8, as imagenet2012's pipeline sends them: the model normalises on the device.
  # A small eval split: the final evaluation only shows that eval runs.
  config.dataset_kwargs = dict(image_shape=(224, 224, 3), num_classes=1000, uint8=True,
                               num_eval_examples=64)
  config.model = "resnet50"
  config.compute_dtype = "bfloat16"
  config.baseline = dict(
      batch_size=8, num_epochs=1, optimizer="lars", learning_rate=0.1, weight_decay=1e-4,
      warmup_epochs=0.1, decay="polynomial", end_value=1e-4)
  config.batch_size = None
  config.num_train_steps = 20
  config.grad_groups = 0
  config.statistics = False
  config.guard = False
  config.eval_every_steps = 0
  config.checkpoint_every_steps = -1
  return config
