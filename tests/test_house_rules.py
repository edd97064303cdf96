"""The package's shape: no import circle, short functions, a short trainer, a short API."""

import ast
import pathlib
import pkgutil

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dateopt"
MAX_FUNCTION_LINES = 80  # lines of code, docstring and comments aside
MAX_TRAINER_LINES = 300


def _modules() -> dict[str, pathlib.Path]:
  modules = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    modules[name] = path
  return modules


def _imports(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
  """The package's modules `name` imports, anywhere in it (functions included).

  `from pkg import sub` counts as importing `pkg.sub` only; a module importing its
  own package's `__init__` (which re-exports the package) is not a circle.
  """
  def owner(target: str) -> str | None:
    while target and target not in modules:
      target = target.rpartition(".")[0]
    return target or None

  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    targets = []
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      base = node.module
      if node.level:
        base = ".".join(name.split(".")[:-node.level] + [node.module])
      subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
      targets = subs if len(subs) == len(node.names) else [base, *subs]
    for target in targets:
      module = owner(target) if target.startswith("dateopt") else None
      if module and module != name and not (
          modules[module].name == "__init__.py" and name.startswith(module + ".")):
        found.add(module)
  return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, circles = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for other in graph[node]:
      if other not in index:
        visit(other)
        low[node] = min(low[node], low[other])
      elif other in on_stack:
        low[node] = min(low[node], index[other])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        circles.append(sorted(component))

  for node in graph:
    if node not in index:
      visit(node)
  return circles


def test_the_import_graph_has_no_circle():
  modules = _modules()
  graph = {name: _imports(name, path, modules) for name, path in modules.items()}
  assert graph["dateopt.study.figures"] >= {"dateopt.plots"}  # the checker sees imports
  assert _circles(graph) == []


def test_the_circle_check_finds_a_circle():
  assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _code_lines(function: ast.FunctionDef, lines: list[str]) -> int:
  body = function.body
  start = body[0].lineno
  if (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
      and isinstance(body[0].value.value, str)):
    start = body[0].end_lineno + 1  # the docstring is not code
  return sum(1 for line in lines[start - 1:function.end_lineno]
             if line.strip() and not line.strip().startswith("#"))


def test_no_function_is_longer_than_80_lines_of_code():
  too_long = []
  for path in PACKAGE.rglob("*.py"):
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if _code_lines(node, lines) > MAX_FUNCTION_LINES:
          too_long.append(f"{path.relative_to(PACKAGE)}:{node.name}")
  assert too_long == []


def test_the_trainer_reads_in_one_sitting():
  lines = (PACKAGE / "train" / "trainer.py").read_text().splitlines()
  assert len(lines) <= MAX_TRAINER_LINES


MAX_POSITIONAL = 3  # keyword-only arguments where a function has more than three
# Signatures fixed by their caller, not by dateopt.
FIXED_SIGNATURES = {
    "train/polish.py:record_input": "flax's method interceptor (next_fun, args, kwargs, context)",
}


def _positional_names(function: ast.FunctionDef) -> list[str]:
  params = function.args.posonlyargs + function.args.args
  return [p.arg for p in params if p.arg not in ("self", "cls")]


def _too_many_positional(source: str, where: str) -> list[str]:
  """`where:name` of each public function or method with more than MAX_POSITIONAL."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (not node.name.startswith("_") or node.name == "__init__")
        and len(_positional_names(node)) > MAX_POSITIONAL):
      found.append(f"{where}:{node.name}")
  return found


def test_public_functions_take_at_most_three_positional_arguments():
  found = []
  for path in PACKAGE.rglob("*.py"):
    found += _too_many_positional(path.read_text(), str(path.relative_to(PACKAGE)))
  assert sorted(set(found) - set(FIXED_SIGNATURES)) == []


def test_the_positional_check_finds_a_long_signature():
  source = ("def fine(a, b, c, *, d): pass\n"
            "def _private(a, b, c, d): pass\n"
            "class C:\n  def __init__(self, a, b, c, d): pass\n"
            "def wide(a, b, c, d=1): pass\n")
  assert sorted(_too_many_positional(source, "m.py")) == ["m.py:__init__", "m.py:wide"]


MAX_DATE_EXPORTS = 30  # what a user calls; the engine's helpers stay behind it


def test_dateopt_date_exports_a_short_api_and_keeps_its_engine_modules_private():
  from dateopt import date
  assert len(date.__all__) <= MAX_DATE_EXPORTS, sorted(date.__all__)
  assert len(set(date.__all__)) == len(date.__all__)
  assert [name for name in date.__all__ if not hasattr(date, name)] == []
  public_modules = [module.name for module in pkgutil.iter_modules(date.__path__)
                    if not module.name.startswith("_")]
  assert public_modules == [], "engine modules are private (optax's _src convention)"
  # The constants and rule helpers are not the API: no upper-case name is exported.
  assert [name for name in date.__all__ if name.isupper()] == []


MAX_ENGINE_FUNCTION_LINES = 60  # in dateopt/date: code and comments, the docstring aside
MAX_ENGINE_CONSTANTS = 5  # numbers at module level in dateopt/date: definitions, not tuning


def _lines_with_comments(function: ast.FunctionDef, lines: list[str]) -> int:
  body = function.body[0]
  docstring = (set(range(body.lineno, body.end_lineno + 1))
               if isinstance(body, ast.Expr) and isinstance(body.value, ast.Constant)
               and isinstance(body.value.value, str) else set())
  return sum(1 for i in range(function.lineno, function.end_lineno + 1)
             if i not in docstring and lines[i - 1].strip())


def test_no_engine_function_is_longer_than_60_lines_with_its_comments():
  too_long = []
  for path in (PACKAGE / "date").glob("*.py"):
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
      if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and _lines_with_comments(node, source.splitlines()) > MAX_ENGINE_FUNCTION_LINES):
        too_long.append(f"date/{path.name}:{node.name}")
  assert too_long == []


def _numeric_constants(source: str) -> list[str]:
  """The module-level names `source` binds to a number (the engine's knobs live in
  `date.EngineConfig`; a module-level number is a tuning constant in disguise)."""
  found = []
  for node in ast.parse(source).body:
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
      continue
    value = node.value.operand if isinstance(node.value, ast.UnaryOp) else node.value
    if (isinstance(value, ast.Constant) and isinstance(value.value, (int, float))
        and not isinstance(value.value, bool)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      found += [t.id for t in targets if isinstance(t, ast.Name)]
  return found


def test_the_engine_keeps_its_numbers_in_its_config():
  found = {f"date/{path.name}:{name}" for path in (PACKAGE / "date").glob("*.py")
           for name in _numeric_constants(path.read_text())}
  assert len(found) <= MAX_ENGINE_CONSTANTS, sorted(found)
  assert _numeric_constants("A = 0.5\nB: int = -3\nC = (1, 2)\nD = True\n") == ["A", "B"]
