"""The error a data reader or batch builder raises: it names the file or input, and the fix."""
from ..errors import TbdError


class DatasetError(TbdError, ValueError):
    """A data set on disk, or a batch, that is not what the reader or the model expects."""
