"""User-facing errors.

An `InputError` is a problem with what the user gave us (a file, a directory, a
config key, a sample count). The launcher prints it as one line naming the
culprit and exits non-zero, without a traceback: the traceback would point at
our code, while the fault is in the input.
"""


class InputError(Exception):
    """Bad input: a corrupt file, a missing key, an indivisible sample count..."""


class ConfigError(InputError):
    """An unknown, missing or ill-typed configuration key."""
