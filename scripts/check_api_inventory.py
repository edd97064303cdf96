"""Fails when the built API reference leaves out a public name.

Reads the Sphinx inventory of a built site (`docs/_build/html/objects.inv`, written by
`make docs`), imports every public module and checks that each name the module exports
is described in the reference under that module's name (`dateopt.train.train_step`, not
only where it is defined):

  * a module with `__all__` exports exactly its `__all__`;
  * a module without one exports the public functions and classes it defines, and the
    public names it assigns at module level (constants, type aliases).

An exported module (`dateopt.date` in `dateopt.__all__`) counts when its own module page
exists. The public modules are `dateopt`, each of its direct submodules and subpackages
except the command-line and internal helper modules in `INTERNAL`, and every module the
reference gives a page of its own. A new submodule is therefore checked from the day it
is added, unless it is added to `INTERNAL`.

  python scripts/check_api_inventory.py                  # docs/_build/html/objects.inv
  python scripts/check_api_inventory.py path/to/objects.inv

Exits 0 and prints one summary line when nothing is missing; otherwise lists each missing
name (and each module without a page) and exits 1.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import sys
import zlib
from pathlib import Path
from types import ModuleType

DEFAULT_INVENTORY = Path(__file__).resolve().parent.parent / "docs/_build/html/objects.inv"

# Direct submodules of `dateopt` that are not API pages: the console entry points and
# the `dateopt-train` / `dateopt-tpu` commands (the guides describe their flags), and the
# argument checks and JSON helpers every layer uses internally.
INTERNAL = frozenset({
    "dateopt.cli",
    "dateopt.console",
    "dateopt.strict_json",
    "dateopt.tpu",
    "dateopt.validation",
})


# One entry: "name domain:role priority uri display-name" (a name may hold spaces).
_ENTRY = re.compile(r"(.+?)\s+(\S+:\S+)\s+(-?\d+)\s+(\S*)\s+(.*)")


def read_inventory(path: Path) -> dict[str, set[str]]:
  """Object names by role ("py:function", "py:module", ...) from a version-2 inventory."""
  data = path.read_bytes()
  start = 0
  for _ in range(4):  # project, version, and two comment lines
    start = data.index(b"\n", start) + 1
  header = data[:start].decode("utf-8").splitlines()
  if header[0] != "# Sphinx inventory version 2" or "zlib" not in header[3]:
    raise ValueError(f"{path}: not a zlib-compressed Sphinx inventory (version 2)")
  by_role: dict[str, set[str]] = {}
  for line in zlib.decompress(data[start:]).decode("utf-8").splitlines():
    match = _ENTRY.match(line.rstrip())
    if match:
      name, role = match.group(1), match.group(2)
      by_role.setdefault(role, set()).add(name)
  return by_role


def public_modules(documented: set[str]) -> list[str]:
  """`dateopt`, its non-internal direct submodules, and every module given a page."""
  import dateopt  # pylint: disable=import-outside-toplevel
  names = {"dateopt"}
  for info in pkgutil.iter_modules(dateopt.__path__, prefix="dateopt."):
    leaf = info.name.rsplit(".", 1)[-1]
    if not leaf.startswith("_") and info.name not in INTERNAL:
      names.add(info.name)
  names |= {name for name in documented if name == "dateopt" or name.startswith("dateopt.")}
  return sorted(names)


def _assigned_names(module: ModuleType) -> list[str]:
  """Public names a module's own source assigns at top level (constants, type aliases)."""
  try:
    tree = ast.parse(inspect.getsource(module))
  except (OSError, TypeError):
    return []
  names = []
  for node in tree.body:
    targets = (node.targets if isinstance(node, ast.Assign)
               else [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None
               else [])
    for target in targets:
      if isinstance(target, ast.Name) and not target.id.startswith("_"):
        names.append(target.id)
  return names


def exported_names(module: ModuleType) -> list[str]:
  """What `module` exports: its `__all__`, or else its own public definitions."""
  if hasattr(module, "__all__"):
    return list(module.__all__)
  names = []
  for name, value in vars(module).items():
    if name.startswith("_"):
      continue
    if ((inspect.isfunction(value) or inspect.isclass(value))
        and getattr(value, "__module__", None) == module.__name__):
      names.append(name)
  names += [name for name in _assigned_names(module)
            if name not in names and not inspect.ismodule(getattr(module, name, None))]
  return names


def missing_names(by_role: dict[str, set[str]]) -> tuple[list[str], list[str], int]:
  """(modules without a page, exported names not described, how many names were checked)."""
  modules = by_role.get("py:module", set())
  described = set().union(*(names for role, names in by_role.items() if role.startswith("py:")))
  no_page, missing, checked = [], [], 0
  for module_name in public_modules(modules):
    module = importlib.import_module(module_name)
    if module_name not in modules:
      no_page.append(module_name)
    for name in exported_names(module):
      checked += 1
      value = getattr(module, name, None)
      if inspect.ismodule(value):
        if value.__name__ not in modules:
          missing.append(f"{module_name}.{name} (module {value.__name__} has no page)")
      elif f"{module_name}.{name}" not in described:
        missing.append(f"{module_name}.{name}")
  return no_page, missing, checked


def main(argv: list[str]) -> int:
  path = Path(argv[1]) if len(argv) > 1 else DEFAULT_INVENTORY
  if not path.is_file():
    print(f"check_api_inventory: {path} does not exist; build the site first (make docs).")
    return 1
  by_role = read_inventory(path)
  no_page, missing, checked = missing_names(by_role)
  if no_page or missing:
    print(f"check_api_inventory: the API reference ({path}) leaves out "
          f"{len(no_page)} module(s) and {len(missing)} exported name(s):")
    for name in no_page:
      print(f"  module without a page: {name}")
    for name in missing:
      print(f"  not described: {name}")
    return 1
  print(f"check_api_inventory: all {checked} exported names of "
        f"{len(public_modules(by_role.get('py:module', set())))} public modules are in "
        f"the API reference.")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
