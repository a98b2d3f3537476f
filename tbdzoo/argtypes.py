"""Argument types of the ``tbd`` command line. Each reads one option's text or raises
argparse's ArgumentTypeError with a message naming the value and what the option takes, which
argparse prints after the option's name: ``argument --batch-size: 'x' is not a positive integer
(1 or more)``."""
import argparse
import math


def _integer(text, what):
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError("{!r} is not {}".format(text, what)) from None


def _number(text, what):
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("{!r} is not {}".format(text, what))
    return value


def _within(read, text, what, ok):
    """``read(text, what)``'s value if ``ok`` of it, else the message that ``text`` is not ``what``."""
    value = read(text, what)
    if not ok(value):
        raise argparse.ArgumentTypeError("{!r} is not {}".format(text, what))
    return value


def integer(text):
    """Any integer: a seed, a node's rank."""
    return _integer(text, "an integer")


def positive(text):
    """An integer of 1 or more: batch sizes, steps, processes."""
    return _within(_integer, text, "a positive integer (1 or more)", lambda v: v >= 1)


def non_negative(text):
    """An integer of 0 or more: a seed of a made data set, a number of input workers."""
    return _within(_integer, text, "a non-negative integer (0 or more)", lambda v: v >= 0)


def positive_number(text):
    """A finite number above 0: seconds, minutes, TFLOP/s."""
    return _within(_number, text, "a positive number", lambda v: v > 0)


def non_negative_number(text):
    """A finite number of 0 or more."""
    return _within(_number, text, "a number of 0 or more", lambda v: v >= 0)


def names(text):
    """Comma-separated names; blanks dropped."""
    return [t.strip() for t in text.split(",") if t.strip()]


def sizes(text):
    """Comma-separated positive integers: batch sizes."""
    try:
        values = [int(t) for t in names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError("{!r}: batch sizes are comma-separated integers, "
                                         "e.g. 8,16,32".format(text)) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("{!r}: batch sizes must be positive integers, "
                                         "e.g. 8,16,32".format(text))
    return values


def learners(text):
    """Comma-separated integers; the values are checked later, with a message naming the fix."""
    try:
        return [int(t) for t in names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError("{!r}: learners are comma-separated integers, "
                                         "e.g. 1,2,4,8,16".format(text)) from None


def byte_size(text):
    """8G, 512M, 1.5GiB or a number of bytes."""
    units = {"k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    try:
        value = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError("a size like 8G, 512M or a number of bytes, not {!r}"
                                         .format(text))
    return value


def assignment(text):
    """NAME=VALUE as (name, value text)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError("NAME=VALUE, e.g. lr=0.05 or blocks=3,4,6,3, not {!r}"
                                         .format(text))
    return name.strip(), value
