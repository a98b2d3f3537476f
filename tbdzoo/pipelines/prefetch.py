"""A background thread that keeps the next batches ready, for pipelines whose framework has
no prefetching of its own (the NumPy feed, and PyTorch's and Gluon's loaders without workers)."""
import queue
import threading
import weakref

__all__ = ["Prefetcher"]

_END = object()


class Prefetcher:
    """Iterates ``iterable`` in a daemon thread, ``depth`` items ahead; an exception raised
    there is raised here, at the item where it happened. ``close()`` stops the thread."""

    def __init__(self, iterable, depth=2):
        if depth < 1:
            raise ValueError("prefetch depth must be at least 1, got {}".format(depth))
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(iterable,), daemon=True)
        self._thread.start()
        # At exit the thread must not be stopped inside a framework's C++ call (PyTorch then
        # aborts the process): stop it and let its current item finish first.
        weakref.finalize(self, _stop_and_join, self._stop, self._thread)

    def _put(self, item):
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, iterable):
        try:
            for item in iterable:
                if not self._put((True, item)):
                    return
        except BaseException as e:  # noqa: BLE001  (handed to the consumer)
            self._put((False, e))
            return
        self._put((True, _END))

    def __iter__(self):
        return self

    def __next__(self):
        ok, item = self._queue.get()
        if not ok:
            self._stop.set()
            raise item
        if item is _END:
            self._stop.set()
            raise StopIteration
        return item

    def close(self):
        """Stop filling; waits for the item being made, so no thread outlives the loader."""
        _stop_and_join(self._stop, self._thread)


def _stop_and_join(stop, thread, timeout=60):
    stop.set()
    if thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)
