"""The one exception type of the bench CLI.

A BenchError carries a message meant for the user (it names the option or
file at fault); main() prints it and exits 1 without a traceback.  Anything
else escaping is a bug and keeps its traceback.
"""

from fx100io.errors import Fx100ioMessageError


class BenchError(Fx100ioMessageError):
    """Bad input or a failed job, reported as one line, exit code 1 (errno EIO)."""
