"""ResNet-50 on ImageNet with LARS at batch 32K, MLPerf-style (REFERENCE.md section 4).

The tuned 32,768 recipe is trained as it is (no planning): peak LR 29, 18
warmup epochs, momentum 0.929, weight decay 1e-4, polynomial power 2 to 1e-4,
label smoothing 0.1, 60 epochs, BN and biases excluded from LARS, ghost BN
over 64 images, bf16 compute.
  dateopt-train --config configs/imagenet_resnet50.py --workdir gs://bucket/run \
      --config.data_dir=gs://bucket/tensorflow_datasets
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "imagenet2012"
  config.model = "resnet50"
  config.model_kwargs = dict(bn_group_size=64)
  config.compute_dtype = "bfloat16"
  config.baseline = dict(
      batch_size=32768, num_epochs=60, optimizer="lars", learning_rate=29.0,
      momentum=0.929, weight_decay=1e-4, warmup_epochs=18, decay="polynomial",
      power=2.0, end_value=1e-4, label_smoothing=0.1, mask="exclude_bias_and_norm")
  config.batch_size = None
  config.log_every_steps = 20
  config.checkpoint_every_steps = 200
  config.eval_every_steps = 4 * 39  # about every 4 epochs at 32K
  config.polish_batches = 20  # grad_groups 8: 4096-example groups, 64 ghost-BN groups each
  return config
