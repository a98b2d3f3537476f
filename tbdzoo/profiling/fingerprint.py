"""The environment fingerprint every record carries: enough to tell two runs' setups apart."""
import os
import platform
import socket
import sys

import numpy

from ..version import __version__


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def fingerprint(framework=None, framework_version=None, gpu=None):
    gpu = gpu or {}
    return {
        "tbdzoo": __version__, "framework": framework, "framework_version": framework_version,
        "python": platform.python_version(), "numpy": numpy.__version__,
        "os": platform.platform(), "cpu_model": cpu_model(), "cpu_cores": os.cpu_count(),
        "gpu_name": gpu.get("name"), "gpu_driver": gpu.get("driver"),
        "cuda": gpu.get("cuda_driver"), "hostname": socket.gethostname(),
        "executable": sys.executable,
    }
