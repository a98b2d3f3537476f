"""The launcher: starts this node's agent in the backend's environment and waits for it.

``start`` returns at once with a ``Launch`` (the agent's process, the job folder, each rank's
status); ``Launch.wait`` returns the agent's outcome or raises ``DistributedError`` naming the
rank that failed. The agent runs in a session of its own and every process it starts stays in
its process group, which ``wait`` kills at the end whatever happened: nothing outlives a run.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile

from ..backends import environments
from ..errors import BackendUnavailableError, DistributedError

RANK_TIMEOUT = 60.0     # seconds without a heartbeat before a rank counts as hung
STEP_TIMEOUT = 900.0    # seconds without any rank finishing a step (start-up included)


def free_port_block(count, host="127.0.0.1", attempts=50):
    """A port P such that P .. P + count - 1 are free on ``host`` now."""
    for _ in range(attempts):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise DistributedError("found no block of {} free ports on {}".format(count, host))


class Launch:
    """A running job on this node."""

    def __init__(self, job, process, directory, keep=False):
        self.job, self.process, self.dir, self.keep = job, process, directory, keep

    def statuses(self):
        """{local rank: [status events]} read so far."""
        out = {}
        for local in range(self.job["node"]["nproc"]):
            path = os.path.join(self.dir, "status-{}.jsonl".format(local))
            try:
                with open(path) as f:
                    out[local] = [json.loads(l) for l in f.read().splitlines() if l.strip()]
            except (OSError, ValueError):
                out[local] = []
        return out

    def rank_pids(self):
        """{local rank: pid} of the ranks that have started."""
        return {local: events[0]["pid"] for local, events in self.statuses().items()
                if events and events[0]["event"] == "start"}

    def wait(self, timeout=None):
        """The agent's results ({rank: result}); raises DistributedError when a rank failed."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise DistributedError("the run did not end within {:.0f} s and was stopped".format(timeout)) from None
        except BaseException:
            self.kill()
            raise
        finally:
            self.kill()
        outcome_path = os.path.join(self.dir, "outcome-{}.json".format(self.job["node"]["node_rank"]))
        try:
            with open(outcome_path) as f:
                outcome = json.load(f)
        except (OSError, ValueError):
            outcome = {"status": "error", "error": "the agent {} without an outcome; its stderr "
                       "ended:\n{}".format(_ended(self.process.returncode), self._agent_tail())}
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        if outcome["status"] != "ok":
            raise DistributedError(outcome["error"])
        return outcome["results"]

    def kill(self):
        """SIGKILL to the agent's whole process group (the ranks and helpers are in it)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def _agent_tail(self):
        try:
            with open(os.path.join(self.dir, "agent.err"), "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""


def _ended(code):
    if code is not None and code < 0:
        return "was killed by signal {}".format(-code)
    return "exited with status {}".format(code)


def start(job, keep=False):
    """Write ``job`` (see ``make_job``) to a folder of its own and start the agent."""
    backend = job["backend"]
    python = environments.python_for(backend)
    if not os.path.exists(python):
        raise BackendUnavailableError("backend {!r} needs its environment ({} is missing); {}".format(
            backend, python, environments.how_to_create(backend)))
    directory = tempfile.mkdtemp(prefix="tbdzoo-dist-")
    job = dict(job, dir=directory)
    job_path = os.path.join(directory, "job.json")
    with open(job_path, "w") as f:
        json.dump(job, f, indent=1)
    with open(os.path.join(directory, "agent.err"), "wb") as err:
        process = subprocess.Popen([python, "-m", "tbdzoo.distributed.agent", job_path],
                                   env=environments.worker_environment(), stdout=err, stderr=err,
                                   start_new_session=True)
    return Launch(job, process, directory, keep)


def make_job(model, backend, node, mode, per_replica, global_batch, config="paper", seed=0,
             overrides=None, protocol=None, steps=3, rank_timeout=RANK_TIMEOUT,
             step_timeout=STEP_TIMEOUT, weights_path=None, command=None, threads_per_rank=1,
             data=None, training=None, rank_module="tbdzoo.distributed.rank"):
    """The JSON job every agent and rank reads. ``node`` is a Node whose master port, when
    missing, is a free block on this host (the port and, for TensorFlow's workers, the next
    world-size ones). Each rank runs ``python -m RANK_MODULE JOB.json``: tbdzoo.distributed.rank,
    or a module above it that adds a mode (tbdzoo.training.rank)."""
    if node.master_port is None:
        if node.nnodes > 1:
            raise DistributedError("a run over several hosts needs --master HOST:PORT, the same "
                                   "on every node")
        node.master_port = free_port_block(node.world_size + 2, node.master_addr)
    return {"model": model, "backend": backend, "config": config, "seed": seed,
            "data_seed": seed, "overrides": dict(overrides or {}), "mode": mode,
            "per_replica": per_replica, "global_batch": global_batch,
            "protocol": protocol or {}, "steps": steps, "node": node.to_dict(),
            "rank_timeout": rank_timeout, "step_timeout": step_timeout,
            "weights_path": weights_path, "command": command,
            "threads_per_rank": threads_per_rank, "data": data, "training": training,
            "rank_module": rank_module}
