"""GPU counters through NVML (the nvidia-ml-py package): a background sampler for
utilisation, memory and power during the timed steps, the energy counter read at both ends,
and on Hopper and newer the GPM metrics (SM activity, occupancy, tensor activity) over the
whole region. Everything returns None cleanly where there is no GPU or no NVML.

NVML's utilisation is only "a kernel was running in the last sample period": it reads 100%
while tensor pipes idle. GPM's tensor activity is the figure that says how busy they were.
"""
import os
import threading
import time

from ..backends.info import backend_info


def _nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


# -- which NVML device a CUDA ordinal is --------------------------------------------------------
# NVML numbers every GPU of the machine in PCI order and ignores CUDA_VISIBLE_DEVICES, while a
# framework's 'cuda:N' counts only the visible devices. The device's UUID is the same on both
# sides, so the sampler finds its GPU by UUID.

def _uuid_key(uuid):
    """A UUID as NVML, CUDA_VISIBLE_DEVICES and frameworks write it, reduced to comparable form:
    no 'GPU-' prefix, lower case ('GPU-8c1A...' and '8c1a...' are the same device)."""
    text = _text(uuid).strip().lower()
    return text[len("gpu-"):] if text.startswith("gpu-") else text


def framework_device_uuid(backend, ordinal):
    """The UUID ``backend``'s framework reports for its CUDA device ``ordinal`` (the module its
    BackendInfo names as ``gpu``), or None where it reports none (then CUDA_VISIBLE_DEVICES
    decides; see :func:`nvml_index`)."""
    info = backend_info(backend)
    if info.gpu is None:
        return None
    return info.load("gpu").device_uuid(ordinal)


def nvml_index(ordinal=0, uuid=None, visible=None, nv=None):
    """The NVML index of CUDA device ``ordinal`` of this process, or None when it is not found.

    ``uuid`` (from the framework, full or a prefix) decides when given. Otherwise the
    ``ordinal``-th entry of CUDA_VISIBLE_DEVICES (``visible``; the environment's by default)
    does: a UUID or a prefix of one ('GPU-8c1a'), or an index into the machine's GPUs, which
    NVML counts in PCI order as CUDA does under CUDA_DEVICE_ORDER=PCI_BUS_ID. Unset, the
    ordinal is the index.
    """
    nv = nv or _nvml()
    if nv is None:
        return None
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        count = nv.nvmlDeviceGetCount()
        if uuid is None and visible is not None:
            entries = [e.strip() for e in visible.split(",") if e.strip()]
            if ordinal >= len(entries):
                return None
            entry = entries[ordinal]
            if entry.isdigit():
                index = int(entry)
                return index if index < count else None
            uuid = entry
        if uuid is None:
            return ordinal if ordinal < count else None
        wanted = _uuid_key(uuid)
        matches = [i for i in range(count) if _uuid_key(nv.nvmlDeviceGetUUID(
            nv.nvmlDeviceGetHandleByIndex(i))).startswith(wanted)]
        return matches[0] if len(matches) == 1 and wanted else None
    except Exception:
        return None


def _device_uuid(nv, handle):
    try:
        return _text(nv.nvmlDeviceGetUUID(handle))
    except Exception:
        return None


def device_info(index=0):
    """Name, UUID, driver and CUDA driver version of the GPU NVML numbers ``index`` (see
    :func:`nvml_index`), or None without NVML or that GPU."""
    nv = _nvml()
    if nv is None or index is None:
        return None
    try:
        if index >= nv.nvmlDeviceGetCount():
            return None
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        cuda = nv.nvmlSystemGetCudaDriverVersion_v2()
        return {"name": _text(nv.nvmlDeviceGetName(handle)), "index": index,
                "uuid": _device_uuid(nv, handle),
                "driver": _text(nv.nvmlSystemGetDriverVersion()),
                "cuda_driver": "{}.{}".format(cuda // 1000, (cuda % 1000) // 10)}
    except Exception:
        return None


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


class GpuSampler:
    """Samples every ``interval`` seconds in a daemon thread between start() and stop().

    ``index`` is NVML's (:func:`nvml_index` turns a CUDA device into it); None, or an index
    NVML does not have, leaves the sampler unavailable.
    """

    GPM_METRICS = (("sm_activity", "NVML_GPM_METRIC_SM_UTIL"),
                   ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
                   ("tensor_activity", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"))

    def __init__(self, index=0, interval=0.05):
        self.nv = _nvml()
        self.index, self.interval = index, interval
        self.handle = None
        if self.nv is not None and index is not None:
            try:
                self.handle = self.nv.nvmlDeviceGetHandleByIndex(index)
            except Exception:
                self.handle = None

    @property
    def available(self):
        return self.handle is not None

    def start(self):
        if not self.available:
            return
        self.samples = []
        self._stop = threading.Event()
        self._energy = self._read_energy()
        self._gpm = self._gpm_sample()
        self._thread = threading.Thread(target=self._run, name="tbdzoo-nvml", daemon=True)
        self._t0 = time.perf_counter()
        self._thread.start()

    def _run(self):
        nv, h = self.nv, self.handle
        while not self._stop.is_set():
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                self.samples.append((util.gpu / 100.0, mem.used, power))
            except Exception:
                pass
            self._stop.wait(self.interval)

    def _read_energy(self):
        try:
            return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle)  # millijoules
        except Exception:
            return None

    def _gpm_sample(self):
        nv = self.nv
        try:
            if not nv.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                return None
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(self.handle, sample)
            return sample
        except Exception:
            return None

    def _gpm_metrics(self, first):
        nv = self.nv
        if first is None:
            return None
        try:
            second = self._gpm_sample()
            if second is None:
                return None
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(self.GPM_METRICS)
            request.sample1, request.sample2 = first, second
            for i, (_, name) in enumerate(self.GPM_METRICS):
                request.metrics[i].metricId = getattr(nv, name)
            nv.nvmlGpmMetricsGet(request)
            out = {key: request.metrics[i].value / 100.0 for i, (key, _) in enumerate(self.GPM_METRICS)}
            for s in (first, second):
                nv.nvmlGpmSampleFree(s)
            return out
        except Exception:
            return None

    def stop(self):
        """The summary dict for the record, or None without a GPU."""
        if not self.available:
            return None
        self._stop.set()
        self._thread.join()
        energy = self._read_energy()
        gpm = self._gpm_metrics(self._gpm)
        info = device_info(self.index) or {}
        util = sorted(s[0] for s in self.samples)
        power = sorted(s[2] for s in self.samples)
        joules = (energy - self._energy) / 1000.0 if energy is not None and self._energy is not None else None
        return {
            "name": info.get("name"), "index": self.index, "uuid": info.get("uuid"),
            "samples": len(self.samples),
            "utilization": {"median": _median(util), "mean": sum(util) / len(util) if util else None},
            "memory_used_bytes": max((s[1] for s in self.samples), default=None),
            "power_w": {"median": _median(power), "max": power[-1] if power else None},
            "energy_j": joules,
            "gpm": gpm, "source": "measured",
        }


def _median(values):
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])
