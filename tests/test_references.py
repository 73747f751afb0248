"""Every reference in the library's text resolves.

Scanned: ``jsfl/**/*.py``, ``tests/**/*.py``, ``benchmarks/**/*.py``,
``benchmarks/**/*.md``, ``benchmarks/*.sh``, ``experiments/**/*.py`` and
``*.toml`` (the sweep files' headers cite docs pages), ``docs/*.md`` and
every ``README.md`` of the repository, except under hidden folders
(``.venv``, caches) and ``results`` folders (run outputs, which record what
was true when they were written), and the ``.py`` files under
``authors_code`` (adapted copies of the authors' scripts, whose own package
names read as jsfl's).
One test per file; a failure lists ``FILE:LINE: reference -> why`` for every
reference of the file that does not resolve.

What is a reference, and how it resolves:

* **Anchors**: ``<path>.md#<anchor>``, bare or as a link target, and
  ``(#anchor)`` link targets within a page. The page exists and one of its
  headings has that anchor under GitHub's rules: the heading's text (a link's
  text, no HTML) lowercased, every character other than a letter, digit,
  space, ``-`` or ``_`` dropped, each space a ``-``; a repeated heading gets
  ``-1``, ``-2``, ...; an HTML ``name=`` or ``id=`` attribute is an anchor
  too. Lines in fenced code are not headings. A bare path resolves at the
  repository root, ``../`` paths beside the citing file, a bare page name
  beside the citing file or else in ``docs/``.
* **Link targets**: every relative target of a markdown link ``[..](target)``
  is an existing file or folder relative to the citing file (as GitHub
  resolves it) inside the repository.
* **Repository paths**: a token that starts with ``jsfl/``, ``docs/``,
  ``tests/``, ``benchmarks/`` or ``experiments/`` (after any ``../``), not
  preceded by a letter, digit, ``_``, ``/``, ``.``, ``:`` or ``-`` (so URLs
  and deeper paths are not taken), resolved at the repository root (``../``
  paths beside the citing file). Inside a code span (single or double
  backticks, found line by line) or a fenced code block every such token is
  a path; elsewhere (prose, Python code) only one that ends in ``/``, has a
  file extension or has two ``/`` or more, so a ratio such as "jsfl / torch"
  written without spaces in a table header is not one. In a code span, a
  token that starts with a ``results`` folder and a slash is a path beside
  the citing file (a paper folder's or ``benchmarks/``'s results). A
  ``:LINE`` suffix ends the path; for ``file.py::name`` the file must define
  ``name``. A path with ``*`` or ``?`` must match at least one file; one
  with a placeholder component (``<...>``, ``{...}``, ``...``) must exist up
  to its last folder before the placeholder.
* **Dotted names**: ``jsfl.<module>[.<name>...]`` anywhere, rst roles
  included. The longest importable prefix is imported (in this process) and
  the rest looked up with ``getattr``; a class's dataclass and annotated
  fields count as its attributes. Not a reference: a key that the library
  itself writes as a string literal (MLflow tags, dataclass metadata),
  found by reading the string constants of ``jsfl/`` that look like
  ``jsfl.<key>`` where ``<key>`` is no module or attribute of ``jsfl``.
* **Relative dotted names** in code spans (``engine.split.run_round``,
  ``train.prepare``, ``split.Step``): a dotted name whose first component is
  one of the packages in ``PACKAGES`` resolves as ``jsfl.<name>``, and one
  whose first component is a module of ``jsfl/engine/`` as
  ``jsfl.engine.<name>``; a name whose last component is a file extension
  (``report.md``, ``split.py``) is a file name. ``data`` and ``sweep`` are
  not in ``PACKAGES``: they are also config sections and the round's data
  argument (``sweep.out_dir``, ``data.counts``).
* **Documents the repository does not have**: the former specification cited
  by name (``SPEC`` followed by a section number, ``'s`` or ``.md``), a
  path up into a ``shared`` folder beside the repository, and a section
  number after a docs page: the pages under ``docs/`` are the specification
  and their sections are cited by anchor.

Nothing else is skipped and there is no list of exceptions; ``PENDING``
names the files whose stale references are fixed with other work: their test
is a strict xfail, so it fails once they are fixed and must leave the set.
``tests/data/references_sample.md`` (not scanned) holds a broken reference of
every kind, and ``test_the_rules_find_every_kind`` checks that each is found.
"""

import ast
import functools
import importlib
import importlib.util
import pathlib
import re
import typing

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Files whose stale references are fixed by other work (the engine and
# methods refactor owns them): file -> what is stale and its correct target.
PENDING: dict[str, str] = {}

ROOTS = ("jsfl", "docs", "tests", "benchmarks", "experiments")
PACKAGES = ("core", "engine", "methods", "models", "partitions", "report", "train")
EXTENSIONS = frozenset({"py", "md", "toml", "json", "jsonl", "csv", "npz", "sh", "txt", "png",
                        "pdf", "yaml", "yml", "cfg", "ini", "log", "html", "svg", "gz", "pb"})

_PATH_CHARS = r"[\w./*?<>{}=,+~-]"
PATH_RE = re.compile(rf"(?<![\w./:-])((?:\.\./)*(?:{'|'.join(ROOTS)})/{_PATH_CHARS}*)")
RESULTS_RE = re.compile(rf"(?<![\w./:-])(results/{_PATH_CHARS}*)")
ANCHOR_RE = re.compile(r"(?<![\w./-])((?:\.\.?/)*(?:[\w.-]+/)*[\w.-]+\.md)#([\w-]+)")
LINK_RE = re.compile(r"\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
DOTTED_RE = re.compile(r"(?<![\w./-])(jsfl(?:\.[A-Za-z_]\w*)+)")
RELATIVE_RE = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")
SPAN_RE = re.compile(r"(`+)(.+?)\1")
HEADING_RE = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR_RE = re.compile(r"<a\s[^>]*\bname=\"([^\"]+)\"|\bid=\"([^\"]+)\"")
FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
OUTSIDE_RE = re.compile(
  r"\bSPEC(?:\.md\b|'s\b|\s+\d[\d.]*)"
  r"|(?:\.\./)+shared\b"
  r"|[\w./-]*\.md\)?(?:#[\w-]+)?,?\s+(?:and|or)\s+\d+(?:\.\d+)+")


def scanned_files() -> list[str]:
  found: set[pathlib.Path] = set()
  for pattern in ("jsfl/**/*.py", "tests/**/*.py", "benchmarks/**/*.py", "benchmarks/**/*.md",
                  "benchmarks/*.sh", "experiments/**/*.py", "experiments/**/*.toml",
                  "docs/*.md", "**/README.md"):
    found.update(ROOT.glob(pattern))
  keep = []
  for p in found:
    parts = p.relative_to(ROOT).parts
    if any(part.startswith(".") or part == "results" for part in parts):
      continue
    # The adapted copies of the authors' code import their own packages
    # (``models``, ``flwr_datasets``), which read as jsfl's relative names.
    if "authors_code" in parts and p.suffix == ".py":
      continue
    keep.append(p.relative_to(ROOT).as_posix())
  return sorted(keep)


def rel(p: pathlib.Path) -> str:
  try:
    return p.resolve().relative_to(ROOT).as_posix()
  except ValueError:
    return str(p)


def inside(p: pathlib.Path) -> bool:
  return p.resolve().is_relative_to(ROOT)


# ------------------------------------------------------------------ anchors
def slug(heading: str) -> str:
  """GitHub's anchor of a heading's markdown text."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
  text = re.sub(r"<[^>]+>", "", text)
  text = re.sub(r"[^\w\- ]", "", text.strip().lower())
  return text.replace(" ", "-")


def fenced(lines: list[str]) -> list[bool]:
  """Per line: whether it is in (or delimits) a fenced code block."""
  out, fence = [], None
  for line in lines:
    m = FENCE_RE.match(line)
    if fence is None:
      out.append(bool(m))
      fence = m.group(1) if m else None
    else:
      out.append(True)
      if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
        fence = None
  return out


def anchors_in(text: str) -> frozenset[str]:
  lines = text.splitlines()
  code = fenced(lines)
  seen: dict[str, int] = {}
  out = set()
  for i, line in enumerate(lines):
    if code[i]:
      continue
    for m in HTML_ANCHOR_RE.finditer(line):
      out.add(m.group(1) or m.group(2))
    m = HEADING_RE.match(line)
    heading = m.group(2) if m else None
    if (heading is None and i > 0 and re.match(r"^ {0,3}(=+|-+)\s*$", line)
        and lines[i - 1].strip() and not code[i - 1] and not HEADING_RE.match(lines[i - 1])
        and not lines[i - 1].lstrip().startswith(("|", "-", "*", ">"))):
      heading = lines[i - 1]  # a setext heading
    if heading is None:
      continue
    s = slug(heading)
    n = seen.get(s, 0)
    seen[s] = n + 1
    out.add(s if n == 0 else f"{s}-{n}")
  return frozenset(out)


@functools.cache
def anchors(path: pathlib.Path) -> frozenset[str]:
  return anchors_in(path.read_text(encoding="utf-8"))


def check_anchor(page: pathlib.Path, anchor: str) -> str | None:
  if not page.is_file():
    return f"no file {rel(page)}"
  if anchor not in anchors(page):
    return f"no heading of {rel(page)} has this anchor"
  return None


# -------------------------------------------------------------------- paths
def is_placeholder(part: str) -> bool:
  return part == "..." or "<" in part or "{" in part


def check_path(token: str, base: pathlib.Path) -> str | None:
  parts = token.split("/")
  if any(is_placeholder(p) for p in parts):
    fixed = parts[:next(i for i, p in enumerate(parts) if is_placeholder(p))]
    folder = base.joinpath(*fixed)
    return None if folder.is_dir() else f"no folder {rel(folder)}/ before the placeholder"
  target = base / token
  if not inside(target):
    return "outside the repository"
  if "*" in token or "?" in token:
    return None if any(base.glob(token.rstrip("/"))) else "the pattern matches no file"
  if not target.exists():
    return "no such file or folder"
  if token.endswith("/") and not target.is_dir():
    return "not a folder"
  return None


def check_defined(path: pathlib.Path, name: str) -> str | None:
  if path.suffix != ".py" or not path.is_file():
    return None
  tree = ast.parse(path.read_text(encoding="utf-8"))
  defined = {n.name for n in ast.walk(tree)
             if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
  return None if name in defined else f"{rel(path)} defines no {name}"


# ------------------------------------------------------------- dotted names
_MISSING = object()


def attribute(obj, name: str):
  value = getattr(obj, name, _MISSING)
  if value is _MISSING and isinstance(obj, type):
    if name in getattr(obj, "__dataclass_fields__", {}):
      return obj.__dataclass_fields__[name]
    if any(name in getattr(k, "__annotations__", {}) for k in obj.__mro__):
      return typing.Any
  return value


@functools.cache
def resolve(name: str) -> str | None:
  """Why the dotted name ``jsfl.<...>`` names nothing (None if it does)."""
  parts = name.split(".")
  module, i = None, len(parts)
  while module is None:
    prefix = ".".join(parts[:i])
    try:
      module = importlib.import_module(prefix)
    except ModuleNotFoundError as e:
      if e.name is None or not prefix.startswith(e.name) or i == 1:
        return f"importing {prefix} fails: {e}"
      i -= 1
  obj = module
  for j in range(i, len(parts)):
    obj = attribute(obj, parts[j])
    if obj is _MISSING:
      return f"{'.'.join(parts[:j])} has no {parts[j]}"
  return None


@functools.cache
def written_keys() -> frozenset[str]:
  """The string constants of ``jsfl/`` that are keys named ``jsfl.<key>``."""
  import jsfl
  out = set()
  for path in ROOT.glob("jsfl/**/*.py"):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        m = re.fullmatch(r"jsfl\.(\w+)[\w.]*", node.value)
        if (m and not hasattr(jsfl, m.group(1))
            and importlib.util.find_spec(f"jsfl.{m.group(1)}") is None):
          out.add(node.value)
  return frozenset(out)


def is_written_key(name: str) -> bool:
  return any(name == key.rstrip(".") or (key.endswith(".") and name.startswith(key))
             for key in written_keys())


@functools.cache
def engine_modules() -> frozenset[str]:
  return frozenset(p.stem for p in (ROOT / "jsfl" / "engine").glob("*.py")
                   if p.stem != "__init__")


# ----------------------------------------------------------------- the scan
def scan(relpath: str, text: str | None = None) -> list[str]:
  """``FILE:LINE: reference -> why`` for every reference of ``relpath`` (or
  of ``text``, read as if it were that file) that does not resolve."""
  path = ROOT / relpath
  here = path.parent
  if text is None:
    text = path.read_text(encoding="utf-8")
  lines = text.splitlines()
  markdown = path.suffix == ".md"
  code_block = fenced(lines) if markdown else [False] * len(lines)
  problems: list[str] = []

  def bad(i, ref, why):
    problems.append(f"{relpath}:{i}: {ref} -> {why}")

  for i, line in enumerate(lines, start=1):
    block = code_block[i - 1]
    if markdown and not block:
      for m in LINK_RE.finditer(line):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
          continue  # a URL or an absolute path
        file_part, _, anchor = target.partition("#")
        page = here / file_part
        if not file_part:
          if anchor not in anchors_in(text):
            bad(i, target, "no heading of this page has this anchor")
        elif not inside(page):
          bad(i, target, "outside the repository")
        elif not page.exists():
          bad(i, target, "no such file or folder")
        elif anchor and page.suffix == ".md":
          why = check_anchor(page, anchor)
          if why:
            bad(i, target, why)
      # the targets are checked: blank them for the scans below
      line = LINK_RE.sub(lambda m: " " * len(m.group(0)), line)

    for m in ANCHOR_RE.finditer(line):
      page_s, anchor = m.groups()
      if page_s.startswith(("./", "../")):
        page = here / page_s
      elif "/" in page_s:
        page = ROOT / page_s
      else:
        page = here / page_s if (here / page_s).is_file() else ROOT / "docs" / page_s
      why = check_anchor(page, anchor)
      if why:
        bad(i, f"{page_s}#{anchor}", why)

    spans = [(m.start(2), m.end(2)) for m in SPAN_RE.finditer(line)]
    in_span = lambda pos, spans=spans: any(a <= pos < b for a, b in spans)  # noqa: E731
    paths = [(m, ROOT) for m in PATH_RE.finditer(line)]
    paths += [(m, here) for m in RESULTS_RE.finditer(line) if in_span(m.start(1))]
    for m, base in paths:
      token = m.group(1).rstrip(".,;:")
      tail = line[m.start(1) + len(token):]
      if token.endswith(".md") and tail.startswith("#"):
        continue  # checked as an anchor
      if not (block or in_span(m.start(1)) or token.endswith("/") or token.count("/") >= 2
              or re.search(r"\.[A-Za-z0-9]+$", token)):
        continue  # prose: not a path by the rule above
      if token.startswith("../"):
        base = here
      why = check_path(token, base)
      test = re.match(r"::(\w+)", tail)
      if why is None and test:
        why = check_defined(base / token, test.group(1))
      if why:
        bad(i, token, why)

    for m in DOTTED_RE.finditer(line):
      name = m.group(1)
      why = None if is_written_key(name) else resolve(name)
      if why:
        bad(i, name, why)

    for a, b in spans:
      for m in RELATIVE_RE.finditer(line, a, b):
        name = m.group(1)
        first, last = name.split(".")[0], name.split(".")[-1]
        if last in EXTENSIONS:
          continue
        if first in PACKAGES:
          full = f"jsfl.{name}"
        elif first in engine_modules():
          full = f"jsfl.engine.{name}"
        else:
          continue
        why = resolve(full)
        if why:
          bad(i, name, f"{full}: {why}")

    for m in OUTSIDE_RE.finditer(line):
      bad(i, m.group(0).strip(), "cites a document the repository does not have (cite docs/)")

  return problems


FILES = scanned_files()


def test_the_scan_covers_the_library_text():
  assert {"README.md", "docs/architecture.md", "jsfl/cli.py", "jsfl/engine/split.py",
          "tests/test_references.py", "tests/README.md", "benchmarks/README.md",
          "benchmarks/throughput.py", "experiments/hydra/README.md", "benchmarks/gpu.sh",
          "experiments/sequential/grad_norms.py",
          "experiments/sequential/paper/table1_fashion_mnist.toml"} <= set(FILES)
  assert not [f for f in FILES if "/authors_code/" in f and f.endswith(".py")]
  assert not [f for f in FILES if "/results/" in f or f.startswith(".")]
  assert set(PENDING) <= set(FILES), "a PENDING file is no longer scanned"


def test_the_rules_find_every_kind():
  """The sample holds a broken reference of every kind; its expected
  findings are listed in the sample's companion file, in order."""
  assert slug("Padding and BatchNorm: PyTorch's model, not a look-alike") == (
    "padding-and-batchnorm-pytorchs-model-not-a-look-alike")
  assert slug("`jsfl run` and [its flags](cli.md)") == "jsfl-run-and-its-flags"
  assert resolve("jsfl.engine.split.run_round") is None
  assert resolve("jsfl.core.setup.Setup") is None
  assert is_written_key("jsfl.seed") and not is_written_key("jsfl.methods")
  sample = "tests/data/references_sample.md"
  expected = (ROOT / "tests/data/references_sample.expected").read_text().splitlines()
  assert scan(sample) == expected


@pytest.mark.parametrize("relpath", [
  pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=PENDING[f])) if f in PENDING else f
  for f in FILES])
def test_references_resolve(relpath):
  problems = scan(relpath)
  assert not problems, "unresolved references:\n" + "\n".join(problems)
