"""Ctrl-C during ``batch run``: always answered, in one place, whenever it comes.

While results are still awaited, the first SIGINT stops the run (``KeyboardInterrupt``,
as Python's own handler raises it). Once every result is written, or once the run
is already stopping, a SIGINT is only counted: the command ends as it was ending, then
says what the signal found (everything written, nothing stopped) and exits 130. A
second Ctrl-C never breaks the message of the first into a traceback, and one that
comes as the process exits leaves its exit code alone.
"""

from __future__ import annotations

import signal
from types import FrameType

__all__ = ["Interrupts"]


class Interrupts:
    """SIGINT while a block runs: raised while ``stopping`` is allowed, counted after."""

    def __init__(self) -> None:
        self.count = 0
        self.raising = True

    @classmethod
    def install(cls) -> Interrupts:
        """Answer SIGINT so from now until the process ends (a command's last lines, its
        summary and its exit included: nothing puts Python's handler back)."""
        interrupts = cls()
        signal.signal(signal.SIGINT, interrupts._on_sigint)
        return interrupts

    def finishing(self) -> None:
        """From now on a Ctrl-C stops nothing: it is counted, and said at the end."""
        self.raising = False

    def settle(self) -> bool:
        """Ignore SIGINT from now on, as the command exits; True when a Ctrl-C came after
        the run could no longer be stopped by it (the caller says so, and exits 130).

        Ignored, not left to Python: as the interpreter ends it puts the default action
        back for a handler of its own, and a Ctrl-C then would kill the process (exit
        status -2) instead of letting it exit with the code it chose.
        """
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return self.count > 0 and not self.raising

    def _on_sigint(self, _signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        if self.raising:
            self.raising = False  # the next one only counts: the first is being answered
            raise KeyboardInterrupt
