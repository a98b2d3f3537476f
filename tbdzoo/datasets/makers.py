"""The registry of data sets tbdzoo makes offline (``tbd data list``, ``tbd data make``).

Nothing can be downloaded here, so tbdzoo builds small real data sets from what installs from
the package registries (docs/datasets.md). Each maker module defines ``MAKERS``, a dict
name -> (summary, function); the function is called as
``function(out_dir, seed, progress, **options)`` and returns a dict of facts for the manifest.
Its options are its keyword parameters with defaults (``tbd data make NAME --set size=299``).
``progress(what, done, total)`` reports how far a stage is; makers call it as often as they like.

``make`` writes into a temporary sibling of ``out`` and renames it at the end, so an interrupted
or failed make leaves no half-written data set, and writes ``tbdzoo-dataset.json`` (name, seed,
tbdzoo version, options, facts, file counts and a digest of every file).
"""
import collections
import hashlib
import importlib
import inspect
import json
import os
import shutil
import tempfile

from ..errors import UnknownNameError
from ..version import __version__
from .errors import DatasetError

__all__ = ["MAKER_MODULES", "MANIFEST", "Maker", "SystemPackageMissing", "list_makers",
           "get_maker", "parse_options", "make", "require_system_file", "read_manifest"]

# The modules whose MAKERS make up the registry, in a fixed order.
MAKER_MODULES = ("tbdzoo.datasets.make_images", "tbdzoo.datasets.make_text",
                 "tbdzoo.datasets.make_speech")
MANIFEST = "tbdzoo-dataset.json"
ENSURE_SCRIPT = "scripts/ensure_debian_packages.sh"

Maker = collections.namedtuple("Maker", "name summary function module options")


class SystemPackageMissing(DatasetError):
    """A file a maker reads comes from a system package that is not installed."""


def require_system_file(path, package):
    """``path``, or an error saying which Debian package installs it and how."""
    if not os.path.exists(path):
        raise SystemPackageMissing(
            "{} is missing: it comes from the Debian package {pkg}; install it with "
            "`sudo apt-get install {pkg}` (or run {script}, which `make test` calls)".format(
                path, pkg=package, script=ENSURE_SCRIPT))
    return path


def _options(function):
    """The maker's options: its keyword parameters after (out_dir, seed, progress), less those
    a ``functools.partial`` fixes (``lang`` of numbers-en-vi is its name, not an option)."""
    params = list(inspect.signature(function).parameters.values())[3:]
    fixed = getattr(function, "keywords", None) or {}
    return collections.OrderedDict((p.name, p.default) for p in params
                                   if p.default is not inspect.Parameter.empty
                                   and p.name not in fixed)


def list_makers():
    """Every maker of every module in MAKER_MODULES, sorted by name."""
    makers = {}
    for module_name in MAKER_MODULES:
        module = importlib.import_module(module_name)
        for name, (summary, function) in module.MAKERS.items():
            if name in makers:
                raise DatasetError("data set {!r} is defined by both {} and {}".format(
                    name, makers[name].module, module_name))
            makers[name] = Maker(name, summary, function, module_name, _options(function))
    return [makers[name] for name in sorted(makers)]


def get_maker(name):
    makers = {m.name: m for m in list_makers()}
    if name not in makers:
        raise UnknownNameError("data set", name, makers)
    return makers[name]


def _convert(maker, name, text, default):
    """``text`` as the type of the option's default."""
    try:
        if isinstance(default, bool):
            lowered = text.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return lowered in ("1", "true", "yes")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        kind = ("true or false" if isinstance(default, bool) else
                "an integer" if isinstance(default, int) else "a number")
        raise DatasetError("{}: option {}={!r} is not {} (default {!r})".format(
            maker.name, name, text, kind, default)) from None
    return text


def parse_options(maker, assignments):
    """``[(name, text), ...]`` (from ``--set NAME=VALUE``) as the maker's typed options."""
    options = {}
    for name, text in assignments or ():
        if name not in maker.options:
            raise DatasetError("{} has no option {!r}; its options: {}".format(
                maker.name, name, ", ".join("{}={!r}".format(k, v)
                                            for k, v in maker.options.items()) or "(none)"))
        default = maker.options[name]
        options[name] = _convert(maker, name, text, default) if isinstance(text, str) else text
    return options


def _file_summary(folder):
    """File counts by extension, total bytes and one SHA-256 over every file's path and bytes
    (the manifest itself excluded), so two makes can be compared."""
    by_extension, total_bytes, count = collections.Counter(), 0, 0
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if relative == MANIFEST:
                continue
            with open(path, "rb") as f:
                content = f.read()
            digest.update(relative.encode() + b"\0" + hashlib.sha256(content).digest())
            by_extension[os.path.splitext(name)[1] or "(none)"] += 1
            total_bytes += len(content)
            count += 1
    return {"count": count, "bytes": total_bytes,
            "by_extension": dict(sorted(by_extension.items())), "sha256": digest.hexdigest()}


def _check_out(out):
    if os.path.isfile(out):
        raise DatasetError("{}: is a file; give --out a new or empty folder".format(out))
    if os.path.isdir(out) and os.listdir(out):
        raise DatasetError("{}: exists and is not empty; give --out a new or empty folder (tbdzoo "
                           "never writes into or over an existing data set)".format(out))
    folder = os.path.dirname(os.path.abspath(out))
    while not os.path.isdir(folder):
        if os.path.exists(folder):
            raise DatasetError("{}: {} is not a folder; give --out a path through folders".format(
                out, folder))
        folder = os.path.dirname(folder)


def _make_parents(out):
    """Create the missing folders above ``out``; returns them, deepest first, for removal."""
    made, folder = [], os.path.dirname(out)
    while not os.path.isdir(folder):
        made.append(folder)
        folder = os.path.dirname(folder)
    for folder in reversed(made):
        os.mkdir(folder)
    return made


def _remove_empty(folders):
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:  # something else was written there meanwhile: keep it
            break


def _no_progress(what, done=None, total=None):
    pass


def make(name, out, seed=0, options=None, progress=None):
    """Make data set ``name`` in the new folder ``out`` and return its manifest; missing
    folders above ``out`` are created (and removed again if the make fails).

    ``options`` is a dict of the maker's options (or ``[(name, text)]`` pairs, converted to the
    types of their defaults). The data set is written into a temporary sibling folder and
    renamed to ``out`` when complete; on any error the temporary folder is removed.
    """
    maker = get_maker(name)
    if isinstance(options, dict):
        options = list(options.items())
    options = parse_options(maker, options)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise DatasetError("seed {!r}: give a non-negative integer".format(seed))
    _check_out(out)
    out = os.path.abspath(out)
    parents = _make_parents(out)
    try:
        work = tempfile.mkdtemp(prefix="." + os.path.basename(out) + ".partial-",
                                dir=os.path.dirname(out))
    except BaseException:
        _remove_empty(parents)
        raise
    try:
        facts = maker.function(work, seed, progress or _no_progress, **options)
        manifest = collections.OrderedDict([
            ("name", name), ("seed", seed), ("tbdzoo_version", __version__),
            ("options", dict(maker.options, **options)), ("facts", facts or {}),
            ("files", _file_summary(work))])
        with open(os.path.join(work, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=False)
            f.write("\n")
        if os.path.isdir(out):
            os.rmdir(out)          # empty (checked above); rename cannot replace a folder
        os.rename(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        _remove_empty(parents)
        raise
    return manifest


def read_manifest(folder):
    """The manifest ``make`` wrote into ``folder``."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise DatasetError("{}: cannot read the manifest ({}); was the folder made by `tbd data "
                           "make`?".format(path, e.strerror)) from e
    except ValueError as e:
        raise DatasetError("{}: malformed JSON: {}".format(path, e)) from e
