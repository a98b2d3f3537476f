"""The docs stay true to the repository: every link resolves, every page is listed in the
README, every ``tbdzoo`` name they call exists and is callable, every model has its page of the
fixed template, every report and result file cited exists, and the numbers they quote from the
code (model names, parameter counts, consistency tolerances) are the code's."""
import ast
import importlib
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
MODEL_PAGES = os.path.join(DOCS, "models")
REPORTS = os.path.join(ROOT, "reports")


def _pages(folder):
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".md"))


PAGES = [os.path.join(ROOT, "README.md")] + _pages(DOCS) + _pages(MODEL_PAGES) + _pages(REPORTS)
MODEL_TEMPLATE = [
    "Problem", "Data", "Model", "Optimizer and schedule", "Quality target and evaluation",
    "How to run", "Deliberate deviations from the paper", "Measured facts"]
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


def _headings(text, level):
    """The headings of one level, outside fenced code blocks."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#" * level + " "):
            found.append(line[level + 1:].strip())
    return found


def test_every_model_has_a_page_of_the_template():
    import tbdzoo
    wrong = {}
    for name in tbdzoo.list_models():
        path = os.path.join(MODEL_PAGES, name + ".md")
        if not os.path.exists(path):
            wrong[name] = "no docs/models/{}.md".format(name)
            continue
        headings = _headings(read(path), 2)
        if headings != MODEL_TEMPLATE:
            wrong[name] = headings
    assert wrong == {}, "each docs/models/<name>.md has exactly the headings {}".format(MODEL_TEMPLATE)
    pages = set(f[:-3] for f in os.listdir(MODEL_PAGES) if f.endswith(".md"))
    assert pages == set(tbdzoo.list_models()), "a page for a model that does not exist"


def test_model_index_quotes_the_graphs_parameter_counts():
    from tbdzoo.models import get_model
    index = read(os.path.join(DOCS, "models.md"))
    rows = re.findall(r"^\| \[[^\]]+\]\(models/(\w+)\.md\) \|[^|]*\|[^|]*\| ([\d,]+) \|", index, re.M)
    assert len(rows) == 8
    for name, count in rows:
        model = get_model(name)
        graph = model.build_graph(model.hparams("paper"))
        assert int(count.replace(",", "")) == graph.trainable_count(), name


RESULT_PATH = re.compile(r"(?<![\w/.-])((?:\.\./)*(?:reports|benchmarks/results)/[\w.*-]+)")
OUTPUT_FLAG = re.compile(r"(--out|-o|--record|>)\s*$")


def _cited_paths(text):
    """Paths under reports/ or benchmarks/results/ that a page cites as existing: every link
    target, and every path named in its prose (not those a command writes to)."""
    cited = [t for t in LINK.findall(text) if "reports/" in t or "benchmarks/results/" in t]
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in RESULT_PATH.finditer(line):
            if not OUTPUT_FLAG.search(line[:m.start()]):
                cited.append(m.group(1).rstrip("."))
    return cited


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_cited_reports_and_results_exist(page):
    import glob
    missing = []
    for target in _cited_paths(read(page)):
        target = target.split("#")[0]
        if target.startswith("../") or "](" in target:
            base = os.path.dirname(page)
        else:
            base = ROOT   # a path in prose is named from the repository root
        path = os.path.normpath(os.path.join(base, target))
        if not glob.glob(path):
            missing.append(target)
    assert missing == []


def test_reports_are_dated_and_state_machine_commands_and_results():
    names = [f for f in os.listdir(REPORTS) if f.endswith(".md")]
    assert names, "no reports"
    for name in names:
        assert re.match(r"\d{4}-(0[1-9]|1[0-2])-[a-z0-9-]+\.md$", name), name
        head = read(os.path.join(REPORTS, name)).split("\n## ", 1)[0]
        for field in ("**Machine**", "**Commands**", "**Results**", "**Reading**"):
            assert field in head, "{} does not state {}".format(name, field)
