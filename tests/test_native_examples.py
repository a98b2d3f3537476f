"""The worked examples of docs/native-models.md ("Three examples in each framework") run as
they stand, each in a fresh process of its framework's environment: a new head, training
with early layers frozen, and an inner block's features, each checked by the example's own
asserts."""
import os
import re

import pytest

from conftest import require_backend, run_in_env
from tbdzoo.backends import environments

PAGE = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "native-models.md")
SECTION = "## Three examples in each framework"
# each example's heading -> the backend whose environment runs it
BACKENDS = {"PyTorch": "torch", "Keras": "tensorflow", "Gluon": "mxnet", "CNTK": "cntk",
            "Flax": "jax"}


def examples():
    """heading -> the code of the python block under it, in the section's order."""
    with open(PAGE) as f:
        text = f.read()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    found = {}
    for part in section.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        blocks = re.findall(r"```python\n(.*?)```", body, re.S)
        assert len(blocks) == 1, "{}: {} python blocks".format(heading, len(blocks))
        found[heading.strip()] = blocks[0]
    return found


def test_the_section_has_one_example_per_framework():
    assert list(examples()) == list(BACKENDS)


@pytest.mark.parametrize("heading", list(BACKENDS))
def test_the_example_runs_as_written(heading):
    backend = BACKENDS[heading]
    require_backend(backend)
    code = examples()[heading] + '\nprint("example ran")\n'
    proc = run_in_env(environments.python_for(backend), ["-c", code], timeout=600)
    assert proc.returncode == 0 and "example ran" in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-4000:]
