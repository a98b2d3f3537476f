"""Keeping the frameworks' start-up banners out of users' sessions (docs/backends.md).

TensorFlow's C++ libraries log through absl before anyone can configure it, CNTK warns about
the Linux distribution and its missing GPU libraries, and MXNet's NumPy shims raise
deprecation warnings: none of it concerns a user of tbdzoo. Each backend's ``__init__`` imports
its framework inside :func:`filtered_native_stderr`, which holds what is written to file
descriptor 2 (by C++ as well as Python) and writes back every line but the backend's known
banners, and ignores the Python warnings its framework raises about itself. Everything stays as
the frameworks print it when ``TBDZOO_VERBOSE`` is set (``tbd --verbose``).
Valid Python 3.6: the CNTK backend imports it.
"""
import contextlib
import os
import re
import sys
import tempfile
import warnings

VERBOSE_VARIABLE = "TBDZOO_VERBOSE"


def verbose():
    """Whether the frameworks' own messages are wanted (TBDZOO_VERBOSE set, not '0')."""
    return os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")


def is_banner(line, patterns):
    return any(re.search(p, line) for p in patterns)


@contextlib.contextmanager
def filtered_native_stderr(patterns):
    """Inside the block, file descriptor 2 goes to a temporary file; afterwards its lines are
    written to stderr, except those matching one of the regular expressions ``patterns``.
    Without effect when verbose or when stderr has no file descriptor."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, OSError, ValueError):
        saved = None
    if verbose() or saved is None:
        if saved is not None:
            os.close(saved)
        yield
        return
    held = tempfile.TemporaryFile()  # noqa: SIM115  (closed in the outer finally, after fd 2 is back)
    try:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            held.seek(0)
            text = held.read().decode("utf-8", "replace")
            kept = [l for l in text.splitlines(True) if not is_banner(l, patterns)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
    finally:
        os.close(saved)
        held.close()


def ignore_framework_warnings(modules, categories=(DeprecationWarning, FutureWarning)):
    """Ignore Python warnings of ``categories`` attributed to ``modules`` (package names, their
    submodules included): the frameworks' notes about themselves. A warning that a framework
    attributes to the caller's code (our use of its API) still shows. Not when verbose."""
    if verbose():
        return
    for module in modules:
        for category in categories:
            warnings.filterwarnings("ignore", category=category,
                                    module=re.escape(module) + r"(\.|$)")
