"""Sphinx configuration: `make docs` builds docs/ into docs/_build/html (warnings are errors).

MyST reads the Markdown pages; autodoc and napoleon read the Google-style docstrings.
Nothing is fetched at build time (no intersphinx, no remote images): CI reaches only the
package index.
"""

import dateopt

project = "dateopt"
author = "the dateopt authors"
copyright = "2026, the dateopt authors"  # pylint: disable=redefined-builtin
release = version = dateopt.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# The studies' own records live beside the pages; they are data, not pages.
exclude_patterns = ["_build", "growth_study", "scaling_study", "polish_study"]
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # NamedTuple fields: listed once, not as duplicate attributes

html_theme = "alabaster"
html_title = f"dateopt {release}"


def _escape_bars(app, what, name, obj, options, lines):
  """|G|² is a norm in these docstrings, not an RST substitution: escape the bars, except in
  inline code and doctest lines."""
  del app, what, name, obj, options
  for i, line in enumerate(lines):
    if line.lstrip().startswith((">>>", "...")):
      continue
    parts = line.split("`")
    lines[i] = "`".join(part.replace("|", r"\|") if j % 2 == 0 else part
                        for j, part in enumerate(parts))


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


def setup(app):
  app.connect("autodoc-process-docstring", _escape_bars)
  app.connect("autodoc-process-docstring", _open_lists)
