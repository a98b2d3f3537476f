"""Timing measures finished work, on the GPU the run uses, for the batch that ran."""
import json
import os
import time

import pytest

import completion_probe
import tbdzoo
from conftest import require_backend, run_in_env
from tbdzoo.backends import environments
from tbdzoo.profiling.timing import time_repeats

# A step that returned with work still queued leaves a large part of its own time to drain
# (MXNet once returned with its backward pass and update queued: 20-70% of the step here);
# a complete one leaves nothing. The median over trials keeps a preempted drain from counting.
QUEUED_AT_MOST = 0.05


def _median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _probe(backend):
    require_backend(backend)
    if environments.importable_here(backend):
        model = tbdzoo.build("resnet50", backend, config="tiny", **completion_probe.OVERRIDES)
        prepared = model.prepare_batch(model.synthetic_batch())
        return completion_probe.probe_model(model, prepared, lambda: model.train_step(prepared))
    probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "completion_probe.py")
    proc = run_in_env(environments.python_for(backend), [probe, backend], timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["tensorflow", "mxnet", "torch", "cntk", "jax"])
def test_a_step_and_every_timed_window_end_with_the_work_done(backend):
    fractions = _probe(backend)
    for moment in ("steps", "first_step", "last_window"):
        assert _median(fractions[moment]) <= QUEUED_AT_MOST, (
            "{}: work was still queued after {}: {}".format(backend, moment, fractions))


# -- the GPU the sampler watches ----------------------------------------------------------------
class FakeNvml:
    """NVML's calls that tbdzoo makes, over GPUs listed in PCI order (NVML's numbering). Each
    GPU reports readings of its own, so a sampler that watches the wrong one is caught."""

    class _Reading:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    def __init__(self, uuids):
        self.uuids = uuids

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= len(self.uuids):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return index

    def nvmlDeviceGetUUID(self, handle):
        return self.uuids[handle]

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU"

    def nvmlSystemGetDriverVersion(self):
        return "580.00"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 13000

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._Reading(gpu=10 * (handle + 1))

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._Reading(used=1000 * (handle + 1))

    def nvmlDeviceGetPowerUsage(self, handle):
        return 100000 * (handle + 1)  # milliwatts

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    def nvmlGpmQueryDeviceSupport(self, handle):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")


UUIDS = ["GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-8c1a0000-aaaa-bbbb-cccc-ddddeeeeffff",
         "GPU-8c1b0000-9999-8888-7777-666655554444"]


@pytest.mark.parametrize("ordinal,uuid,visible,expected", [
    (0, None, None, 0),                                    # nothing hidden: CUDA's order is NVML's
    (1, None, None, 1),
    (3, None, None, None),                                 # no such GPU
    (0, None, "2,0", 2),                                   # indices into the machine's GPUs
    (1, None, "2,0", 0),
    (2, None, "2,0", None),                                # beyond the visible list
    (0, None, "", None),                                   # every GPU hidden
    (0, None, UUIDS[1], 1),                                # a full UUID
    (0, None, " gpu-8C1B ,0", 2),                          # an abbreviated UUID, any case
    (0, None, "GPU-8c1", None),                            # ambiguous: two GPUs begin so
    (0, None, "GPU-ffff", None),                           # no GPU begins so
    (0, "8c1a0000-aaaa-bbbb-cccc-ddddeeeeffff", "2", 1),  # the framework's UUID decides
])
def test_a_cuda_device_is_found_in_nvml_by_uuid(ordinal, uuid, visible, expected):
    from tbdzoo.profiling.gpu import nvml_index
    assert nvml_index(ordinal, uuid, visible, nv=FakeNvml(UUIDS)) == expected


def test_the_sampler_reads_the_gpu_the_run_uses(monkeypatch):
    """profile() on cuda:1 with CUDA_VISIBLE_DEVICES naming GPUs 2 and 0 samples NVML's GPU 0."""
    from tbdzoo.profiling import gpu
    from tbdzoo.profiling import profile as profile_mod
    fake = FakeNvml(UUIDS)
    monkeypatch.setattr(gpu, "_nvml", lambda: fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "{},GPU-0a1b".format(UUIDS[2]))
    monkeypatch.setattr(profile_mod, "framework_device_uuid", lambda framework, ordinal: None)
    require_backend("mxnet")
    model = tbdzoo.build("resnet50", "mxnet", config="tiny")
    model.device = "cuda:1"  # as a run on the second visible GPU sees it; the steps run on the CPU
    record = profile_mod.profile(model, steps=1, warmup=1, repeats=1)
    assert record["gpu"]["index"] == 0 and record["gpu"]["uuid"] == UUIDS[0]
    assert record["gpu"]["power_w"]["median"] == 100.0
    assert record["env"]["gpu_name"] == "Fake GPU"

    monkeypatch.setattr(profile_mod, "framework_device_uuid", lambda framework, ordinal: UUIDS[1][4:])
    record = profile_mod.profile(model, steps=1, warmup=1, repeats=1)
    assert record["gpu"]["index"] == 1 and record["gpu"]["power_w"]["median"] == 200.0


@pytest.mark.gpu
def test_on_a_real_gpu_torch_and_nvml_agree_on_the_device():
    torch = pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    from tbdzoo.profiling.gpu import device_info, framework_device_uuid, nvml_index
    for ordinal in range(torch.cuda.device_count()):
        uuid = framework_device_uuid("torch", ordinal)
        info = device_info(nvml_index(ordinal, uuid))
        assert info["uuid"].lower().endswith(uuid.lower())


# -- FLOPs and analytic memory for the batch that ran ---------------------------------------------
def test_a_profile_counts_the_batch_it_ran():
    from tbdzoo.profiling import flops
    model = tbdzoo.build("resnet50", "torch", config="tiny", device="cpu")
    configured = model.hparams["batch_size"]
    runs = {}
    for size in (configured, 2 * configured + 1):
        batch = model.synthetic_batch(batch_size=size)
        runs[size] = tbdzoo.profile(model, batch=batch, steps=1, warmup=1, repeats=1)
    small, large = runs[configured], runs[2 * configured + 1]
    assert large["batch_size"] == 2 * configured + 1
    assert large["throughput"]["items_per_step"] == 2 * configured + 1
    per_example = flops.forward_per_example(model.spec)
    assert large["flops"]["forward_per_example"] == per_example
    assert large["flops"]["per_step"] * configured == pytest.approx(
        small["flops"]["per_step"] * (2 * configured + 1))
    feature_maps = [r["memory"]["analytic"]["feature_maps"] for r in (small, large)]
    assert feature_maps[1] * configured == feature_maps[0] * (2 * configured + 1)
    weights = [r["memory"]["analytic"]["weights"] for r in (small, large)]
    assert weights[0] == weights[1]  # what does not scale with the batch stays


# -- the Transformer's throughput -------------------------------------------------------------------
def test_transformer_throughput_counts_the_tokens_that_are_not_padding():
    import numpy as np
    model_def = tbdzoo.get_model("transformer")
    hp = model_def.hparams("tiny", pad_id=1, bos_id=0)  # words are ids 3 and up: none is padding
    batch = model_def.synthetic_batch(hp, 5, 0)
    labels = batch["labels"]
    # each row is its words, then EOS, then padding to the end
    sentence_tokens = sum(int(np.argmax(row == hp["eos_id"])) + 1 for row in labels)
    assert sentence_tokens < labels.size and not (labels == 0).any()  # counting zeros would be wrong
    assert model_def.items(hp, batch) == sentence_tokens
    model = tbdzoo.build("transformer", "torch", config="tiny", device="cpu", pad_id=1, bos_id=0)
    assert model.prepare_batch(batch).items == sentence_tokens


# -- repeats of a minimum duration ------------------------------------------------------------------
def test_a_minimum_repeat_time_adds_steps_to_fast_repeats_only():
    """`tbd bench`'s protocol: after the warm-up, untimed steps run until min_repeat_s has
    passed, and as many as ran make each repeat, so a millisecond step is timed over a window of
    about that length; a step as long as the window runs once a repeat, after the warm-up only."""
    model = tbdzoo.build("a3c", "torch", config="cartpole", device="cpu")
    seen = []
    record = tbdzoo.profile(model, steps=1, warmup=2, repeats=3, min_repeat_s=0.3,
                            samplers=False, progress=lambda done, total: seen.append((done, total)))
    protocol = record["protocol"]
    assert protocol["min_repeat_s"] == 0.3 and protocol["repeats"] == 3
    assert protocol["steps"] > 10  # a CartPole step takes milliseconds
    assert protocol["warmup"] == 2 + protocol["steps"]  # those asked for, then those counted
    assert record["step_time"]["n"] == 3
    assert seen[-1] == (protocol["warmup"] + 3 * protocol["steps"],) * 2
    assert [done for done, _ in seen] == list(range(1, seen[-1][0] + 1))
    assert protocol["steps"] * record["step_time"]["median"] >= 0.1  # about 0.3 s a repeat
    seen.clear()
    long = tbdzoo.profile(model, steps=1, warmup=1, repeats=2, min_repeat_s=0.2, samplers=False,
                          progress=lambda done, total: seen.append((done, total)))["protocol"]
    assert long["warmup"] == 1 + long["steps"] and long["steps"] > 5  # no warm-up step to go by
    assert seen[-1] == (long["warmup"] + 2 * long["steps"],) * 2
    plain = tbdzoo.profile(model, steps=2, warmup=2, repeats=2, samplers=False)["protocol"]
    assert (plain["warmup"], plain["steps"], plain["min_repeat_s"]) == (2, 2, 0.0)
    slow = tbdzoo.profile(model, steps=1, warmup=2, repeats=2, min_repeat_s=1e-9,
                          samplers=False)["protocol"]
    assert (slow["warmup"], slow["steps"]) == (2, 1)  # one step already lasted the minimum


# -- the one step timer ---------------------------------------------------------------------------
class _CountingModel:
    """A model whose step takes ``step_s`` and records how it was called."""

    def __init__(self, step_s):
        self.step_s, self.calls = step_s, []

    def synchronize(self):
        self.calls.append("sync")

    def train_step(self, batch, sync=True):
        time.sleep(self.step_s)
        self.calls.append(("step", batch, sync))
        return float(batch)


def test_one_timer_times_the_repeats_of_profiles_and_data_fed_runs():
    """time_repeats is the timed region of both protocols: each run starts and ends on a
    synchronised model with its last step synchronous, and the input's wait is its own share
    (a profile's synthetic batch waits 0; a data-fed batch waits for its pipeline)."""
    model, losses, seen = _CountingModel(0.01), [], []

    def next_input():
        time.sleep(0.01)  # as long as the step: the wait is half of each run
        return len(losses) + 1, 0.01

    per_step, waits, done = time_repeats(model, next_input, 3, 2, losses,
                                         lambda d, t: seen.append((d, t)), done=5, total=11)
    assert done == 11 and seen == [(d, 11) for d in range(6, 12)]
    assert losses == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    run = ["sync", ("step", 1, False), ("step", 2, False), ("step", 3, True), "sync"]
    assert model.calls[:5] == run and len(model.calls) == 10
    assert len(per_step) == 2 and all(0.015 < s < 0.2 for s in per_step)
    assert all(0.1 < w < 0.55 for w in waits)
    _, still, _ = time_repeats(model, lambda: (0, 0.0), 1, 1, [])
    assert still == [0.0]
