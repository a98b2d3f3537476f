"""JAX backend specifics, reached the way users reach it from the main interpreter: through
``tbdzoo.build(..., backend='jax')``, which starts a worker in the JAX environment (.venv-jax).
Cross-framework agreement of all eight models lives in the consistency tests; here: the remote
handle, the Flax NNX tree (printable, callable piecewise, replaceable, saved by Flax's own
serialisation), the Optax optimizers against the reference formulas, the non-finite guard
inside the jitted step. Data-parallel training: tests/test_distributed_jax.py."""
import numpy as np
import pytest

import tbdzoo
from conftest import random_weights, require_backend, run_in_env
from tbdzoo.backends import environments
from tbdzoo.backends.remote import RemoteModel, WorkerHandle
from tbdzoo.errors import NonFiniteStepError

pytestmark = pytest.mark.backend


@pytest.fixture(scope="module")
def resnet():
    """One worker for the tests that need a model (a worker and its first compile take
    seconds)."""
    require_backend("jax")
    model = tbdzoo.build("resnet50", backend="jax", config="tiny")
    yield model
    model.close()


def test_the_model_lives_in_a_worker_holding_an_nnx_tree(resnet):
    assert isinstance(resnet, RemoteModel)
    assert isinstance(resnet.native, WorkerHandle)
    assert resnet.native.native_type == "tbdzoo.backends.jax.native.ResNet"
    assert resnet.native.python == environments.python_of("jax")


def test_it_trains_predicts_and_round_trips_its_weights(resnet, tmp_path):
    batch = resnet.synthetic_batch(seed=1)
    out = resnet.predict(batch)
    assert out.shape == (len(batch["labels"]),) + resnet.spec.shape_of(resnet.spec.output)
    loss, grads = resnet.loss_and_gradients(batch)
    assert np.isfinite(loss) and list(grads) == resnet.trainable_names()
    losses = resnet.train_steps(batch, 3)
    assert all(np.isfinite(losses)) and losses[2] < losses[0]
    weights = random_weights(resnet)
    resnet.set_weights(weights)
    got = resnet.get_weights()
    assert list(got) == list(resnet.spec.params())
    for key, value in got.items():
        np.testing.assert_array_equal(value, weights[key])
    resnet.save_weights(tmp_path / "w.npz")
    resnet.load_weights(tmp_path / "w.npz")
    np.testing.assert_array_equal(resnet.get_weights()["fc.weight"], weights["fc.weight"])


def test_a_non_finite_step_is_skipped_inside_the_jitted_step(resnet):
    batch = resnet.synthetic_batch(seed=2)
    trainable = set(resnet.trainable_names())
    huge = {k: (np.full_like(v, 3e38) if k in trainable else v)
            for k, v in resnet.get_weights().items()}
    resnet.set_weights(huge)
    steps = resnet.step_count
    with pytest.raises(NonFiniteStepError, match="came out non-finite"):
        resnet.train_step(batch)
    assert resnet.step_count == steps
    for key, value in resnet.get_weights().items():
        np.testing.assert_array_equal(value, huge[key])


_NATIVE_TREE = r"""
import numpy as np
from flax import nnx
import flax.serialization
from tbdzoo.backends.registry import build_native
from tbdzoo.backends.jax import layers

m = build_native("resnet50", "jax", config="tiny")
net = m.native
assert isinstance(net, nnx.Module) and type(net).__name__ == "ResNet"
block = getattr(net.layer1, "0")
assert type(block).__name__ == "Bottleneck", type(block)
assert isinstance(block.conv1, nnx.Conv) and isinstance(block.bn1, nnx.BatchNorm)
assert isinstance(net.fc, nnx.Linear)
text = repr(net)
assert "Bottleneck(" in text and "Conv(" in text, text[:400]

# callable piecewise: one block on its own input, as the whole model computes it
batch = m.synthetic_batch(seed=0)
x = np.asarray(batch["images"], np.float32)
values = m.values(batch, [block.input_names[0], block.output_names[0]])
out = np.asarray(block(values[block.input_names[0]]))
np.testing.assert_allclose(out, values[block.output_names[0]], rtol=1e-5, atol=1e-5)

# Flax's own serialisation of the state round-trips the canonical weights
before = m.get_weights()
saved = flax.serialization.msgpack_serialize(nnx.state(net).to_pure_dict())
m.set_weights({k: v * 0 for k, v in before.items()})
restored = nnx.state(net)
restored.replace_by_pure_dict(flax.serialization.msgpack_restore(saved))
nnx.update(net, restored)
for k, v in m.get_weights().items():
    np.testing.assert_array_equal(v, before[k])

# replaceable: a new classifier head takes part in the next prediction and the next step
m.train_step(batch)              # the step's cached walk of the tree exists from here
first = m.predict(batch)
net.fc = nnx.Linear(net.fc.in_features, net.fc.out_features, rngs=nnx.Rngs(5))
assert not np.allclose(m.predict(batch), first)
kernel = np.asarray(net.fc.kernel.value).copy()
m.train_step(batch)
assert not np.allclose(np.asarray(net.fc.kernel.value), kernel), "the new head was not trained"

# so does a layer replaced deep inside a stage, and a layer's changed setting
last = getattr(net.layer2, "0")
replaced = last.conv2 = nnx.clone(last.conv2)
kernel = np.asarray(replaced.kernel[...]).copy()
m.train_step(batch)
assert not np.allclose(np.asarray(replaced.kernel[...]), kernel), "the new layer was not trained"
m.train_step(batch, sync=False)
m.synchronize()
replaced.feature_group_count = 2    # the next step traces the layer anew, and fails on it
try:
    m.train_step(batch)
except Exception as error:
    assert "group" in str(error), error
else:
    raise AssertionError("the step did not trace the changed layer anew")
replaced.feature_group_count = 1
m.train_step(batch)

# the tree stays the trained model: a layer held across steps (queued ones too) reads the
# trained values, and a weight set through the tree between steps is where the next starts
conv = block.conv1
held = np.asarray(conv.kernel[...]).copy()
m.train_step(batch)
m.train_step(batch, sync=False)
m.synchronize()
trained = np.asarray(conv.kernel[...])
assert np.isfinite(trained).all() and not np.allclose(trained, held)
conv.kernel[...] = conv.kernel[...] * 0.5
m.train_step(batch)
after = np.asarray(conv.kernel[...])
assert np.linalg.norm(after - 0.5 * trained) < np.linalg.norm(after - trained), \
    "the step did not start from the weight set through the tree"

# the Transformer's output projection reads the embedding table
t = build_native("transformer", "jax", config="tiny")
assert isinstance(t.native.generator, layers.TiedLinear), type(t.native.generator)
tb = t.synthetic_batch(seed=0)
out = t.predict(tb)
w = t.get_weights()
w["embed.weight"] = w["embed.weight"] * 2
t.set_weights(w)
assert not np.allclose(t.predict(tb), out)
print("native tree ok")
"""


def test_the_native_model_is_a_flax_nnx_tree_of_the_canonical_paths():
    require_backend("jax")
    proc = run_in_env(environments.python_of("jax"), ["-c", _NATIVE_TREE], timeout=600)
    assert proc.returncode == 0 and "native tree ok" in proc.stdout, proc.stdout + proc.stderr


_OPTIMIZER_CHECK = r"""
import numpy as np
import jax.numpy as jnp
from tbdzoo.backends.jax import optimizers
from tbdzoo.reference.optimizers import Optimizer, clip_gradients
rng = np.random.RandomState(0)
w0 = rng.standard_normal(7).astype(np.float32)
grads = [rng.standard_normal(7).astype(np.float32) * 3 for _ in range(3)]
rates = [0.1, 0.05, 0.02]
cases = [
    ({"optimizer": "sgd", "momentum": 0.9, "nesterov": False, "weight_decay": 1e-2}, None),
    ({"optimizer": "sgd", "momentum": 0.9, "nesterov": True, "weight_decay": 0.0}, None),
    ({"optimizer": "adam", "beta1": 0.9, "beta2": 0.98, "eps": 1e-8, "weight_decay": 1e-3},
     {"kind": "global_norm", "value": 1.0}),
    ({"kind": "rmsprop", "alpha": 0.9, "eps": 1e-3, "momentum": 0.5, "centered": True,
      "weight_decay": 0.0}, {"kind": "value", "value": 2.0}),
    ({"kind": "rmsprop", "alpha": 0.99, "eps": 0.1, "momentum": 0.0, "centered": False,
      "weight_decay": 1e-2}, None),
]
for hp, clip in cases:
    if "kind" in hp:
        tx = optimizers.make_group({"optimizer": hp, "clip": clip})
    elif clip is None:
        tx = optimizers.make(hp)
    else:
        tx = optimizers.make_group({"optimizer": dict(hp, kind=hp["optimizer"]), "clip": clip})
    params, ref, ref_w = {"w": jnp.asarray(w0)}, Optimizer(hp), w0.astype(np.float64)
    state = tx.init(params)
    for g, lr in zip(grads, rates):
        updates, state = tx.update({"w": jnp.asarray(g)}, state, params, learning_rate=lr)
        params = {"w": params["w"] + updates["w"]}
        ref_w = ref.step(ref_w, clip_gradients([g], clip)[0], lr)
        np.testing.assert_allclose(np.asarray(params["w"]), ref_w, rtol=2e-6, atol=2e-6,
                                   err_msg=str(hp))
print("optimizers ok")
"""


def test_the_optax_optimizers_compute_the_reference_formulas():
    """SGD (momentum, Nesterov, coupled decay), Adam after global-norm clipping, RMSProp
    (centred, epsilon inside the root, the rate inside the momentum) after value clipping:
    three steps at changing rates equal the float64 reference's."""
    require_backend("jax")
    proc = run_in_env(environments.python_of("jax"), ["-c", _OPTIMIZER_CHECK], timeout=300)
    assert proc.returncode == 0 and "optimizers ok" in proc.stdout, proc.stdout + proc.stderr


_RECURRENCE_CHECK = r"""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tbdzoo.backends.jax import recurrent as R

x = jax.random.normal(jax.random.PRNGKey(1), (3, 9, 5))
lengths = jnp.array([9, 4, 6])
for op in ("gru", "lstm"):
    for bidirectional in (True, False):
        module = R.Recurrent(op, 5, {"num_layers": 1, "bidirectional": bidirectional,
                                     "merge": "concat", "units": 7}, nnx.Rngs(0))
        cells = [getattr(module.l0, d) for d in module.directions]
        w = jax.random.normal(jax.random.PRNGKey(2), (len(cells), 3, 9, 7))
        graphdef, state = nnx.split(cells)
        def loss(state, x, run):
            ys = run(nnx.merge(graphdef, state), x)
            return sum((y * w[i]).sum() for i, y in enumerate(ys))
        want = jax.value_and_grad(loss, argnums=(0, 1))(
            state, x, lambda c, x: R.plain_scan(c, x, lengths))
        for loop in (R.Loop(1, 1), R.Loop(2, 16), R.LOOP):
            got = jax.value_and_grad(loss, argnums=(0, 1))(
                state, x, lambda c, x: R._run(c, x, lengths, loop))
            for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-6,
                                           err_msg="{} {} {}".format(op, bidirectional, loop))
print("recurrence ok")
"""


def test_the_recurrences_derivative_is_jaxs_derivative_of_the_plain_scan():
    """A recurrent layer runs both directions in one loop with its own derivative (the kernels'
    gradient one product after the loop, the gates padded, several steps an iteration): its
    outputs and the gradients of its weights and input equal JAX's derivative of one plain scan
    a direction, for GRU and LSTM, one and two directions, ragged lengths, and unrolling that
    does not divide the steps."""
    require_backend("jax")
    proc = run_in_env(environments.python_of("jax"), ["-c", _RECURRENCE_CHECK], timeout=300)
    assert proc.returncode == 0 and "recurrence ok" in proc.stdout, proc.stdout + proc.stderr


_QUEUED_STEPS = r"""
import numpy as np
from tbdzoo.backends.registry import build_native
from tbdzoo.errors import NonFiniteStepError

m = build_native("resnet50", "jax", config="tiny")
batch = m.synthetic_batch(seed=0)
prepared = m.prepare_batch(batch)
assert m.train_step(prepared, sync=False) is None       # queued: the loss is not read back
m.synchronize()
assert m.step_count == 1
trainable = set(m.trainable_names())
huge = {k: (np.full_like(v, 3e38) if k in trainable else v) for k, v in m.get_weights().items()}
m.set_weights(huge)
m.train_step(prepared, sync=False)
m.train_step(prepared, sync=False)
try:
    m.synchronize()
    raise SystemExit("no error at synchronize")
except NonFiniteStepError as error:
    assert error.step == 2 and "2 of the steps queued" in str(error), str(error)
assert m.step_count == 1
for k, v in m.get_weights().items():
    np.testing.assert_array_equal(v, huge[k])
print("queued steps ok")
"""


def test_queued_steps_report_a_skipped_step_at_the_next_synchronisation():
    """Timed loops queue steps with sync=False (the loss stays on the device); a non-finite
    one is skipped inside the jitted step and raised when the model synchronises."""
    require_backend("jax")
    proc = run_in_env(environments.python_of("jax"), ["-c", _QUEUED_STEPS], timeout=600)
    assert proc.returncode == 0 and "queued steps ok" in proc.stdout, proc.stdout + proc.stderr


_NO_RECOMPILES = r"""
import jax.monitoring
from tbdzoo.backends.registry import build_native

compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kw: compiles.append(event)
    if event == "/jax/core/compile/backend_compile_duration" else None)
for name in ("faster_rcnn", "wgan"):
    m = build_native(name, "jax", config="tiny", device="cpu")
    prepared = m.prepare_batch(m.synthetic_batch(seed=0))
    m.train_step(prepared)
    m.train_step(prepared)
    before = len(compiles)
    for _ in range(3):
        m.train_step(prepared)
    assert len(compiles) == before, (name, len(compiles) - before)
print("no recompiles ok")
"""


def test_a_training_programs_steps_compile_once():
    """A program's step restores its state through ``nnx.update``, which gives every module
    Flax's new bookkeeping object; the tree is the same and the steps run the programs
    compiled by the first ones (they were compiled again every step)."""
    require_backend("jax")
    proc = run_in_env(environments.python_of("jax"), ["-c", _NO_RECOMPILES], timeout=600)
    assert proc.returncode == 0 and "no recompiles ok" in proc.stdout, proc.stdout + proc.stderr


_ROI_ALIGN_CHECK = r"""
import numpy as np
import jax, jax.numpy as jnp
from tbdzoo.backends.jax import ops
from tbdzoo.models.faster_rcnn.detection.roi_align import roi_align_numpy, roi_align_points
rng = np.random.RandomState(0)
n, c, h, w, oh, ow, sr = 2, 5, 9, 7, 3, 2, 2
a = {"output_size": (oh, ow), "sampling_ratio": sr}
features = rng.standard_normal((n, c, h, w)).astype(np.float32)
def rois():   # 4 boxes (x1, y1, x2, y2) in the map, some reaching past its edge
    x, y, bw, bh = (rng.uniform(0, 1, (4, 4)) * [w, h, w, h]).T
    return np.stack([x, y, x + bw, y + bh], axis=1).astype(np.float32)
taps = [roi_align_points(rois(), (h, w), 1.0, (oh, ow), sr, True) for _ in range(n)]
idx = np.stack([t[0] for t in taps])
wt = np.stack([t[1] for t in taps])
out = np.asarray(ops.roi_align((jnp.asarray(features), jnp.asarray(idx), jnp.asarray(wt)), None, a, None))
ref = np.stack([roi_align_numpy(features[i], idx[i], wt[i], (oh, ow), sr) for i in range(n)])
np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
# backward: the transpose of the taps' sum, against JAX's own derivative of the plain gather
def plain(f):
    def one(flat, i, ww):
        return jnp.transpose((flat[:, i] * ww[None]).sum(axis=-1), (1, 0, 2))
    o = jax.vmap(one)(f.reshape(n, c, -1), jnp.asarray(idx), jnp.asarray(wt))
    return o.reshape(n, idx.shape[1], c, oh, ow, sr * sr).mean(axis=-1)
cot = jnp.asarray(rng.standard_normal(out.shape).astype(np.float32))
ours = jax.vjp(lambda f: ops.roi_align((f, jnp.asarray(idx), jnp.asarray(wt)), None, a, None),
               jnp.asarray(features))[1](cot)[0]
theirs = jax.vjp(plain, jnp.asarray(features))[1](cot)[0]
np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-5)
# bf16 features: bf16 out and gradient, summed in float32 (within bf16's rounding of fp32's)
fb = jnp.asarray(features).astype(jnp.bfloat16)
yb, pull = jax.vjp(lambda f: ops.roi_align((f, jnp.asarray(idx), jnp.asarray(wt)), None, a, None), fb)
gb = pull(cot.astype(jnp.bfloat16))[0]
assert yb.dtype == jnp.bfloat16 and gb.dtype == jnp.bfloat16, (yb.dtype, gb.dtype)
np.testing.assert_allclose(np.asarray(yb, np.float32), ref, atol=0.05)
np.testing.assert_allclose(np.asarray(gb, np.float32), np.asarray(theirs), atol=0.1)
print("roi_align ok")
"""


def test_roi_align_sums_the_reference_taps_and_scatters_them_back():
    """The JAX RoIAlign (a loop over each bin's taps with its own derivative) gives the NumPy
    reference's output and, backward, JAX's derivative of the plain gather of every tap; bf16
    features give bf16 results within bf16's rounding."""
    require_backend("jax")
    proc = run_in_env(environments.python_of("jax"), ["-c", _ROI_ALIGN_CHECK], timeout=300)
    assert proc.returncode == 0 and "roi_align ok" in proc.stdout, proc.stdout + proc.stderr
