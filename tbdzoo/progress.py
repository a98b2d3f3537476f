"""Progress of the ``tbd`` commands: rich's live bars on a terminal, plain lines elsewhere.

Rich redraws its bars in place, which a log file or a pipe cannot show: there it prints
nothing until the command ends, so a long run looks stuck. Where output is not a terminal,
:class:`PlainProgress` takes the same calls and prints one line when a task starts, one when it
ends, and every ``interval`` seconds (10 by default; ``TBDZOO_PROGRESS_SECONDS`` sets it) one
line per running task: its elapsed time, what it is, its stage and its count.
"""
import os
import threading
import time

INTERVAL_VARIABLE = "TBDZOO_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 10.0


def interval_from_environment():
    """Seconds between plain progress lines: TBDZOO_PROGRESS_SECONDS if it is a positive
    number, else 10."""
    text = os.environ.get(INTERVAL_VARIABLE, "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value > 0 else DEFAULT_INTERVAL


def rich_console():
    """Rich's console; wide enough for the tables when output is not a terminal."""
    from rich.console import Console
    out = Console()
    return out if out.is_terminal else Console(width=160)


def progress_display(console, *columns, **options):
    """rich.progress.Progress(*columns, console=console, **options) on a terminal, else a
    :class:`PlainProgress` writing to the same console."""
    if console.is_terminal:
        from rich.progress import Progress
        return Progress(*columns, console=console, **options)
    return PlainProgress(lambda line: console.print(line, markup=False, highlight=False))


def elapsed_text(seconds):
    """'7 s', '1 min 05 s', '2 h 03 min'."""
    seconds = int(seconds)
    if seconds < 60:
        return "{} s".format(seconds)
    if seconds < 3600:
        return "{} min {:02d} s".format(seconds // 60, seconds % 60)
    return "{} h {:02d} min".format(seconds // 3600, seconds % 3600 // 60)


class _Task:
    def __init__(self, description, total, fields, started):
        self.description, self.total, self.fields = description, total, dict(fields)
        self.completed, self.started, self.stopped = 0, started, None


class PlainProgress:
    """The part of rich.progress.Progress the commands use (add_task, update, advance,
    stop_task, a context manager), as plain lines through ``write`` (a callable taking one
    string). ``clock`` gives seconds; a thread calls :meth:`tick` while the context is open, and
    a tick prints the running tasks once ``interval`` seconds have passed since the last lines."""

    def __init__(self, write, interval=None, clock=time.monotonic):
        self._write = write
        self.interval = interval_from_environment() if interval is None else float(interval)
        self._clock = clock
        self._tasks = []
        self._lock = threading.RLock()
        self._last = clock()
        self._stop = threading.Event()
        self._thread = None

    # -- the calls rich's Progress takes ------------------------------------------------------
    def __enter__(self):
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="tbd-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if exc_type is None:  # a normal end finishes what is still open
            for task_id in range(len(self._tasks)):
                self.stop_task(task_id)

    def add_task(self, description, total=None, completed=0, **fields):
        with self._lock:
            task = _Task(description, total, fields, self._clock())
            task.completed = completed
            self._tasks.append(task)
            self._line(task, "started")
            return len(self._tasks) - 1

    def update(self, task_id, total=None, completed=None, advance=None, description=None,
               **fields):
        with self._lock:
            task = self._tasks[task_id]
            if total is not None:
                task.total = total
            if completed is not None:
                task.completed = completed
            if advance is not None:
                task.completed += advance
            if description is not None:
                task.description = description
            task.fields.update(fields)

    def advance(self, task_id, advance=1):
        self.update(task_id, advance=advance)

    def stop_task(self, task_id):
        with self._lock:
            task = self._tasks[task_id]
            if task.stopped is None:
                task.stopped = self._clock()
                self._line(task, "finished")

    # -- the periodic lines -------------------------------------------------------------------
    def tick(self):
        """Print one line per running task if ``interval`` seconds have passed since the last
        periodic lines; returns how many lines were printed."""
        with self._lock:
            now = self._clock()
            if now - self._last < self.interval:
                return 0
            self._last = now
            running = [t for t in self._tasks if t.stopped is None]
            for task in running:
                self._line(task)
            return len(running)

    def _beat(self):
        while not self._stop.wait(min(1.0, self.interval / 4)):
            self.tick()

    def _line(self, task, event=None):
        end = task.stopped if task.stopped is not None else self._clock()
        parts = []
        stage = task.fields.get("stage")
        if stage:
            parts.append(str(stage))
        if task.total:
            count = "{:,}/{:,}".format(int(task.completed), int(task.total))
            if not (stage and count in str(stage)):
                parts.append(count)
        elif task.completed:
            parts.append("{:,}".format(int(task.completed)))
        if event:
            parts.insert(0, event)
        self._write("[{:>11}] {}{}".format(elapsed_text(end - task.started), task.description,
                                          ": " + ", ".join(parts) if parts else ""))
