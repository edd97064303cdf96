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


def setup(app):
  app.connect("autodoc-process-docstring", _escape_bars)
