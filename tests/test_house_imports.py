"""The import structure: layers that point down (the contracts in .importlinter, checked by
import-linter), no cycle between modules, and no import of a tbdzoo module hidden in a
function unless that module imports an optional heavy library as it loads."""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "tbdzoo")

# Libraries a module may import inside a function so that `import tbdzoo` and `tbd` start fast
# and work without them: the frameworks, and the optional extras of setup.cfg (numpy is the
# one requirement). A tbdzoo module that imports one of these as it loads is heavy too.
HEAVY = {"torch", "torchvision", "tensorflow", "keras", "tf_keras", "mxnet", "cntk", "triton",
         "matplotlib", "sklearn", "skimage", "scipy", "gymnasium", "ale_py", "cv2", "PIL",
         "rich", "jinja2", "pynvml", "mlperf_logging", "psutil", "soundfile", "sentencepiece",
         "num2words", "sacrebleu"}


def module_name(path):
    rel = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def sources():
    """(module name, path, parsed tree) of every module of the package."""
    out = []
    for folder, _, files in os.walk(PACKAGE):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path) as fh:
                    out.append((module_name(path), path, ast.parse(fh.read(), path)))
    return out


def imports(tree, name, is_package):
    """(statement, imported module names, inside a function?) for each import in ``tree``,
    relative names resolved against module ``name``."""
    base = name.split(".") if is_package else name.split(".")[:-1]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.append((child, [a.name for a in child.names], in_function))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    stem = ".".join(base[:len(base) - child.level + 1] +
                                    ([child.module] if child.module else []))
                else:
                    stem = child.module
                # `from pkg import mod` imports the submodule pkg.mod when there is one
                found.append((child, [stem] + [stem + "." + a.name for a in child.names],
                              in_function))
            visit(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def heavy_modules(parsed):
    """The tbdzoo modules that import a HEAVY library as they load, directly or through the
    tbdzoo modules (and their packages) they import at module level."""
    known = {name for name, _, _ in parsed}
    needs = {}
    for name, path, tree in parsed:
        deps, heavy = set(), False
        for _, names, in_function in imports(tree, name, path.endswith("__init__.py")):
            if in_function:
                continue
            for n in names:
                if n.split(".")[0] in HEAVY:
                    heavy = True
                parts = n.split(".")
                deps.update(".".join(parts[:i]) for i in range(1, len(parts) + 1)
                            if ".".join(parts[:i]) in known)
        needs[name] = (deps, heavy)
    heavy = {n for n, (_, h) in needs.items() if h}
    grew = True
    while grew:
        grew = False
        for n, (deps, _) in needs.items():
            if n not in heavy and deps & heavy:
                heavy.add(n)
                grew = True
    return heavy


def function_level_tbdzoo_imports(parsed=None):
    """'file:line: statement' for each import of a tbdzoo module inside a function, where that
    module is not heavy (importing it at the top would cost nothing)."""
    parsed = parsed or sources()
    known = {name for name, _, _ in parsed}
    heavy = heavy_modules(parsed)
    bad = []
    for name, path, tree in parsed:
        for node, names, in_function in imports(tree, name, path.endswith("__init__.py")):
            targets = [n for n in names if n in known]
            if in_function and targets and not any(n in heavy for n in targets):
                bad.append("{}:{}: {}".format(os.path.relpath(path, ROOT), node.lineno,
                                              ast.unparse(node)))
    return bad


def test_no_tbdzoo_module_is_imported_inside_a_function():
    bad = function_level_tbdzoo_imports()
    assert not bad, ("import these at the top of the module (a function-level import of a "
                     "module that loads no heavy library only hides a cycle or a layer "
                     "pointing up):\n" + "\n".join(bad))


def test_the_heavy_rule_sees_frameworks_and_not_the_light_middle():
    parsed = sources()
    heavy = heavy_modules(parsed)
    assert "tbdzoo.backends.torch.model" in heavy      # imports torch as it loads
    assert "tbdzoo.profiling.report" in heavy          # jinja2 / matplotlib
    for light in ("tbdzoo", "tbdzoo.cli", "tbdzoo.suite", "tbdzoo.spec.graph",
                  "tbdzoo.backends.base", "tbdzoo.models"):
        assert light not in heavy, light
    # and the check finds a hidden import: a function importing a light module
    tree = ast.parse("def f():\n    from .errors import TbdError\n")
    found = [n for n, names, inside in imports(tree, "tbdzoo.example", False) if inside]
    assert found and "tbdzoo.errors" in imports(tree, "tbdzoo.example", False)[0][1]


def test_import_contracts_hold():
    """Layers top to bottom, backends independent of each other, the shared middle free of
    frameworks: .importlinter. Its output names each broken contract and the import chain."""
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    if not os.path.exists(lint):
        pytest.fail("lint-imports is missing beside {}: install import-linter "
                    "(requirements/main.txt)".format(sys.executable))
    proc = subprocess.run([lint, "--no-cache"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stdout


def test_no_cycle_between_modules():
    """No two tbdzoo modules reach each other through imports (at any level)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("tbdzoo", cache_dir=None)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            if chain and module < imported:
                cycles.append(" -> ".join((module,) + tuple(chain)))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
