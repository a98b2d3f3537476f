"""House rules the code keeps: one home per fact. What tbdzoo knows about a model lives in its
card (tbdzoo/models/<name>/); the shared middle reads it from ``get_model(name)`` and never
names a model in a string."""
import ast
import os

import tbdzoo
from tbdzoo.models.catalog import BUILTIN

PACKAGE = os.path.dirname(tbdzoo.__file__)
ROOT = os.path.dirname(PACKAGE)
MODELS = os.path.join(PACKAGE, "models")


def model_name_literals(source, names):
    """(line, text) of every string literal in ``source`` that is exactly a model's name."""
    return sorted((node.lineno, node.value) for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and node.value in names)


def test_the_scan_finds_a_model_name_in_a_string_and_only_there():
    source = ('"""Trains resnet50."""\n'
              'x = {"resnet50": 8}\n'
              'if name == \'a3c\':\n'
              '    pass\n'
              'y = "resnet50 on torch"  # deepspeech2\n')
    assert model_name_literals(source, set(BUILTIN)) == [(2, "resnet50"), (3, "a3c")]


def test_no_module_outside_the_model_cards_names_a_model_in_a_string():
    found = []
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        if os.path.commonpath([folder, MODELS]) == MODELS:
            continue
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                source = f.read()
            found += ["{}:{}: {!r}".format(os.path.relpath(path, ROOT), line, text)
                      for line, text in model_name_literals(source, set(BUILTIN))]
    assert found == [], (
        "a model's name in a string outside tbdzoo/models/: put the fact on the model's card "
        "(tbdzoo/models/card.py) and read it from get_model(name):\n" + "\n".join(found))


def test_every_builtin_model_has_its_package():
    for name in BUILTIN:
        assert os.path.isfile(os.path.join(MODELS, name, "__init__.py")), name
