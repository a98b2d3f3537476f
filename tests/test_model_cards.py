"""Every model's card (tbdzoo/models/<name>/): its measured sizes recomputed from the graph,
and the shared code reading the card's fields."""
import pytest

import tbdzoo
from tbdzoo import consistency, suite
from tbdzoo.models import get_model
from tbdzoo.models.card import SHARDING, Consistency, Training
from tbdzoo.pipelines import augment, measure
from tbdzoo.profiling.flops import forward_per_example
from tbdzoo.training import proxies
from tbdzoo.training.distributed import data_parallel_models
from tbdzoo.training.errors import TrainingError
from tbdzoo.training.loop import task_class
from tbdzoo.training.targets import metrics_of, parse_target


@pytest.mark.parametrize("name", tbdzoo.list_models())
def test_measured_sizes_are_the_graphs(name):
    md = get_model(name)
    graph = md.build_graph(md.hparams(md.measured.config))
    assert graph.trainable_count() == md.measured.parameters
    assert forward_per_example(graph) == md.measured.flops_per_example


@pytest.mark.parametrize("name", tbdzoo.list_models())
def test_every_card_is_filled_and_its_proxy_is_a_valid_config(name):
    md = get_model(name)
    training = md.training
    assert training.metrics and metrics_of(name) == training.metrics
    assert parse_target(name, training.target).metric == training.metrics[0]
    base, overrides = proxies.proxy_overrides(name)
    hp = md.hparams(base, **overrides)
    for key, value in overrides.items():
        assert hp[key] == value
    assert md.consistency is not None and name in consistency.cases()
    if training.task is None:
        assert training.run() is not None and task_class(name) is None
        assert training.data_command is None
    else:
        assert task_class(name).data_command == training.data_command
        assert training.data_command.startswith("tbd data make ")


def test_the_shared_code_reads_the_cards():
    assert data_parallel_models() == [m for m in tbdzoo.list_models()
                                      if get_model(m).training.data_parallel]
    assert set(data_parallel_models()) == {"resnet50", "inception_v3", "seq2seq", "transformer",
                                           "deepspeech2"}
    assert get_model("resnet50").training.sharding == SHARDING["image"]
    assert measure.image_models() == ["resnet50", "inception_v3"]
    spec = augment.spec_for_model("inception_v3", get_model("inception_v3").hparams("tiny"))
    assert spec.mean == (0.5, 0.5, 0.5) and spec.std == (0.5, 0.5, 0.5)
    case = consistency.cases()["wgan"]
    assert case.seed == 1 and case.tolerances == get_model("wgan").consistency.tolerances
    assert suite.bench_batch_size("inception_v3", "torch", device="cpu") == 4
    assert suite.bench_overrides("a3c", "torch", device="cpu") == {}


def test_a_model_without_a_training_card_is_refused_by_name(monkeypatch):
    from tbdzoo.models import registry
    with pytest.raises(TrainingError, match="unknown model 'resnet5'"):
        metrics_of("resnet5")
    resnet = get_model("resnet50")
    bare = registry.ModelDef("bare", resnet.domain, {"paper": resnet.configs["paper"]},
                             resnet.build_graph, resnet.synthetic_batch, resnet.unit,
                             resnet.items)
    monkeypatch.setitem(registry._MODELS, "bare", bare)
    with pytest.raises(TrainingError, match="bare has no training task yet: tbd train trains"):
        proxies.proxy_overrides("bare")
    assert "bare" not in data_parallel_models() and "bare" not in consistency.cases()
    assert suite.bench_batch_size("bare", "torch", device="cpu") is None


def test_a_card_is_checked_when_written():
    with pytest.raises(ValueError, match="task class or a runner"):
        Training(metrics=(), target="x=1", eval_every=1, proxy={})
    with pytest.raises(ValueError, match="data_parallel"):
        Training(metrics=(), target="x=1", eval_every=1, proxy={}, task="m:C",
                 data_parallel="rows")
    assert Consistency().tolerances == {} and Consistency(seed=2).seed == 2
