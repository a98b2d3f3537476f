"""CPU utilisation over a timed region: the process's CPU time over wall time, and the
machine's per-core busy fraction. Two readings, no thread, so it costs nothing per step."""
import os
import time


class CpuMeter(object):
    def __init__(self):
        import psutil
        self._psutil = psutil
        self._process = psutil.Process()

    def start(self):
        self._wall = time.perf_counter()
        self._cpu = self._process.cpu_times()
        self._psutil.cpu_percent(percpu=True)  # primes the per-core counters

    def stop(self):
        wall = time.perf_counter() - self._wall
        now = self._process.cpu_times()
        busy = ((now.user - self._cpu.user) + (now.system - self._cpu.system)) / wall if wall else 0.0
        cores = os.cpu_count() or 1
        return {
            "cores": cores,
            "process_cores_busy": busy,
            "process_utilization": busy / cores,
            "system_per_core": [p / 100.0 for p in self._psutil.cpu_percent(percpu=True)],
            "source": "measured",
        }
