"""The documentation site's pages read as a product's: no link into files the site does not
hold (the repository's notes/), and no numbering of the work that made them.

The pages scanned are the Markdown sources Sphinx builds: docs/**/*.md less docs/conf.py's
`exclude_patterns` (read from the file, without importing it), and the README, the front page.
"""

import ast
import fnmatch
import io
import pathlib
import re
import tokenize

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

# What a page must not carry, each with why.
FORBIDDEN = {
    "a link to a notes/ file": re.compile(r"\]\((?:\.\./)*notes/|\bnotes/[\w./-]*\.md"),
    "an issue number": re.compile(r"\bissues? #?\d+", re.I),
    "session wording": re.compile(r"\bsessions?\b", re.I),
    "round numbering": re.compile(r"\bround \d", re.I),
}


def _exclude_patterns() -> list[str]:
  """docs/conf.py's `exclude_patterns`, a literal list."""
  tree = ast.parse((DOCS / "conf.py").read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id == "exclude_patterns"
        for target in node.targets):
      return list(ast.literal_eval(node.value))
  raise AssertionError("docs/conf.py sets no exclude_patterns")


def _excluded(relative: pathlib.PurePath, patterns: list[str]) -> bool:
  """Sphinx's rule: a pattern matches the path of a document or of a folder above it."""
  candidates = [relative.as_posix()] + [parent.as_posix() for parent in relative.parents
                                        if parent.as_posix() != "."]
  return any(fnmatch.fnmatchcase(candidate, pattern)
             for candidate in candidates for pattern in patterns)


def site_pages() -> list[pathlib.Path]:
  patterns = _exclude_patterns()
  return sorted(path for path in DOCS.rglob("*.md")
                if not _excluded(path.relative_to(DOCS), patterns))


PAGES = [REPO / "README.md", *site_pages()]


def test_the_scan_covers_the_site_and_skips_what_it_excludes():
  scanned = {path.relative_to(REPO).as_posix() for path in PAGES}
  assert {"README.md", "docs/index.md", "docs/guides/date.md",
          "docs/results/growth_study.md"} <= scanned
  assert not [name for name in scanned if name.startswith(("docs/_build/", "docs/growth_study/"))]
  assert _excluded(pathlib.PurePath("growth_study/results.md"), ["growth_study"])
  assert not _excluded(pathlib.PurePath("results/growth_study.md"), ["growth_study"])


@pytest.mark.parametrize("text, what", [
    ("the evidence is in `notes/divergence.md`", "a link to a notes/ file"),
    ("[the notes](../notes/batch_growth.md)", "a link to a notes/ file"),
    ("the bar of Issue 8", "an issue number"),
    ("measured in the fifth session", "session wording"),
    ("since round 3", "round numbering"),
])
def test_each_pattern_finds_what_it_names(text, what):
  assert FORBIDDEN[what].search(text)


@pytest.mark.parametrize("text", [
    "the median of 60 interleaved rounds; 10 rounds of 20 steps",
    "the repository's issue tracker",
    "a dropped ssh connection",
])
def test_the_patterns_leave_ordinary_words_alone(text):
  assert not [what for what, pattern in FORBIDDEN.items() if pattern.search(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_page_links_to_notes_or_numbers_its_making(page):
  found = [f"{page.relative_to(REPO)}:{number}: {what}: {line.strip()[:120]}"
           for number, line in enumerate(page.read_text().splitlines(), 1)
           for what, pattern in FORBIDDEN.items() if pattern.search(line)]
  assert not found, "\n".join(found)


def _docstrings(path: pathlib.Path):
  """(line, docstring) of the module, class and function docstrings in `path`: the text
  the API reference pages show."""
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      text = ast.get_docstring(node, clean=False)
      if text:
        yield (node.body[0].lineno, text)


SOURCES = sorted((REPO / "dateopt").rglob("*.py"))


def _comments(path: pathlib.Path):
  """(line, comment) of each `#` comment in `path`: what a reader of the code reads."""
  for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
    if token.type == tokenize.COMMENT:
      yield token.start[0], token.string


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_docstring_or_comment_links_to_notes_or_numbers_its_making(source):
  found = [f"{source.relative_to(REPO)}:{line}: {what}: {text[:120]!r}"
           for line, text in [*_docstrings(source), *_comments(source)]
           for what, pattern in FORBIDDEN.items() if pattern.search(text)]
  assert not found, "\n".join(found)


def test_the_comment_scan_reads_comments_only(tmp_path):
  source = tmp_path / "example.py"
  source.write_text('x = "issue 7"  # see notes/divergence.md\n# since round 2\n')
  assert [line for line, _ in _comments(source)] == [1, 2]
  assert [what for _, text in _comments(source) for what, pattern in FORBIDDEN.items()
          if pattern.search(text)] == ["a link to a notes/ file", "round numbering"]


RESEARCH = REPO / "research"


def test_the_research_probes_the_pages_cite_exist_and_the_folder_s_readme_lists_each():
  """research/ holds the one-off probes whose outputs the results pages cite (scripts/ the
  tools): each probe a page names is there, and research/README.md has a line for each."""
  cited = {name for page in PAGES
           for name in re.findall(r"\bresearch/([\w-]+\.py)", page.read_text())}
  probes = {path.name for path in RESEARCH.glob("*.py")}
  assert cited and cited <= probes, sorted(cited - probes)
  listed = set(re.findall(r"`([\w-]+\.py)`", (RESEARCH / "README.md").read_text()))
  assert probes <= listed, sorted(probes - listed)
  assert not probes & {path.name for path in (REPO / "scripts").glob("*.py")}
