"""The code the CNTK worker imports stays valid CPython 3.6 and hashes specs identically."""

import tbdzoo
from conftest import require_backend, run_in_env
from tbdzoo.backends import environments

SHARED = ["tbdzoo/__init__.py", "tbdzoo/errors.py", "tbdzoo/weights.py", "tbdzoo/schedules.py",
          "tbdzoo/consistency.py", "tbdzoo/spec", "tbdzoo/models", "tbdzoo/datasets",
          "tbdzoo/profiling/__init__.py", "tbdzoo/profiling/timing.py", "tbdzoo/profiling/profile.py",
          "tbdzoo/profiling/cpu.py", "tbdzoo/profiling/gpu.py", "tbdzoo/profiling/memory.py",
          "tbdzoo/profiling/resident.py",
          "tbdzoo/profiling/flops.py", "tbdzoo/profiling/fingerprint.py",
          "tbdzoo/backends/__init__.py", "tbdzoo/backends/base.py", "tbdzoo/backends/common",
          "tbdzoo/backends/registry.py", "tbdzoo/backends/programs.py", "tbdzoo/backends/environments.py",
          "tbdzoo/backends/worker.py", "tbdzoo/backends/cntk", "tbdzoo/backends/info.py", "tbdzoo/reference",
          "tbdzoo/version.py", "tbdzoo/progress.py",
          "tbdzoo/distributed", "tbdzoo/training", "tbdzoo/pipelines/__init__.py",
          "tbdzoo/pipelines/measure.py", "tbdzoo/pipelines/augment.py", "tbdzoo/pipelines/order.py",
          "tbdzoo/export"]


def test_shared_code_compiles_under_python36():
    require_backend("cntk")
    import os
    paths = [os.path.join(environments.SOURCE_ROOT, p) for p in SHARED]
    proc = run_in_env(environments.python_of("cntk"), ["-m", "compileall", "-q", "-f"] + paths)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_spec_hashes_agree_across_interpreters():
    require_backend("cntk")
    code = ("import tbdzoo\n"
            "for n in tbdzoo.list_models():\n"
            "    md = tbdzoo.get_model(n)\n"
            "    for c in sorted(md.configs): print(n, c, md.build_graph(md.hparams(c)).hash())\n")
    proc = run_in_env(environments.python_of("cntk"), ["-c", code])
    assert proc.returncode == 0, proc.stderr
    here = []
    for n in tbdzoo.list_models():
        md = tbdzoo.get_model(n)
        here += ["{} {} {}".format(n, c, md.build_graph(md.hparams(c)).hash()) for c in sorted(md.configs)]
    assert proc.stdout.split("\n")[:-1] == here
