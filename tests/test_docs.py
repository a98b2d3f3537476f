"""The docs stay true to the repository: every link resolves, every page is listed in the
README, every ``tbdzoo`` name they call exists and is callable, and the numbers they quote
from the code (model names, consistency tolerances) are the code's."""
import ast
import importlib
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
PAGES = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CALL = re.compile(r"\b(tbdzoo(?:\.\w+)+)\(")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_tracked_file_cites_a_design_file_outside_the_repository():
    missing = "DESIGN" + ".md"  # spelt in two parts so this file does not match itself
    citing = []
    for path in tracked_files():
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            continue
        with open(full, "rb") as f:
            if missing.encode() in f.read():
                citing.append(path)
    assert not os.path.exists(os.path.join(ROOT, missing))
    assert citing == [], "cite the docs/ page that holds the content instead: {}".format(citing)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_point_to_existing_files(page):
    broken = []
    for target in LINK.findall(read(page)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the same page
        path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
        if not os.path.exists(path):
            broken.append(target)
    assert broken == []


def test_readme_lists_every_docs_page():
    readme = read(os.path.join(ROOT, "README.md"))
    section = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", section))
    assert listed == set(f for f in os.listdir(DOCS) if f.endswith(".md"))


def resolve(dotted):
    """The object a dotted ``tbdzoo....`` name refers to, importing modules as needed."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if not hasattr(obj, part):
            importlib.import_module(".".join(parts[:i + 1]))
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_tbdzoo_call_in_the_docs_is_callable(page):
    """``tbdzoo.profiling.profile(...)`` would name a module: a reader's copy would fail."""
    for dotted in sorted(set(CALL.findall(read(page)))):
        assert callable(resolve(dotted)), "{} is not callable".format(dotted)


def test_readme_shows_the_models_that_exist():
    import tbdzoo
    line = re.search(r"tbdzoo\.list_models\(\)\s+# (\[.*\])", read(os.path.join(ROOT, "README.md")))
    assert ast.literal_eval(line.group(1)) == tbdzoo.list_models()


def _written(number):
    """How the docs write a tolerance: 1e-4 as '1e-4', 0.9999 as '0.9999'."""
    if number >= 0.01:
        return "{:g}".format(number)
    return re.sub(r"e-0*", "e-", "{:.0e}".format(number))


def test_consistency_page_states_the_tolerances_the_code_applies():
    from tbdzoo.consistency import TOLERANCES
    page = read(os.path.join(DOCS, "consistency.md"))
    section = page.split("## Tolerances", 1)[1].split("\n## ", 1)[0]
    values = [v for group in TOLERANCES.values() for v in group.values()]
    missing = [v for v in values if _written(v) not in section]
    assert missing == [], "docs/consistency.md does not state {}".format(missing)
