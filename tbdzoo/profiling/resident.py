"""The process's resident memory on the CPU: now, its high-water mark, and resetting that mark
so that a peak belongs to one profile rather than to everything the process did before.

Linux keeps the high-water mark as ``VmHWM`` in /proc/self/status and resets it to the current
resident size when "5" is written to /proc/self/clear_refs. Where that cannot be done (another
OS, a kernel or sandbox that refuses the write) the only peak left is the process's lifetime
maximum (``getrusage``), and the record says so. Valid Python 3.6: workers run it.
"""
import os
import re

# How far back a peak reaches: this profile, or the whole life of the process.
PROFILE, PROCESS = "profile", "process"


def resident_bytes():
    """Current resident memory of this process (Linux /proc, no dependency); None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def high_water_bytes():
    """VmHWM: the most resident memory since the mark was last reset (or the process began)."""
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"^VmHWM:\s+(\d+)\s+kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def lifetime_peak_bytes():
    """The process's peak resident memory over its whole life (kilobytes on Linux)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_high_water():
    """Reset VmHWM to the current resident size; True when the kernel took the reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    mark, now = high_water_bytes(), resident_bytes()
    # The mark may already have moved past 'now' by a few pages; a mark far above it means the
    # write was accepted but ignored.
    return mark is not None and now is not None and mark <= now + 4 * 2 ** 20


def release_free_heap():
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``), so that resident
    memory read next counts what is held, not what was freed and kept for reuse. True when
    the C library offers it."""
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True


class PeakWindow:
    """``start()`` opens the window; ``peak()`` is the highest resident memory since then, and
    ``scope`` says whether that is truly this window (``profile``) or the process's lifetime
    maximum because the mark could not be reset (``process``)."""

    def __init__(self):
        self.scope = None

    def start(self):
        self.scope = PROFILE if reset_high_water() else PROCESS
        return self

    def peak(self):
        if self.scope == PROFILE:
            return high_water_bytes()
        return lifetime_peak_bytes()
