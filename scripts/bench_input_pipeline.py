"""Images/s and images per CPU-second of the ImageNet training pipeline, against tf.data.

Makes its own synthetic ImageNet-like JPEGs (mostly 500x375 at quality 90,
like an average ImageNet image), then reads them as training batches with
dateopt's pipeline (`dateopt.data.jpeg.JpegSource` in `Dataset` worker
processes: decode at the crop's scale, Inception crop, resize to 224, flip,
uint8) at each worker count, and, if TensorFlow is installed (the `prepare`
extra), with tf.data's standard pipeline on the same files
(`decode_and_crop_jpeg` with `sample_distorted_bounding_box`, bilinear resize
to 224, flip, normalisation; parallel map and prefetch on AUTOTUNE), and
with the same pipeline ending in uint8 instead of normalising (dateopt's own
output: the model normalises on the device). The ratio column compares with
the normalised one, the pipeline TPU recipes ship. The pipelines take turns,
`--rounds` times, so a slower or busier moment of the machine falls on all
of them.

CPU time counts the main process and all its worker processes. The host
cores a TPU host needs follow from images per CPU-second and `HOST_RATE`.

  python scripts/bench_input_pipeline.py                      # 1,000 JPEGs, 3 rounds
  python scripts/bench_input_pipeline.py --memory 1024,4096   # peak host memory per batch

Prints a table and one JSON line; `--out` writes the JSON there too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
from PIL import Image

from dateopt.data.base import Dataset
from dateopt.data.jpeg import JpegFiles, JpegSource

# Training images/s a v3-8 host must prepare to keep ResNet-50 busy: ~1,000 per TensorCore
# at MLPerf rates, 8 cores. A v4-8 host (4 chips of 2 cores, each chip ~2 v3 cores) needs
# about as many.
HOST_RATE = 8000
# The pipeline dateopt's images per CPU-second are held against (notes/input_pipeline.md,
# "Final figures").
TF_REFERENCE = "tf.data, AUTOTUNE, normalised"
IMAGE_SIZE = 224


def synthetic_jpeg(height: int, width: int, rng: np.random.Generator,
                   subsampling: str = "420") -> bytes:
  """A photo-like JPEG at quality 90: colour regions, colour texture and sensor noise.

  About 107 KB at 500x375, ImageNet's average file size (~110 KB). Chroma
  4:2:0 by default, as cameras and libjpeg's cjpeg write most of ImageNet.
  """
  import simplejpeg  # pylint: disable=g-import-not-at-top  (the data extra)

  coarse = rng.uniform(0, 255, (height // 16 + 2, width // 16 + 2, 3)).astype(np.uint8)
  image = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.float32)
  texture = rng.normal(128, 40, (height // 4 + 1, width // 4 + 1, 3))
  texture = Image.fromarray(np.clip(texture, 0, 255).astype(np.uint8)).resize(
      (width, height), Image.BILINEAR)
  image += np.asarray(texture, np.float32) - 128 + rng.normal(0, 12, (height, width, 1))
  return simplejpeg.encode_jpeg(np.clip(image, 0, 255).astype(np.uint8), quality=90,
                                colorsubsampling=subsampling)


def make_jpegs(directory: str, count: int, subsampling: str = "420",
               seed: int = 0) -> tuple[str, ...]:
  """`count` synthetic JPEGs in `directory`/`subsampling` (a rerun reuses the files there)."""
  directory = os.path.join(directory, subsampling)
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  paths = []
  for index in range(count):
    path = os.path.join(directory, f"{index:05d}.jpg")
    height, width = (500, 375) if index % 4 == 0 else (375, 500)  # a quarter portrait
    if not os.path.exists(path):
      with open(path, "wb") as file:
        file.write(synthetic_jpeg(height, width, rng, subsampling))
    paths.append(path)
  return tuple(paths)


def process_tree_stats(pid: int | None = None) -> list[list[str]]:
  """`/proc/<pid>/stat` fields (after the command name) of a process and its live descendants."""
  pid = os.getpid() if pid is None else pid
  stats = {}
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat") as file:
        stats[int(name)] = file.read().rsplit(")", 1)[1].split()
    except OSError:  # it exited meanwhile
      continue
  parents = {process: int(fields[1]) for process, fields in stats.items()}

  def in_tree(process: int) -> bool:
    while process not in (0, 1, pid) and process in parents:
      process = parents[process]
    return process == pid

  return [fields for process, fields in stats.items() if in_tree(process)]


def tree_cpu_seconds(pid: int | None = None) -> float:
  """User + system CPU seconds of a process and all its live descendants (Linux /proc)."""
  tick = os.sysconf("SC_CLK_TCK")
  return sum(int(f[11]) + int(f[12]) for f in process_tree_stats(pid)) / tick


def tree_rss_bytes(pid: int | None = None) -> float:
  """Resident bytes of a process and its live descendants (Linux /proc)."""
  return float(sum(int(f[21]) for f in process_tree_stats(pid)) * os.sysconf("SC_PAGE_SIZE"))


def dateopt_batches(paths, batch_size: int, num_workers: int):
  labels = tuple(index % 1000 for index in range(len(paths)))
  source = JpegSource(JpegFiles(tuple(paths), labels), IMAGE_SIZE)
  dataset = Dataset("synthetic_jpegs", "classification", 1000, (IMAGE_SIZE, IMAGE_SIZE, 3),
                    np.dtype(np.uint8), source, source, num_workers=num_workers)
  return dataset.train_iterator(batch_size, seed=0)


def tf_batches(paths, batch_size: int, normalise: bool = True):
  """tf.data's standard ResNet training input (the TPU reference's preprocessing).

  With `normalise` the batch is float32, normalised on the host as that
  pipeline does; without it the resized crop is cast back to uint8: the same
  host work and output as dateopt's pipeline, which normalises on the device.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (optional)

  mean = tf.constant([0.485 * 255, 0.456 * 255, 0.406 * 255])
  std = tf.constant([0.229 * 255, 0.224 * 255, 0.225 * 255])

  def parse(path, label):
    data = tf.io.read_file(path)
    shape = tf.io.extract_jpeg_shape(data)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
        max_attempts=10, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.io.decode_and_crop_jpeg(data, window, channels=3)
    image = tf.image.resize(image, [IMAGE_SIZE, IMAGE_SIZE], method="bilinear")
    image = tf.image.random_flip_left_right(image)
    if not normalise:
      return tf.cast(tf.round(image), tf.uint8), label
    return (image - mean) / std, label

  labels = [index % 1000 for index in range(len(paths))]
  dataset = tf.data.Dataset.from_tensor_slices((list(paths), labels)).repeat()
  dataset = dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size)
  return iter(dataset.prefetch(tf.data.AUTOTUNE).as_numpy_iterator())


def measure(batches, num_batches: int, warmup_batches: int) -> dict[str, float]:
  """Images/s and images per CPU-second over `num_batches`, after `warmup_batches`.

  The warm-up covers the workers' start and drains what they prepared ahead
  meanwhile (a prefetch buffer full at the start of the window, and empty at
  its end, would count work done before it).
  """
  for _ in range(warmup_batches):
    first = next(batches)
  rows = len(first[0] if isinstance(first, tuple) else first["inputs"])
  cpu, wall = tree_cpu_seconds(), time.perf_counter()
  for _ in range(num_batches):
    next(batches)
  wall, cpu = time.perf_counter() - wall, tree_cpu_seconds() - cpu
  close = getattr(batches, "close", None)
  if close is not None:
    close()
  images = rows * num_batches
  return {"images_per_second": images / wall, "images_per_cpu_second": images / cpu,
          "cpu_seconds": cpu, "wall_seconds": wall}


def tensorflow_version() -> str | None:
  try:
    import tensorflow  # pylint: disable=g-import-not-at-top  (optional)
  except ImportError:
    return None
  return tensorflow.__version__


def throughput(paths, args) -> dict[str, dict[str, float]]:
  pipelines = {f"dateopt, {w} worker{'s' * (w > 1)}": (lambda w=w: dateopt_batches(
      paths, args.batch_size, w)) for w in args.workers}
  if tensorflow_version() and not args.no_tf:
    pipelines[TF_REFERENCE] = lambda: tf_batches(paths, args.batch_size)
    pipelines["tf.data, AUTOTUNE, uint8 out"] = lambda: tf_batches(paths, args.batch_size,
                                                                   normalise=False)
  runs = {name: [] for name in pipelines}
  for round_index in range(args.rounds):
    for name, make in pipelines.items():
      result = measure(make(), args.batches, args.warmup_batches)
      runs[name].append(result)
      print(f"round {round_index + 1}: {name}: {result['images_per_second']:.0f} images/s, "
            f"{result['images_per_cpu_second']:.0f} per CPU-second", file=sys.stderr)
  return {name: {key: statistics.median(run[key] for run in results) for key in results[0]}
          for name, results in runs.items()}


def peak_memory(paths, batch_size: int, num_workers: int, num_batches: int) -> float:
  """Peak resident memory (GiB) of this process and its workers, sampled every 20 ms."""
  records = tuple(paths[i % len(paths)] for i in range(2 * batch_size))
  peak, running = [0.0], [True]

  def sample():
    while running[0]:
      peak[0] = max(peak[0], tree_rss_bytes())
      time.sleep(0.02)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  batches = dateopt_batches(records, batch_size, num_workers)
  for _ in range(num_batches):
    next(batches)
  batches.close()
  running[0] = False
  sampler.join()
  return peak[0] / 2**30


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=int, default=1000, help="synthetic JPEGs to make")
  parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dateopt_bench_jpegs"))
  parser.add_argument("--subsampling", default="420", choices=["420", "422", "444"],
                      help="chroma subsampling of the synthetic JPEGs")
  parser.add_argument("--batch_size", type=int, default=256)
  parser.add_argument("--batches", type=int, default=8, help="measured batches per turn")
  parser.add_argument("--warmup_batches", type=int, default=4,
                      help="batches before the window: start-up, and the prefetch drained")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--workers", default=f"1,{os.cpu_count() or 1}",
                      help="comma-separated worker counts")
  parser.add_argument("--no_tf", action="store_true", help="skip tf.data even if installed")
  parser.add_argument("--memory", default="", help="comma-separated per-host batch sizes: "
                      "report peak host memory instead of throughput")
  parser.add_argument("--out", default=None, help="also write the JSON result here")
  args = parser.parse_args()
  args.workers = sorted({int(w) for w in args.workers.split(",")})
  paths = make_jpegs(args.dir, args.images, args.subsampling)
  result = {"images": len(paths), "subsampling": args.subsampling,
            "mean_file_kb": round(sum(map(os.path.getsize, paths)) / len(paths) / 1024, 1),
            "cpu_count": os.cpu_count(), "batch_size": args.batch_size,
            "tensorflow": None if args.no_tf else tensorflow_version()}
  if args.memory:
    workers = max(args.workers)
    result["peak_memory_gib"] = {int(b): round(peak_memory(paths, int(b), workers, 4), 2)
                                 for b in args.memory.split(",")}
    result["workers"] = workers
  else:
    result["pipelines"] = throughput(paths, args)
    _print_table(result["pipelines"])
  line = json.dumps(result)
  print(line)
  if args.out:
    with open(args.out, "w") as file:
      file.write(line + "\n")


def _print_table(pipelines) -> None:
  reference = pipelines.get(TF_REFERENCE, {}).get("images_per_cpu_second")
  print(f"| pipeline | images/s | images per CPU-second | vs tf.data | host cores for "
        f"{HOST_RATE:,} images/s |")
  print("|---|---:|---:|---:|---:|")
  for name, row in pipelines.items():
    ratio = f"{row['images_per_cpu_second'] / reference:.2f}x" if reference else "-"
    print(f"| {name} | {row['images_per_second']:.0f} | {row['images_per_cpu_second']:.0f} | "
          f"{ratio} | {HOST_RATE / row['images_per_cpu_second']:.0f} |")


if __name__ == "__main__":
  main()
