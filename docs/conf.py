"""Sphinx configuration: `make docs` builds docs/ into docs/_build/html (warnings are errors).

MyST reads the Markdown pages; autodoc and napoleon read the Google-style docstrings.
Nothing is fetched at build time (no intersphinx, no remote images): CI reaches only the
package index.
"""

import ast
import inspect
import os
import re
import sys

from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.inspect import object_description
from sphinx.util.typing import stringify_annotation

import dateopt

project = "dateopt"
author = "the dateopt authors"
copyright = "2026, the dateopt authors"  # pylint: disable=redefined-builtin
release = version = dateopt.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# The studies' own records live beside the pages; they are data, not pages.
exclude_patterns = ["_build", "growth_study", "scaling_study", "polish_study", "schedule_study",
                    "engine_ablation", "lm_scaling"]
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # NamedTuple fields: listed once, not as duplicate attributes
# Type aliases stay one name in the reference instead of their expanded unions. The
# modules use `from __future__ import annotations`, so each key is the annotation as written.
autodoc_type_aliases = {
    "ScalarOrSchedule": "optax.ScalarOrSchedule",
    "optax.ScalarOrSchedule": "optax.ScalarOrSchedule",
    "optax.Schedule": "optax.Schedule",
    "AxisName": "dateopt.transforms.AxisName",
    "MaskLike": "dateopt.masks.MaskLike",
    "masks.MaskLike": "dateopt.masks.MaskLike",
    "masks_lib.MaskLike": "dateopt.masks.MaskLike",
    "OptimizerFactory": "Callable[[optax.ScalarOrSchedule], optax.GradientTransformation]",
    "jax.Array": "jax.Array",  # not the class's private home, jax.jaxlib._jax.Array
}
# Types in the parameter lists of the parameters a docstring describes; a NamedTuple's or
# dataclass's fields are described once, under Variables, not again as its parameters.
autodoc_typehints_description_target = "documented_params"

html_theme = "alabaster"
html_title = f"dateopt {release}"


# "*name" right after "(", "[" or ", ", and not closed by another star: Python's unpacking.
_UNPACKING_STAR = re.compile(r"(?:(?<=[(\[])|(?<=, ))\*(?=[A-Za-z_]\w*(?![\w*]))")


def _literal_lines(lines):
  """The indices of the lines inside literal blocks (a paragraph ending in "::", then the
  lines indented under it): they are shown as written, so nothing is escaped there."""
  inside, block_indent, opener_indent = set(), None, None
  for i, line in enumerate(lines):
    if block_indent is not None:
      if not line.strip():
        continue
      if block_indent == -1:
        block_indent = _indent(line) if _indent(line) > opener_indent else None
      if block_indent is not None and _indent(line) >= block_indent:
        inside.add(i)
        continue
      block_indent = None
    if line.rstrip().endswith("::") and not line.lstrip().startswith(".."):
      block_indent, opener_indent = -1, _indent(line)
  return inside


def _escape_bars(app, what, name, obj, options, lines):
  """|G|² is a norm in these docstrings, not an RST substitution: escape the bars, except in
  inline code and doctest lines."""
  del app, what, name, obj, options
  _escape_outside_code(lines, lambda text: text.replace("|", r"\|"))


def _escape_outside_code(lines, escape):
  """Applies `escape` to the text of `lines` outside inline code, doctest lines and
  literal blocks, in place."""
  literal = _literal_lines(lines)
  for i, line in enumerate(lines):
    if line.lstrip().startswith((">>>", "...")) or i in literal:
      continue
    parts = line.split("`")
    lines[i] = "`".join(escape(part) if j % 2 == 0 else part for j, part in enumerate(parts))


def _indent(line):
  return len(line) - len(line.lstrip())


def _open_lists(app, what, name, obj, options, lines):
  """A docstring's indented bullet list right after a line of text ("...:" then "  * a"),
  and the text right after the list, are one flow to a reader; RST needs blank lines
  around the list."""
  del app, what, name, obj, options
  i, list_indent = 1, None
  while i < len(lines):
    line, previous = lines[i], lines[i - 1]
    bullet = line.lstrip().startswith(("* ", "- "))
    if list_indent is not None and line.strip() and not bullet and _indent(line) < list_indent:
      lines.insert(i, "")  # the text after the list
      list_indent = None
      i += 1
    elif list_indent is not None and not line.strip():
      list_indent = None
    elif (bullet and list_indent is None and previous.strip()
          and not previous.lstrip().startswith(("* ", "- "))
          and _indent(line) > _indent(previous)):
      lines.insert(i, "")  # the text before the list
      list_indent = _indent(line)
      i += 1
    elif bullet and list_indent is None and not previous.strip():
      list_indent = _indent(line)
    i += 1


def _escape_unpacking_stars(app, what, name, obj, options, lines):
  """A shape such as `(batch, *input_shape)` unpacks a tuple; to RST, the lone star would
  open an emphasis that never closes. Escape such stars outside inline code and literal
  blocks."""
  del app, what, name, obj, options
  _escape_outside_code(lines, lambda text: _UNPACKING_STAR.sub(r"\\*", text))


_ASSIGNED = {}


def _assigned_names(module):
  """The names a module's own source assigns at top level (constants, type aliases)."""
  if module.__name__ not in _ASSIGNED:
    try:
      tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
      tree = ast.Module(body=[], type_ignores=[])
    _ASSIGNED[module.__name__] = {
        target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)}
  return _ASSIGNED[module.__name__]


def _doc_comments(module):
  """{name: lines} of the module-level names `module`'s source documents (`#:` comments
  or a string after the assignment)."""
  try:
    docs = ModuleAnalyzer.for_module(module.__name__).find_attr_docs()
  except PycodeError:
    return {}
  return {attr: lines for (namespace, attr), lines in docs.items() if not namespace}


def _shown_value(module_name, name, value):
  """What the reference shows after "=": an alias's name, else the value, if it is short."""
  if autodoc_type_aliases.get(name, f"{module_name}.{name}") != f"{module_name}.{name}":
    return autodoc_type_aliases[name]  # another library's alias, kept by its name
  if isinstance(value, os.PathLike):
    return None  # a path of the machine that built the site
  if getattr(value, "__module__", None) == "typing" or hasattr(value, "__origin__"):
    shown = stringify_annotation(value, "fully-qualified-except-typing")
  else:
    shown = object_description(value)
  return shown if len(shown) <= 100 else None


def _document_exported_data(app, what, name, obj, options, lines):
  """autodoc's :members: leaves out module-level constants that have no doc comment, and
  every constant a package re-exports from its submodules. Append one `py:data` entry
  (value, and the doc comment where its home module has one) to the module's docstring for
  each constant the module exports: its `__all__`, else the public names it assigns."""
  if what != "module" or getattr(options, "no_index", None) or getattr(options, "noindex", None):
    return  # a module shown for its docstring only (`:no-index:`) lists no members
  exported = getattr(obj, "__all__", None)
  names = exported if exported is not None else [
      n for n in vars(obj) if n in _assigned_names(obj) and not n.startswith("_")]
  documented_by_autodoc = _doc_comments(obj)  # autodoc's :members: shows these itself
  for data_name in names:
    value = getattr(obj, data_name, None)
    if (inspect.ismodule(value) or inspect.isroutine(value) or inspect.isclass(value)
        or data_name in documented_by_autodoc):
      continue
    homes = [obj] + [m for key, m in sorted(sys.modules.items())
                     if key.startswith(name + ".") and m is not None]
    home = next((m for m in homes if data_name in _assigned_names(m)
                 and getattr(m, data_name, None) is value), None)
    comment = _doc_comments(home).get(data_name) if home is not None else None
    shown = _shown_value(name, data_name, value)
    lines += ["", f".. py:data:: {data_name}", f"   :module: {name}"]
    lines.append(f"   :value: {shown}" if shown is not None
                 else f"   :type: {type(value).__name__}")
    if comment:
      comment = list(comment)
      for escape in (_escape_bars, _escape_unpacking_stars):  # as for any docstring
        escape(app, "data", f"{name}.{data_name}", value, options, comment)
      lines += [""] + [f"   {line}" for line in comment]


# Classes whose __module__ is a private home, by the name users write (napoleon's field
# types read the class itself, where autodoc_type_aliases does not apply).
_PUBLIC_TYPE_NAMES = {"jax.jaxlib._jax.Array": "jax.Array"}


def _public_type_names(app, what, name, obj, options, lines):
  del app, what, name, obj, options
  for i, line in enumerate(lines):
    for private, public in _PUBLIC_TYPE_NAMES.items():
      line = line.replace(private, public)
    lines[i] = line


def _skip_namedtuple_fields(app, what, name, obj, skip, options):
  """A NamedTuple's fields are its Attributes section already; their generated
  "Alias for field number N" entries would list each one twice."""
  del app, what, name, skip, options
  if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
    return True
  return None  # autodoc decides


def setup(app):
  app.connect("autodoc-process-docstring", _escape_bars)
  app.connect("autodoc-process-docstring", _open_lists)
  app.connect("autodoc-process-docstring", _escape_unpacking_stars)
  app.connect("autodoc-process-docstring", _document_exported_data)
  app.connect("autodoc-process-docstring", _public_type_names)
  app.connect("autodoc-skip-member", _skip_namedtuple_fields)
