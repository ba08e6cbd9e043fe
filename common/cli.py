"""The `main` wrapper of every command-line tool but train.py (common.run.trainer.main): an
InputError becomes one `error:` line and ExitCode.INPUT_ERROR.
"""

import functools
import sys

from common.errors import ExitCode, InputError


def error_line(error: BaseException) -> str:
    """The one line a person reads for `error`: its text with line breaks and runs of spaces folded."""
    return "error: " + " ".join(str(error).split())


def tool_main(*also: type):
    """Decorates a tool's `main(argv=None) -> int`: an InputError (or one of the exception types
    `also`) becomes one `error:` line on stderr and ExitCode.INPUT_ERROR, instead of a traceback."""
    caught = (InputError, *also)

    def decorate(main):
        @functools.wraps(main)
        def wrapped(argv=None) -> int:
            try:
                return main(argv)
            except caught as e:
                print(error_line(e), file=sys.stderr)
                return ExitCode.INPUT_ERROR

        return wrapped

    return decorate
