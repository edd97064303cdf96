"""Each ```python block of the README runs alone, pasted into a fresh interpreter.

A reader copies one block, not the page: every block carries its own imports, model and data.
Each runs in its own `python -c` process, in an empty directory, on the CPU, with none of
the other blocks' names (tests/test_docs.py runs the page's blocks in order, in one namespace).
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

# Subprocesses that import JAX and compile: left out of `make test-fast`.
pytestmark = pytest.mark.slow

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def test_the_readme_has_python_blocks():
  assert len(BLOCKS) >= 4


@pytest.mark.parametrize("block", BLOCKS,
                         ids=[f"{n}-{b.splitlines()[0]}" for n, b in enumerate(BLOCKS)])
def test_each_readme_block_runs_alone(block, tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # one CPU device, as in a fresh interpreter (not conftest's 8)
  env.pop("PYTHONPATH", None)  # dateopt as installed, not this checkout's tests/ on the path
  done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                        timeout=300, cwd=tmp_path, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
