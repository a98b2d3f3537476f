"""setup.cfg's extras pin what requirements/ pins, so `pip install tbdzoo[...]` and `make env`
install the same versions."""
import configparser
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def requirements(name):
    with open(os.path.join(ROOT, "requirements", name)) as f:
        lines = [line.split("#")[0].strip() for line in f]
    return sorted(line for line in lines if line)


def extras():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    section = config["options.extras_require"]
    return {name: sorted(p.strip() for p in re.split(r"[;\n]", section[name]) if p.strip())
            for name in section}


def test_the_extras_pin_what_the_requirements_pin():
    groups = extras()
    assert groups["cntk"] == requirements("cntk.txt")
    assert groups["jax"] == requirements("jax.txt")
    main = sorted(p for name, pins in groups.items() if name not in ("cntk", "jax") for p in pins)
    assert main == requirements("main.txt"), "setup.cfg's extras and requirements/main.txt differ"


def test_the_description_names_every_model():
    import tbdzoo
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    description = config["metadata"]["description"]
    names = {"resnet50": "ResNet-50", "transformer": "Transformer", "inception_v3": "Inception-v3",
             "wgan": "WGAN", "seq2seq": "Seq2Seq", "deepspeech2": "Deep Speech 2", "a3c": "A3C",
             "faster_rcnn": "Faster R-CNN"}
    assert sorted(names) == sorted(tbdzoo.list_models())
    assert all(names[m] in description for m in names), description
    assert "{} DNN models".format(["", "one", "two", "three", "four", "five", "six", "seven",
                                   "eight"][len(names)]) in description


def _package_files(root):
    """Every file under tbdzoo/ the package ships: what it imports and what it reads (a
    backend's ops.py, read as source by tbdzoo/backends/common/op_support.py, and any template
    or table beside the code), all but compiled caches."""
    found = set()
    for folder, dirs, files in os.walk(os.path.join(root, "tbdzoo")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found.update(os.path.relpath(os.path.join(folder, f), root).replace(os.sep, "/")
                     for f in files if not f.endswith((".pyc", ".pyo")))
    return found


def test_the_wheel_ships_the_package_and_tbd_runs_from_an_install_outside_the_checkout(tmp_path):
    """`pip wheel` of a copy of the checkout holds every file of tbdzoo/, and the wheel
    installed into a folder of its own runs `tbd --help` and `tbd list` from elsewhere: the
    package needs nothing from the source tree."""
    import shutil
    import subprocess
    import sys
    import zipfile
    source = tmp_path / "source"  # a copy: no stale build/ of an earlier layout can leak in
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(os.path.join(ROOT, name), str(source / name))
    shutil.copytree(os.path.join(ROOT, "tbdzoo"), str(source / "tbdzoo"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    wheels = tmp_path / "wheels"
    built = subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                                  str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.iterdir()
    shipped = set(zipfile.ZipFile(str(wheel)).namelist())
    expected = _package_files(ROOT)
    assert "tbdzoo/backends/torch/ops.py" in expected and "tbdzoo/cli.py" in expected
    assert expected <= shipped, "not in the wheel: {}".format(sorted(expected - shipped))

    target = tmp_path / "installed"
    installed = subprocess.run(pip + ["install", "--no-deps", "--no-build-isolation", "-q", "--target",
                                      str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("PYTHONSTARTUP", None)
    where = subprocess.run([sys.executable, "-c", "import tbdzoo; print(tbdzoo.__file__)"], cwd=str(elsewhere),
                           env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip() == str(target / "tbdzoo" / "__init__.py"), where.stdout + where.stderr
    script = target / "bin" / "tbd"  # the console script pip wrote from setup.cfg's entry point
    out = {}
    for command in ("--help", "list"):
        done = subprocess.run([sys.executable, str(script), command], cwd=str(elsewhere), env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        out[command] = done.stdout
    assert out["--help"].startswith("usage: tbd"), out["--help"]
    assert all(name in out["list"] for name in ("resnet50", "faster_rcnn", "torch", "cntk")), out["list"]


def test_the_public_api_carries_type_hints_that_resolve():
    """tbdzoo's functions and BackendModel's public methods annotate every argument and the
    result (tbdzoo/py.typed tells type checkers to read them), and the annotations resolve:
    a misspelt forward reference fails here, not in a user's type checker."""
    import inspect
    import typing

    import tbdzoo
    from tbdzoo import weights
    from tbdzoo.backends.base import BackendModel
    assert os.path.exists(os.path.join(ROOT, "tbdzoo", "py.typed"))
    functions = [getattr(tbdzoo, n) for n in tbdzoo.__all__ if inspect.isfunction(getattr(tbdzoo, n))]
    functions += [weights.save, weights.load, weights.read]
    for name, member in vars(BackendModel).items():
        if name.startswith("_"):
            continue
        member = member.fget if isinstance(member, property) else member
        if inspect.isfunction(member):
            functions.append(member)
    assert len(functions) > 20
    for function in functions:
        hints = typing.get_type_hints(function)
        parameters = [p for p in inspect.signature(function).parameters if p != "self"]
        missing = [p for p in parameters + ["return"] if p not in hints]
        assert not missing, "{} lacks annotations for {}".format(function.__qualname__, missing)


def test_ruff_checks_the_cntk_workers_modules_as_old_python():
    """pyproject.toml's per-file target (py37, ruff's oldest) and 3.7-only rewrites left out
    cover exactly the modules tests/test_python36.py compiles under CPython 3.6, so a ruff
    fix cannot bring newer syntax into the CNTK worker's code."""
    import tomllib

    from test_python36 import SHARED
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        ruff = tomllib.load(f)["tool"]["ruff"]
    shared = {p if p.endswith(".py") else p + "/**" for p in SHARED}
    targets = ruff["per-file-target-version"]
    assert set(targets) == shared, set(targets) ^ shared
    assert set(targets.values()) == {"py37"}
    ignores = ruff["lint"]["per-file-ignores"]
    assert all({"UP021", "UP022"} <= set(ignores.get(p, ())) for p in shared), shared - set(ignores)
