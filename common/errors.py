"""User-facing errors.

An `InputError` is a problem with what the user gave us (a file, a directory, a
config key, a sample count). The launcher prints it as one line naming the
culprit and exits non-zero, without a traceback: the traceback would point at
our code, while the fault is in the input.
"""

# The exit codes of runs that end on bad input or values (common.run.launch lists every code).
EXIT_INPUT_ERROR = 2        # an InputError, or a sample holding NaN or Inf
EXIT_NON_FINITE_LOSS = 4    # the training loss became NaN or Inf with every input finite (diverged)


class InputError(Exception):
    """Bad input: a corrupt file, a missing key, an indivisible sample count..."""


class ConfigError(InputError):
    """An unknown, missing or ill-typed configuration key."""
