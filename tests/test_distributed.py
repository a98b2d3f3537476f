"""Data-parallel training on the frameworks' own engines (docs/distributed.md), two processes on
this host's CPU: they train like one process at the same global batch, BatchNorm behaves per
replica as documented, and a rank that dies or hangs ends the run naming it, leaving nothing
behind."""
import json
import os
import signal
import time

import numpy as np
import pytest

from conftest import require_framework
from tbdzoo import distributed
from tbdzoo.backends.registry import build_native
from tbdzoo.consistency import TOLERANCES
from tbdzoo.distributed import launch
from tbdzoo.distributed.world import Node, batch_sizes, counted, gradient_weight, shard
from tbdzoo.errors import DistributedError, UnsupportedOptionError
from tbdzoo.models import get_model

require_framework("torch")

GLOBAL_BATCH = 8
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-6       # docs/distributed.md, "Correctness and tolerances"
WEIGHT_RTOL, WEIGHT_ATOL = 1e-4, 1e-4
FAST = dict(rank_timeout=60.0, step_timeout=300.0)
SEQ2SEQ_BATCH = 6  # Seq2Seq tiny's 6 pairs at seed 0: 15 target tokens in rank 0's shard, 13 in rank 1's


def reference(backend, model, steps, batch_size, make=build_native, **overrides):
    """One process at the global batch: its losses, weights after ``steps`` and gradients.
    ``make`` builds the model: ``build`` where it runs in a worker of its own environment
    (CNTK, JAX)."""
    with make(model, backend, config="tiny", seed=0, device="cpu", batch_size=batch_size,
              **overrides) as m:
        batch = m.synthetic_batch(seed=0, batch_size=batch_size)
        _, grads = m.loss_and_gradients(batch)
        losses = [m.train_step(batch) for _ in range(steps)]
        return losses, m.get_weights(), grads


def noise_only(grads):
    """Parameters whose gradient is zero in exact arithmetic (attention's b_k) and holds only
    rounding noise: Adam turns that noise into full-size steps in any direction, so their
    weights are not compared (the same floor as docs/consistency.md)."""
    largest = max(float(np.abs(g).max()) for g in grads.values())
    floor = TOLERANCES["gradients"]["atol_of_global"] * largest
    return {k for k, g in grads.items() if float(np.abs(g).max()) < floor}


def assert_weights_close(actual, expected, skip=()):
    for name, value in expected.items():
        if name in skip:
            continue
        np.testing.assert_allclose(actual[name], value, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL,
                                   err_msg=name)


# -- shards and weights -----------------------------------------------------------------------
def test_contiguous_shards_give_back_the_global_batch_and_weights_sum_to_one():
    md = get_model("transformer")
    hp = md.hparams("tiny")
    spec = md.build_graph(hp)
    full = md.synthetic_batch(hp, GLOBAL_BATCH, 0)
    parts = [shard(spec, full, r, 2) for r in range(2)]
    for name in full:
        np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), full[name])
    weights = [gradient_weight(spec, full, r, 2) for r in range(2)]
    assert sum(weights) == pytest.approx(1.0)
    assert weights[0] == counted(spec, parts[0]) / counted(spec, full)


def test_a_program_step_is_sharded_in_every_update():
    md = get_model("wgan")
    hp = md.hparams("tiny")
    spec = md.build_graph(hp)
    from tbdzoo.backends.programs import split_step_batch, stacked_synthetic
    full = stacked_synthetic(lambda n, s: md.synthetic_batch(hp, n, s), spec, spec.program, 4, 0)
    updates, size = split_step_batch(spec, spec.program, full)
    part = shard(spec, full, 1, 2)
    mine, mine_size = split_step_batch(spec, spec.program, part)
    assert mine_size == size // 2
    for (_, whole), (_, half) in zip(updates, mine):
        for name in whole:
            np.testing.assert_array_equal(half[name], whole[name][2:4])


def test_batch_sizes_weak_and_strong():
    assert batch_sizes(2, per_replica=4) == (4, 8, "weak")
    assert batch_sizes(2, per_replica=4, global_batch=6) == (3, 6, "strong")
    with pytest.raises(ValueError, match="does not divide among 4"):
        batch_sizes(4, per_replica=4, global_batch=6)
    with pytest.raises(UnsupportedOptionError, match="BatchNorm mode"):
        Node("torch", nproc=2, bn_mode="global")


# -- correctness: N processes at global batch B train like one process at B ---------------------
@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_two_processes_train_like_one(backend):
    require_framework(backend)
    assert_two_ranks_train_like_one(backend)


def assert_two_ranks_train_like_one(backend, make=build_native):
    """The Transformer (no dropout), three steps of two ranks against one process at the
    global batch (``make``: as ``reference``'s)."""
    steps, overrides = 3, dict(dropout=0.0)
    expected, weights, grads = reference(backend, "transformer", steps, GLOBAL_BATCH, make,
                                         **overrides)
    got = distributed.train("transformer", backend, nproc=2, global_batch=GLOBAL_BATCH,
                            steps=steps, config="tiny", **dict(overrides, **FAST))
    assert_trained_like_one(got, expected, weights, grads)


@pytest.mark.parametrize("backend", ["torch", "tensorflow", "mxnet"])
def test_a_recurrent_model_over_ragged_batches_trains_like_one_process(backend):
    """Seq2Seq tiny (LSTMs over per-example lengths, attention, a one-objective program whose
    loss averages over target tokens; no BatchNorm, no dropout): each rank's shard has its own
    padding and its own number of tokens, and the global losses and weights are still one
    process's at the global batch."""
    require_framework(backend)
    expected, weights, grads = reference(backend, "seq2seq", 3, SEQ2SEQ_BATCH)
    got = distributed.train("seq2seq", backend, nproc=2, global_batch=SEQ2SEQ_BATCH, steps=3,
                            config="tiny", **FAST)
    # the loss averages over target tokens, and the two shards hold different numbers of them
    assert got["ranks"][0]["gradient_weight"] == pytest.approx(15 / 28)
    np.testing.assert_allclose(got["losses"], expected, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    skip = noise_only(grads)
    assert_weights_close(got["weights"], weights, skip)
    assert_weights_close(got["ranks"][1]["weights"], got["weights"], skip)


def assert_trained_like_one(got, expected, weights, grads):
    """Global losses and both ranks' weights as one process's at the global batch (attention's
    key bias aside: its gradient is rounding noise, docs/distributed.md)."""
    np.testing.assert_allclose(got["losses"], expected, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    skip = noise_only(grads)
    assert skip and all(".b_k" in k for k in skip)
    assert_weights_close(got["weights"], weights, skip)
    assert_weights_close(got["ranks"][1]["weights"], got["weights"], skip)
    # the shards really differ: each rank's own loss is not the global one
    assert got["ranks"][0]["losses"][0] != pytest.approx(expected[0], rel=1e-4)


def per_shard_reference(backend, model, overrides=None, make=build_native):
    """One process on each rank's shard separately: the model (``make``: as ``reference``'s;
    the caller closes it), the shards, their gradient weights and the losses and gradients of
    the first step."""
    md = get_model(model)
    hp = md.hparams("tiny", **dict(overrides or {}, batch_size=GLOBAL_BATCH))
    spec = md.build_graph(hp)
    m = make(model, backend, config="tiny", seed=0, device="cpu",
             **dict(overrides or {}, batch_size=GLOBAL_BATCH // 2))
    full = m.synthetic_batch(seed=0, batch_size=GLOBAL_BATCH)
    shards = [shard(spec, full, r, 2) for r in range(2)]
    weights = [gradient_weight(spec, full, r, 2) for r in range(2)]
    results = [m.loss_and_gradients(s) for s in shards]
    return m, shards, weights, results


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_batchnorm_statistics_are_per_replica(backend):
    """ResNet-50 with --bn-mode replica: the first step's loss is the mean of the shards'
    losses, each normalised by its own shard's statistics, and the update is SGD's with the
    mean of the shards' gradients; rank 0 keeps its own shard's running statistics.

    The reference runs in a fresh process, as each rank does: after the suite's earlier
    modules, TensorFlow in this process computed the per-shard step 3.6e-4 away from the
    ranks' (the tiny network's BatchNorm over 4 values a channel amplifies rounding), while
    the same test alone, or with its own module, passed."""
    require_framework(backend)
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_per_replica_case, (backend,))


def _per_replica_case(backend):
    got, stats, full = replica_batchnorm_step(backend)
    whole_batch_loss = build_native("resnet50", backend, config="tiny", device="cpu",
                                    batch_size=GLOBAL_BATCH).loss_and_gradients(full)[0]
    assert abs(got["losses"][0] - whole_batch_loss) > 1e-4  # BatchNorm saw another batch
    assert_weights_close(got["weights"], stats[0])  # rank 0's running statistics: its shard's


def replica_batchnorm_step(backend, make=build_native):
    """ResNet-50, --bn-mode replica, one step of two ranks: the first loss is the shards'
    weighted mean, each with its own statistics, and the SGD update uses the weighted mean of
    the shards' gradients. Returns the run's result, the running statistics one step on each
    shard alone leaves (one dict a shard) and the global batch."""
    m, shards, weights, results = per_shard_reference(backend, "resnet50", make=make)
    with m:
        lr, wd = m.learning_rate(), m.hparams["weight_decay"]
        w0 = m.get_weights()
        names = m.trainable_names()
        full = m.synthetic_batch(seed=0, batch_size=GLOBAL_BATCH)
        stats = []
        for part in shards:
            m.set_weights(w0)
            m.train_step(part)
            stats.append({n: v for n, v in m.get_weights().items() if "running" in n})
    got = distributed.train("resnet50", backend, nproc=2, global_batch=GLOBAL_BATCH, steps=1,
                            config="tiny", **FAST)
    expected_loss = sum(w * loss for w, (loss, _) in zip(weights, results))
    assert got["losses"][0] == pytest.approx(expected_loss, rel=LOSS_RTOL, abs=LOSS_ATOL)
    expected = {n: w0[n] - lr * (sum(w * g[n] for w, (_, g) in zip(weights, results)) + wd * w0[n])
                for n in names}
    assert_weights_close(got["weights"], expected)
    return got, stats, full


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_synchronised_batchnorm_trains_like_one_process(backend):
    """ResNet-50 with --bn-mode sync: statistics over the global batch, so two steps of two
    ranks are one process's at the global batch, running statistics included."""
    require_framework(backend)
    expected, weights, _ = reference(backend, "resnet50", 2, GLOBAL_BATCH)
    got = distributed.train("resnet50", backend, nproc=2, global_batch=GLOBAL_BATCH, steps=2,
                            config="tiny", bn_mode="sync", **FAST)
    np.testing.assert_allclose(got["losses"], expected, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    assert_weights_close(got["weights"], weights)
    assert_weights_close(got["ranks"][1]["weights"], weights)


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_a_training_program_reduces_each_phase_before_clipping(backend):
    """WGAN-GP (a generator phase, then five critic phases, each on its own group): the first
    step's objectives are the shards' weighted mean, and every rank holds the same weights
    after two steps, which only a reduction of every phase's gradients gives."""
    require_framework(backend)
    assert_each_phase_reduced(backend)


def assert_each_phase_reduced(backend, make=build_native):
    """WGAN-GP, two steps of two ranks: the first generator objective is the shards' weighted
    mean, and both ranks hold the same weights (``make``: as ``reference``'s)."""
    m, _shards, weights, results = per_shard_reference(backend, "wgan", make=make)
    with m:
        names = m.trainable_names()
    got = distributed.train("wgan", backend, nproc=2, global_batch=GLOBAL_BATCH, steps=2,
                            config="tiny", **FAST)
    first = got["losses"][0]
    # the generator's objective is its first update's: one loss_and_gradients evaluates it
    expected = sum(w * r[0]["generator"] for w, r in zip(weights, results))
    assert first["generator"] == pytest.approx(expected, rel=LOSS_RTOL, abs=LOSS_ATOL)
    a, b = got["ranks"][0]["weights"], got["ranks"][1]["weights"]
    for name in names:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7, err_msg=name)


# -- the record ---------------------------------------------------------------------------------
def test_the_record_names_the_world_and_its_communication():
    record = distributed.run("transformer", "torch", nproc=2, config="tiny", batch_size=2,
                             warmup=1, steps=2, repeats=1, samplers=False,
                             baseline={"throughput": {"value": 100.0}}, **FAST)
    d = record["distributed"]
    assert record["status"] == "ok" and record["batch_size"] == 4
    assert (d["world_size"], d["per_replica_batch"], d["global_batch"], d["scaling"]) == (2, 2, 4, "weak")
    assert (d["engine"], d["communication"], d["bn_mode"]) == ("DistributedDataParallel", "gloo", "replica")
    assert 0.0 <= d["communication_share"] < 1.0 and d["step_time_local"] > 0
    assert d["speedup"] == pytest.approx(record["throughput"]["value"] / 100.0)
    assert d["efficiency"] == pytest.approx(d["speedup"] / 2)


def test_a_refused_option_is_a_failed_record_and_earlier_records_stay(tmp_path):
    from tbdzoo import suite
    out = str(tmp_path / "runs.jsonl")
    suite.append_record(out, {"schema": "tbdzoo.run/1", "status": "ok", "model": "earlier"})
    records = suite.run_distributed("transformer", "torch", config="tiny",
                                    world=dict(nproc=2, global_batch=5), device="cpu")
    assert records[-1]["status"] == "error"
    assert "--global-batch 5 does not divide among 2 processes" in records[-1]["error"]
    suite.append_record(out, records[-1])
    with open(out) as f:
        lines = [json.loads(line) for line in f]
    assert [r["model"] for r in lines] == ["earlier", "transformer"]


# -- faults -------------------------------------------------------------------------------------
def start_long_run(backend="torch", rank_timeout=60.0, step_timeout=300.0):
    node = Node(backend, nproc=2, device="cpu")
    job = launch.make_job("transformer", backend, node, "train", 2, 4, config="tiny",
                          steps=100000, rank_timeout=rank_timeout, step_timeout=step_timeout)
    return launch.start(job)


def wait_for_steps(run, local_rank, steps, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        events = run.statuses()[local_rank]
        if sum(1 for e in events if e["event"] == "step") >= steps:
            return run.rank_pids()
        if run.process.poll() is not None:  # the run ended first: say why
            run.wait()
            pytest.fail("the run ended before rank {} made {} steps".format(local_rank, steps))
        time.sleep(0.2)
    run.kill()
    pytest.fail("rank {} made no {} steps in {} s".format(local_rank, steps, timeout))


def every_process(run):
    """The agent and every process under it now (ranks, helpers, mpiexec), by psutil."""
    import psutil
    agent = psutil.Process(run.process.pid)
    return [agent.pid] + [p.pid for p in agent.children(recursive=True)]


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is gone for every purpose but its parent's bookkeeping
        with open("/proc/{}/stat".format(pid)) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def assert_nothing_left(run, pids):
    pids = list(pids) + [run.process.pid]
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_a_killed_rank_ends_the_run_naming_it(backend):
    require_framework(backend)
    assert "the other ranks were stopped" in assert_a_killed_rank_is_named(backend)


def assert_a_killed_rank_is_named(backend):
    """SIGKILL rank 1 of a long run: within 30 s the run ends naming it, and no process of the
    run is left. Returns the error's message."""
    run = start_long_run(backend)
    pids = wait_for_steps(run, 1, 2)
    everything = every_process(run)
    os.kill(pids[1], signal.SIGKILL)
    start = time.time()
    with pytest.raises(DistributedError) as info:
        run.wait(timeout=120)
    message = str(info.value)
    assert message.startswith("rank 1 (pid {}) was killed by signal SIGKILL".format(pids[1]))
    assert time.time() - start < 30
    assert_nothing_left(run, everything)
    return message


def assert_a_stopped_rank_is_declared_hung(backend, victim=0, rank_timeout=10.0):
    """SIGSTOP one rank: within --rank-timeout (and the agent's grace) the run ends naming
    that rank, and no process of the run is left (psutil lists them before the stop)."""
    run = start_long_run(backend, rank_timeout=rank_timeout)
    pids = wait_for_steps(run, victim, 2)
    everything = every_process(run)
    os.kill(pids[victim], signal.SIGSTOP)
    start = time.time()
    try:
        with pytest.raises(DistributedError) as info:
            run.wait(timeout=120)
    finally:
        if alive(pids[victim]):  # should the run not have stopped it
            os.kill(pids[victim], signal.SIGCONT)
    message = str(info.value)
    assert message.startswith("rank ") and "(pid {}) stopped responding: no heartbeat".format(
        pids[victim]) in message.splitlines()[0], message
    assert "--rank-timeout {:g} s".format(rank_timeout) in message
    assert time.time() - start < rank_timeout + 30
    assert_nothing_left(run, everything)


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_a_hung_rank_ends_the_run_within_the_rank_timeout(backend):
    require_framework(backend)
    assert_a_stopped_rank_is_declared_hung(backend)


def test_the_report_draws_scaling_from_records_of_several_processes(tmp_path):
    from tbdzoo.profiling import plots

    def record(world, throughput):
        return {"model": "resnet50", "backend": "torch", "precision": "fp32",
                "throughput": {"value": throughput},
                "distributed": {"world_size": world, "per_replica_batch": 32, "scaling": "weak"}}
    records = [record(1, 100.0), record(2, 190.0), record(4, 360.0)]
    colors = plots.backend_colors({"torch"})
    assert plots.plot_scaling(records, colors, str(tmp_path), "scaling.png")
    assert os.path.getsize(str(tmp_path / "scaling.png")) > 1000
    assert plots.plot_scaling(records[:1], colors, str(tmp_path), "none.png") is None


def test_the_command_line_takes_the_placement_flags():
    from tbdzoo.cli import _distributed, parser, world_options
    args = parser().parse_args(["run", "resnet50", "--backend", "torch", "--nproc", "2",
                                "--nnodes", "2", "--node-rank", "1", "--master", "h0:29500",
                                "--hosts", "h0,h1", "--global-batch", "64", "--bn-mode", "replica",
                                "--baseline"])
    assert _distributed(args)
    world = world_options(args)
    assert (world["nproc"], world["nnodes"], world["node_rank"], world["master"], world["hosts"],
            world["global_batch"]) == (2, 2, 1, "h0:29500", ["h0", "h1"], 64)
    plain = parser().parse_args(["run", "resnet50", "--backend", "torch"])
    assert not _distributed(plain)
    with pytest.raises(DistributedError, match="HOST:PORT"):
        distributed.run("resnet50", "torch", nproc=2, master="nohost", device="cpu")


def test_two_nodes_meet_at_the_master_address(tmp_path):
    """--nnodes 2 on one host: each node's agent starts its own rank, rank = node x nproc +
    local rank, and they train together through node 0's address."""
    port = launch.free_port_block(4)
    runs = []
    for node_rank in range(2):
        node = Node("torch", nproc=1, nnodes=2, node_rank=node_rank, master_addr="127.0.0.1",
                    master_port=port, interface="lo")
        job = launch.make_job("transformer", "torch", node, "train", 2, 4, config="tiny",
                              steps=2, weights_path=str(tmp_path / "w-{rank}.npz"), **FAST)
        runs.append(launch.start(job))
    results = [run.wait(timeout=300) for run in runs]
    assert [sorted(r) for r in results] == [["0"], ["1"]]
    from tbdzoo.weights import load_arrays
    a, b = load_arrays(str(tmp_path / "w-0.npz")), load_arrays(str(tmp_path / "w-1.npz"))
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7, err_msg=name)
