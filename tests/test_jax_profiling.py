"""JAX backend's measurements and precisions: memory by category from XLA's analysis of the
compiled step, FLOPs from XLA's cost analysis against the spec's count, tf32 and bf16 (bf16
runs on the CPU in XLA; tf32 there is float32 arithmetic), and the record ``tbd run`` writes."""
import json
import os
import subprocess
import sys

import pytest

from conftest import require_backend, run_in_env
from tbdzoo.backends import environments

pytestmark = pytest.mark.backend

_CHECKS = r"""
import json
import numpy as np
import jax
import jax.numpy as jnp
from flax import nnx
import tbdzoo
out = {}
m = tbdzoo.build("resnet50", config="tiny", backend="jax")
p = m.prepare_batch(m.synthetic_batch())
n = len(m.synthetic_batch()["labels"])
out["resnet_memory"] = m.measure_memory(p)
out["resnet_flops"] = dict(m.measure_flops(p), spec=sum(m.spec.flops().values()) * n)
out["resnet_params"] = [int(v.size) * 4 for v in m.spec.params().values()]
out["resnet_trainable"] = [int(v.size) * 4 for v in m.spec.params().values() if v.trainable]
t = tbdzoo.build("transformer", config="tiny", backend="jax", dropout=0.0)
b = t.synthetic_batch()
out["transformer_flops"] = dict(t.measure_flops(t.prepare_batch(b)),
                                spec=sum(t.spec.flops().values()) * len(b["src"]))
bf = tbdzoo.build("transformer", config="tiny", backend="jax", dropout=0.0, precision="bf16")
bf.set_weights(t.get_weights())
hlo = bf._bound_update(None).lower(bf.prepare_batch(b).native, np.float32(0.1),
                                  bf._step_key()).as_text()
out["bf16_in_step"] = "bf16" in hlo
# the tied output projection (the generator, over the embedding's table) computes in bf16 too
out["bf16_tied_dtype"] = str(bf.native.generator(jnp.ones((2, 3, 16)),
                                                 bf.native.embed.embedding[...]).dtype)
out["bf16_predict_gap"] = float(np.abs(bf.predict(b) - t.predict(b)).max())
out["bf16_losses"] = [bf.train_step(b) for _ in range(2)]
out["bf16_state_dtypes"] = sorted({str(a.dtype) for a in jax.tree.leaves(
    nnx.as_pure(nnx.state((bf.native, bf.optimizer)))) if a.ndim})
from tbdzoo.backends.jax import layers
bn = layers.BatchNorm(3, momentum=0.1, epsilon=1e-5, rngs=nnx.Rngs(0))
x = (jax.random.normal(jax.random.key(0), (4, 3, 5, 5)) + 100.0).astype(jnp.bfloat16)
y = bn(x)
exact = np.asarray(x, np.float32).mean(axis=(0, 2, 3), dtype=np.float64)
out["bn_bf16_dtype"] = str(y.dtype)
out["bn_bf16_running_mean_err"] = float(np.abs(np.asarray(bn.mean[...]) - 0.1 * exact).max())
tf = tbdzoo.build("resnet50", config="tiny", backend="jax", precision="tf32")
tf.set_weights(m.get_weights())
fp = tbdzoo.build("resnet50", config="tiny", backend="jax")
fp.set_weights(m.get_weights())
batch = m.synthetic_batch(seed=2)
out["tf32_vs_fp32"] = [tf.train_step(batch), fp.train_step(batch)]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def checks():
    require_backend("jax")
    proc = run_in_env(environments.python_of("jax"), ["-c", _CHECKS], timeout=900)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    return json.loads(lines[0][len("RESULT "):])


def test_memory_categories_come_from_the_arrays_and_xla(checks):
    m = checks["resnet_memory"]
    # weights (running statistics included) and gradients: exactly the spec's tensors in fp32
    assert m["weights"] == sum(checks["resnet_params"])
    assert m["gradients"] == sum(checks["resnet_trainable"])
    assert m["optimizer_state"] == m["gradients"]  # SGD with momentum: one slot a parameter
    assert m["input_batch"] > 0
    # the peak is the program's footprint by XLA's buffer assignment
    assert m["peak_scope"] == "xla_program"
    assert m["peak"] == (m["xla_arguments"] + m["xla_outputs"] - m["xla_aliased"]
                         + m["xla_temporaries"] + m["xla_generated_code"])
    # donation: the new weights and momentum are written over the old
    assert m["xla_aliased"] >= m["weights"] + m["optimizer_state"]
    assert m["xla_temporaries"] > m["gradients"]
    assert m["device_peak"] is None  # a CPU reports no allocator statistics


def test_xla_flops_agree_with_the_spec(checks):
    # ResNet: convolutions are nearly all of it; XLA counts the elementwise ops (batch norm,
    # ReLU, the residual adds, the loss) its own way: within 5%
    r = checks["resnet_flops"]
    assert r["source"] == "xla_cost_analysis"
    assert r["forward"] == pytest.approx(r["spec"], rel=0.05)
    # backward about twice the forward: the step within 15% of the spec's 3x
    assert r["step"] == pytest.approx(3 * r["spec"], rel=0.15)
    # the tiny Transformer (d_model 16): layer norms, softmaxes, attention masks and the
    # label-smoothed loss, which XLA counts per element, weigh as much as the small matrix
    # products: XLA counts 1.0-1.5x the spec (dropout off: its random bits are XLA FLOPs too)
    t = checks["transformer_flops"]
    assert 1.0 <= t["forward"] / t["spec"] <= 1.5
    assert t["step"] > 2 * t["forward"]


def test_bf16_computes_in_bfloat16_over_float32_master_weights(checks):
    assert checks["bf16_in_step"]
    assert checks["bf16_tied_dtype"] == "bfloat16"
    assert checks["bf16_state_dtypes"] == ["float32"]


def test_bf16_batchnorm_takes_statistics_in_float32_and_returns_bfloat16(checks):
    # inputs near 100, where bfloat16's spacing is 0.5: a mean rounded to bfloat16 is off by
    # up to 0.25 (0.025 in the running mean), one summed in float32 by float32 rounding only
    assert checks["bn_bf16_dtype"] == "bfloat16"
    assert checks["bn_bf16_running_mean_err"] < 1e-5
    assert all(v == v and abs(v) < 1e3 for v in checks["bf16_losses"])
    # the same weights agree with fp32 to bf16's precision (test_execution_options: 0.1)
    assert 0 < checks["bf16_predict_gap"] < 0.1


def test_tf32_on_the_cpu_is_float32_arithmetic(checks):
    tf32, fp32 = checks["tf32_vs_fp32"]
    assert tf32 == pytest.approx(fp32, rel=1e-6)


def test_tbd_run_records_the_xla_memory_breakdown(tmp_path):
    require_backend("jax")
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "tbdzoo.cli", "run", "transformer", "--backend", "jax",
         "--config", "tiny", "--steps", "1", "--warmup", "1", "--repeats", "1",
         "--no-samplers", "-o", str(out)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text().splitlines()[0])
    memory = record["memory"]
    for key in ("weights", "gradients", "optimizer_state", "input_batch"):
        assert memory[key]["source"] == "measured", key
    assert memory["feature_maps"]["source"] == "analytic"
    assert memory["peak"]["scope"] == "xla_program" and memory["peak"]["bytes"] > 0
    assert memory["workspace"]["source"] == "derived"
    assert memory["xla_temporaries"]["bytes"] > 0
    assert "device_peak" not in memory  # none on a CPU
    flops = record["flops"]
    assert flops["measured"]["source"] == "xla_cost_analysis" and flops["measured"]["forward"] > 0
