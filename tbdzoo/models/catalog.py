"""The models tbdzoo knows: the eight built-in ones (each module registers itself with
registry.py as it is imported, here), the per-node probes, and any registered by the user."""
from typing import List

from ..errors import UnknownNameError
from . import a3c, deepspeech2, faster_rcnn, inception_v3, resnet50, seq2seq, transformer, wgan  # noqa: F401  (registration on import)
from .probes import ALL_PROBES, get_probe
from .registry import _MODELS, ModelDef

__all__ = ["get_model", "list_models", "BUILTIN"]

BUILTIN = ("resnet50", "transformer", "inception_v3", "wgan", "seq2seq", "deepspeech2", "a3c",
           "faster_rcnn")


def get_model(name: str) -> "ModelDef":
    """The definition of a model; ``probe/<node>`` names the per-node test models."""
    if name.startswith("probe/"):
        if name[len("probe/"):] not in ALL_PROBES:
            raise UnknownNameError("probe", name, ["probe/" + p for p in ALL_PROBES])
        return get_probe(name[len("probe/"):])
    if name not in _MODELS:
        raise UnknownNameError("model", name, _MODELS)
    return _MODELS[name]


def list_models() -> List[str]:
    """The built-in models in a fixed order (whatever order their modules were imported in),
    then any registered by the user."""
    return [m for m in BUILTIN if m in _MODELS] + [m for m in _MODELS if m not in BUILTIN]
