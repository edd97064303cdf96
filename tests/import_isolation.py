"""One check for the layer rule: importing X must not load modules Y (in a fresh process)."""

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
