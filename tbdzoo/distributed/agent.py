"""The node agent: ``python -m tbdzoo.distributed.agent JOB.json``, one per host, started by
the launcher (tbdzoo/distributed/launch.py) in the backend's environment, as torchrun's agent.

It asks the backend's engine (tbdzoo/backends/<backend>/distributed.py) for helper processes
and each rank's environment, starts them, and supervises them until every rank has finished or
one has failed: a rank that exits with an error or a signal, stops its heartbeat for
``rank_timeout`` seconds, or, with every other rank, makes no step for ``step_timeout``
seconds. Then every other process is stopped and ``outcome.json`` names the rank and what it
saw. Everything it starts stays in its process group, which the launcher kills at the end, so
nothing outlives the run. Valid Python 3.6.
"""
import json
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict

from ..backends.common.engines import RANK_TIMEOUT_VARIABLE
from ..backends.environments import worker_environment
from ..errors import TbdError
from .rank import LOCAL_RANK_VARIABLE, NODE_VARIABLE, STATUS_VARIABLE, engine_of
from .world import ENVIRONMENT_VARIABLE, Node

POLL_SECONDS = 0.2
GRACE_SECONDS = 3.0      # after a first failure: time for the others' exits to be seen
TERMINATE_SECONDS = 5.0  # SIGTERM, then SIGKILL
STALE_SECONDS = 3.0      # a live rank silent this long when a peer fails is blamed instead


class Slot:
    """One local rank: its status file, stderr file and (when the agent started it) process."""

    def __init__(self, directory, local_rank):
        self.local_rank = local_rank
        self.status_path = os.path.join(directory, "status-{}.jsonl".format(local_rank))
        self.stderr_path = os.path.join(directory, "rank-{}.err".format(local_rank))
        self.process = None
        self.events = []
        self._read = 0
        self.exit_seen = None

    def refresh(self):
        try:
            with open(self.status_path) as f:
                f.seek(self._read)
                chunk = f.read()
        except OSError:
            return
        complete = chunk[:chunk.rfind("\n") + 1]
        self._read += len(complete)
        for line in complete.splitlines():
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass

    def last(self, event, key=None):
        for e in reversed(self.events):
            if e["event"] == event:
                return e if key is None else e.get(key)
        return None

    @property
    def pid(self):
        return self.process.pid if self.process is not None else self.last("start", "pid")

    @property
    def rank(self):
        r = self.last("init", "rank")
        return r

    def heartbeat_age(self, now):
        try:
            return now - os.stat(self.status_path).st_mtime
        except OSError:
            return None

    def progress(self):
        """(steps finished, time of the last event that shows progress)."""
        steps = sum(1 for e in self.events if e["event"] == "step")
        times = [e["time"] for e in self.events if e["event"] in ("start", "init", "built", "step")]
        return steps, (max(times) if times else None)

    def returncode(self):
        if self.process is not None:
            return self.process.poll()
        pid = self.pid
        if pid is None:
            return None
        try:
            os.kill(pid, 0)
            return None
        except OSError:  # started by an outside launcher: the exit status is not ours to read
            return 0 if self.last("done") else 1

    def describe(self):
        rank = self.rank
        who = "rank {}".format(rank) if rank is not None else "local rank {}".format(self.local_rank)
        return "{} (pid {})".format(who, self.pid)

    def stderr_tail(self, limit=1500):
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - limit))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [l for l in text.strip().splitlines() if l.strip()]
        return "\n".join(lines[-8:])


def how_it_ended(code):
    if code is None:
        return "still running"
    if code < 0:
        try:
            return "was killed by signal {}".format(signal.Signals(-code).name)
        except ValueError:
            return "was killed by signal {}".format(-code)
    return "exited with status {}".format(code)


class Agent:
    def __init__(self, job_path):
        with open(job_path) as f:
            self.job = json.load(f)
        self.job_path = job_path
        self.dir = self.job["dir"]
        self.node = Node.from_dict(self.job["node"])
        self.engine = engine_of(self.job["backend"])
        self.slots = [Slot(self.dir, i) for i in range(self.node.nproc)]
        self.helpers = []   # (Helper, Popen)
        self.launcher = None
        self.parent = os.getppid()  # the launcher: when it is gone, nobody waits for the run
        self.rank_timeout = float(self.job["rank_timeout"])
        self.step_timeout = float(self.job["step_timeout"])

    # -- starting ------------------------------------------------------------------------
    def _environment(self, extra):
        env = worker_environment()
        env.setdefault("OMP_NUM_THREADS", str(self.job.get("threads_per_rank", 1)))
        env[RANK_TIMEOUT_VARIABLE] = str(self.rank_timeout)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self):
        self.engine.check(self.node)
        for helper in self.engine.helpers(self.node):
            with open(os.path.join(self.dir, "helper-{}.err".format(helper.name)), "wb") as err:
                # the helper writes to its own copy of the descriptor; ours closes here
                self.helpers.append((helper, subprocess.Popen(
                    helper.argv, env=self._environment(helper.env), stdout=err, stderr=err)))
        argv = [sys.executable, "-m", self.job["rank_module"], self.job_path]
        command = self.engine.rank_launcher(self.node, argv)
        if command is None:
            for slot in self.slots:
                world = self.node.world(slot.local_rank)
                env = dict(self.engine.rank_environment(world))
                env[ENVIRONMENT_VARIABLE] = world.to_json()
                env[STATUS_VARIABLE] = slot.status_path
                with open(slot.stderr_path, "wb") as err:
                    slot.process = subprocess.Popen(argv, env=self._environment(env),
                                                    stdout=err, stderr=err)
        else:  # an outside launcher (mpiexec) starts every local rank
            env = {NODE_VARIABLE: json.dumps(self.node.to_dict()),
                   STATUS_VARIABLE: os.path.join(self.dir, "status-{local_rank}.jsonl"),
                   LOCAL_RANK_VARIABLE: self.engine.LOCAL_RANK_VARIABLE}
            with open(os.path.join(self.dir, "launcher.err"), "wb") as err:
                self.launcher = subprocess.Popen(command, env=self._environment(env),
                                                 stdout=err, stderr=err)
        self.started = time.time()

    # -- supervising ---------------------------------------------------------------------
    def supervise(self):
        """None when every rank finished, else the error message."""
        while True:
            time.sleep(POLL_SECONDS)
            now = time.time()
            for slot in self.slots:
                slot.refresh()
                if slot.exit_seen is None and slot.returncode() is not None:
                    slot.exit_seen = now
            failed = [s for s in self.slots if s.exit_seen is not None and s.returncode() != 0]
            if failed:
                return self._blame_exit()
            if all(s.exit_seen is not None for s in self.slots):
                return None
            for helper, process in self.helpers:
                if process.poll() is not None:
                    return "helper process {} (pid {}) {} while the ranks were running".format(
                        helper.name, process.pid, how_it_ended(process.returncode))
            if self.launcher is not None and self.launcher.poll() is not None:
                time.sleep(GRACE_SECONDS)  # the ranks' exits, if any, are seen first
                if not any(s.returncode() is None for s in self.slots):
                    continue
                return "the rank launcher {} (pid {}) {} before every rank finished{}".format(
                    os.path.basename(self.launcher.args[0]), self.launcher.pid,
                    how_it_ended(self.launcher.returncode), self._launcher_tail())
            message = self._hang(now)
            if message:
                return message
            if os.getppid() != self.parent:
                return "the launcher (pid {}) ended before the run did".format(self.parent)

    def _blame_exit(self):
        """The failed rank that caused the others to fail: one killed by a signal, else the
        one that reported its error first, else the first exit seen."""
        deadline = time.time() + GRACE_SECONDS
        while time.time() < deadline and not (
                all(s.returncode() is not None for s in self.slots)
                and (self.launcher is None or self.launcher.poll() is not None)):
            time.sleep(POLL_SECONDS)
        for slot in self.slots:
            slot.refresh()
            if slot.exit_seen is None and slot.returncode() is not None:
                slot.exit_seen = time.time()
        failed = [s for s in self.slots if s.exit_seen is not None and s.returncode() != 0]
        silent = self._silent(time.time())
        if silent is not None and not any(s.returncode() < 0 for s in failed):
            age, slot = silent
            return ("{} stopped responding: no heartbeat for {:.0f} s, and its peers failed "
                    "waiting for it before --rank-timeout {:g} s ended, after {} step(s)".format(
                        slot.describe(), age, self.rank_timeout, slot.progress()[0])
                    + self._others(slot))

        def order(slot):
            code = slot.returncode()
            error = slot.last("error")
            return (0 if code < 0 else 1, error["time"] if error else float("inf"), slot.exit_seen)
        culprit = min(failed, key=order)
        steps, _ = culprit.progress()
        # a rank an outside launcher started: that launcher holds its exit status and stderr
        ended = how_it_ended(culprit.returncode()) if culprit.process is not None \
            else "ended unfinished"
        message = "{} {} after {} step(s)".format(culprit.describe(), ended, steps)
        error = culprit.last("error", "error")
        tail = culprit.stderr_tail()
        if error:
            message += ": {}".format(error)
        elif tail:
            message += "; its stderr ended:\n{}".format(tail)
        elif culprit.process is None:
            message += self._launcher_tail()
        return message + self._others(culprit)

    def _silent(self, now):
        """(heartbeat age, slot) of the live rank silent longest, when that is above
        STALE_SECONDS: a rank stopped or stuck while its peers' collectives time out (a
        TensorFlow worker's coordination-service heartbeat gives up within seconds)."""
        ages = [(slot.heartbeat_age(now), slot) for slot in self.slots
                if slot.pid is not None and slot.returncode() is None]
        ages = [(age, slot) for age, slot in ages if age is not None and age > STALE_SECONDS]
        return max(ages, key=lambda pair: pair[0]) if ages else None

    def _launcher_tail(self):
        """The last lines of the outside launcher's output (mpiexec names the rank it lost
        and how), as a clause of an error message."""
        try:
            with open(os.path.join(self.dir, "launcher.err"), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 3000))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [l for l in text.strip().splitlines() if l.strip() and not l.startswith("---")]
        return "; {}'s output ended:\n{}".format(
            os.path.basename(self.launcher.args[0]), "\n".join(lines[-4:])) if lines else ""

    def _hang(self, now):
        # the silent rank whose heartbeat stopped first: a peer blocked in a collective that
        # holds the interpreter's lock may fall silent after it
        silent = [(slot.heartbeat_age(now), slot) for slot in self.slots
                  if slot.exit_seen is None and slot.pid is not None]
        silent = [(age, slot) for age, slot in silent if age is not None and age > self.rank_timeout]
        if silent:
            age, slot = max(silent, key=lambda pair: pair[0])
            steps, _ = slot.progress()
            return ("{} stopped responding: no heartbeat for {:.0f} s (--rank-timeout {:g} s)"
                    " after {} step(s)".format(slot.describe(), age, self.rank_timeout, steps)
                    + self._others(slot))
        progress = [s.progress() for s in self.slots]
        latest = max([t for _, t in progress if t is not None] or [self.started])
        if now - latest > self.step_timeout:
            behind = min(self.slots, key=lambda s: (s.progress()[0], s.progress()[1] or 0))
            return ("no rank finished a step for {:.0f} s (--step-timeout {:g} s); {} is furthest "
                    "behind, after {} step(s)".format(now - latest, self.step_timeout,
                                                      behind.describe(), behind.progress()[0])
                    + self._others(behind))
        if all(s.pid is None for s in self.slots) and now - self.started > self.step_timeout:
            return "no rank started within --step-timeout {:g} s".format(self.step_timeout)
        return None

    def _others(self, culprit):
        seen = []
        for slot in self.slots:
            if slot is culprit:
                continue
            error = slot.last("error", "error")
            if error:
                seen.append("{} saw: {}".format(slot.describe(), error.splitlines()[0][:300]))
        return ("\nthe other ranks were stopped" + (": " + "; ".join(seen) if seen else "")
                if len(self.slots) > 1 else "")

    # -- stopping ------------------------------------------------------------------------
    def stop_all(self):
        """SIGTERM to every process started here and their children, SIGKILL to what is left."""
        import psutil
        processes = []
        for p in [s.process for s in self.slots] + [p for _, p in self.helpers] + [self.launcher]:
            pid = p.pid if p is not None else None
            if pid is None:
                continue
            try:
                parent = psutil.Process(pid)
                processes.extend(parent.children(recursive=True) + [parent])
            except psutil.Error:
                pass
        for slot in self.slots:  # ranks an outside launcher started
            if slot.process is None and slot.pid is not None:
                try:
                    processes.append(psutil.Process(slot.pid))
                except psutil.Error:
                    pass
        for p in processes:
            try:
                p.send_signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only after
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(processes, timeout=TERMINATE_SECONDS)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=TERMINATE_SECONDS)

    def results(self):
        out = OrderedDict()
        for name in sorted(os.listdir(self.dir)):
            if name.startswith("result-") and name.endswith(".json"):
                with open(os.path.join(self.dir, name)) as f:
                    result = json.load(f)
                out[str(result["rank"])] = result
        return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    agent = Agent(argv[0])
    outcome_path = os.path.join(agent.dir, "outcome-{}.json".format(agent.node.node_rank))
    try:
        agent.start()
        error = agent.supervise()
    except Exception as e:  # noqa: BLE001  (the engine refused the job, or a process could not start)
        error = str(e) if isinstance(e, TbdError) else "{}: {}".format(type(e).__name__, e)
    if error is None:
        outcome = {"status": "ok", "results": agent.results()}
    else:
        outcome = {"status": "error", "error": error}
    agent.stop_all()
    with open(outcome_path + ".part", "w") as f:
        json.dump(outcome, f)
    os.rename(outcome_path + ".part", outcome_path)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
