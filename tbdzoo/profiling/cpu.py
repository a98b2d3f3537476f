"""CPU utilisation over a timed region: CPU time over wall time, of this process alone or
(``tree=True``) of its whole process tree, and the machine's per-core busy fraction. Two
readings, no thread, so it costs nothing per step. Valid Python 3.6."""
import os
import time
from collections import OrderedDict


class CpuMeter:
    """``process_cores_busy``: cores' worth of CPU this process used; with ``tree=True``,
    ``process_tree_cores_busy``: this process and its children (live ones at the end, plus
    those that exited and were waited for: a DataLoader's workers), for data-fed runs."""

    def __init__(self, tree=False):
        import psutil
        self._psutil = psutil
        self._process = psutil.Process()
        self._tree = tree
        self._prefix = "process_tree" if tree else "process"

    def _seconds(self):
        if not self._tree:
            t = self._process.cpu_times()
            return t.user + t.system
        total = 0.0
        for p in [self._process] + self._process.children(recursive=True):
            try:
                t = p.cpu_times()
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                continue
            total += t.user + t.system
        reaped = os.times()
        return total + reaped.children_user + reaped.children_system

    def start(self):
        self._wall = time.perf_counter()
        self._cpu = self._seconds()
        self._psutil.cpu_percent(percpu=True)  # primes the per-core counters

    def stop(self):
        wall = time.perf_counter() - self._wall
        busy = max(self._seconds() - self._cpu, 0.0) / wall if wall else 0.0
        cores = os.cpu_count() or 1
        return OrderedDict([
            ("cores", cores), (self._prefix + "_cores_busy", busy),
            (self._prefix + "_utilization", busy / cores),
            ("system_per_core", [p / 100.0 for p in self._psutil.cpu_percent(percpu=True)]),
            ("source", "measured")])
