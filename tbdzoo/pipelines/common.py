"""What every framework's pipeline shares: the arguments it checks, and the error that names
the file when a framework's decoder fails with a message that does not."""
from ..datasets.errors import DatasetError
from ..datasets.imagenet import decode_jpeg

__all__ = ["check_source", "decoder_failure", "pillow_error"]


def check_source(source, batch_size, workers, prefetch):
    if getattr(source, "task", None) != "image_classification":
        raise DatasetError("{!r} holds {} examples; the image pipelines build image "
                           "classification batches".format(source, getattr(source, "task", None)))
    if batch_size < 1 or workers < 0 or prefetch < 1:
        raise ValueError("batch_size >= 1, workers >= 0 and prefetch >= 1 are needed; got {}, "
                         "{}, {}".format(batch_size, workers, prefetch))


def pillow_error(source, index):
    """The DatasetError Pillow's reading of example ``index`` raises, or None if it reads."""
    try:
        decode_jpeg(source.describe(index), source.read_bytes(index))
    except DatasetError as named:
        return named
    return None


def decoder_failure(source, index, error):
    """A DatasetError for example ``index`` whose decoding by a framework raised ``error``:
    Pillow's reading of the file says what is wrong where it can, else the framework's words
    are kept with the file's name."""
    path = source.describe(index)
    named = pillow_error(source, index)
    if named is not None:
        return named
    return DatasetError("{}: the framework's decoder failed ({}: {}) though Pillow reads the "
                        "file; re-encode it as a baseline JPEG".format(path, type(error).__name__,
                                                                     error))
