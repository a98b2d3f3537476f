"""The version of tbdzoo: one line that any module may import (records name it)."""
__version__ = "0.1.0"
