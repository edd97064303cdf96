"""Imports in a fresh process: the layer rule (X does not load Y), and installs without extras."""

import subprocess
import sys


def assert_not_loaded(statement: str, roots: tuple[str, ...], prefixes: tuple[str, ...] = ()):
  """Runs `statement` in a new interpreter; fails if a module under `roots`/`prefixes` loaded."""
  code = (f"import sys; {statement}; "
          f"bad = [m for m in sys.modules if m.split('.')[0] in {roots!r} "
          f"or m.startswith({prefixes!r})]; print(bad); sys.exit(1 if bad else 0)")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr


def blocking(modules) -> str:
  """Python source that makes every import of `modules` fail, as without their extra.

  The blocker raises from `find_spec`, as the import system does for a package
  that is not installed: `importlib.util.find_spec` raises too.
  """
  return ("import sys\n"
          "class Blocker:\n"
          "  def find_spec(self, name, path=None, target=None):\n"
          f"    if name.split('.')[0] in {tuple(modules)!r}:\n"
          "      raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
          "sys.meta_path.insert(0, Blocker())\n")


def run_without(modules, code: str, **kwargs) -> subprocess.CompletedProcess:
  """Runs `code` in a new interpreter in which `modules` cannot be imported."""
  return subprocess.run([sys.executable, "-c", blocking(modules) + code], capture_output=True,
                        text=True, timeout=kwargs.pop("timeout", 120), **kwargs)
