"""The one place a stop signal becomes ``Interrupted``: for the whole ``python -m harness run`` command.

Ctrl-C (SIGINT), a CI cancel or ``timeout`` (SIGTERM) and a closed terminal (SIGHUP) all end
the command the same way, at whatever stage it is (checks, rank start, training, the host
reference, the report): ``Interrupted`` is raised where the command is, its handlers end every
process and write what was measured, and the command exits 128 + the signal's number.
The first signal raises; every later one is noted on stderr and ignored, so a second Ctrl-C
while the first is handled loses nothing already measured. Inside ``deferred()`` (a report
being written) even the first waits until the block has ended, and inside an ``import`` until the
import has ended (``inside_an_import`` says why).
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager, nullcontext

#: Signals that stop the command: Ctrl-C, a CI cancel or ``timeout``, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """The launcher was told to stop (a signal or Ctrl-C); ``result`` keeps the steps run so far.

    A BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int, result=None) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.result = result

    @property
    def exit_code(self) -> int:
        """The shell convention for death by a signal: 128 + its number."""
        return 128 + self.signum


class StopSignals:
    """The handler ``stop_signals_raise`` installs: raise once, then note and ignore."""

    def __init__(self) -> None:
        #: Every stop signal received, in order.
        self.received: list[int] = []
        self._deferring = 0
        self._pending: int | None = None

    def handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            # os.write, not print: a handler may run while the main code is inside a write to stderr.
            os.write(
                2,
                f"{signal.Signals(signum).name} ignored: still ending the run and writing "
                "what was measured\n".encode(),
            )
            return
        if self._deferring:
            self._pending = signum
            return
        if inside_an_import(frame):
            self._pending = signum
            self._retry_after_the_import()
            return
        raise Interrupted(signum)

    def _retry_after_the_import(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, IMPORT_RETRY_S)  # SIGALRM: ``retry``

    def retry(self, _alarm: int, frame) -> None:
        """SIGALRM's handler: raise the stop that came during an import once the import has ended."""
        if self._pending is None:
            return
        if inside_an_import(frame):
            self._retry_after_the_import()
            return
        if not self._deferring:  # else deferred() raises it at the block's end
            signum, self._pending = self._pending, None
            raise Interrupted(signum)

    def cancel_retry(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    @contextmanager
    def deferred(self):
        """Within the block a stop signal waits; it is raised once the block has ended (a report is never half written)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if not self._deferring and self._pending is not None:
            signum, self._pending = self._pending, None
            raise Interrupted(signum)


#: How often a stop that came during an import looks again whether the import has ended.
IMPORT_RETRY_S = 0.05


def inside_an_import(frame) -> bool:
    """Whether ``frame`` runs inside an ``import``: a stop raised there waits for the import to end.

    torch's C init imports numpy and swallows what numpy's import raises: an ``Interrupted`` raised
    there is lost, numpy is left half-initialised, and the run dies later on "cannot load module
    more than once per process" (a clean-clone CI, Ctrl-C during the checks' import of torch).
    """
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


_ACTIVE: StopSignals | None = None


@contextmanager
def stop_signals_raise():
    """Within the block, SIGINT/SIGTERM/SIGHUP raise ``Interrupted`` once (so ``finally`` runs); yields the handler.

    Python's default for SIGTERM ends the process without running any ``finally``
    (torchrun and its ranks would train on), and its SIGINT raises KeyboardInterrupt
    again on every Ctrl-C, in the middle of the handling of the first.
    """
    global _ACTIVE
    stops, outer = StopSignals(), _ACTIVE
    previous = {sig: signal.signal(sig, stops.handle) for sig in STOP_SIGNALS}
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, stops.retry)
    _ACTIVE = stops
    try:
        yield stops
    finally:
        _ACTIVE = outer
        stops.cancel_retry()
        for sig, old in previous.items():
            signal.signal(sig, old)


def deferred():
    """``StopSignals.deferred`` of the command's handler; a no-op outside ``stop_signals_raise``."""
    return _ACTIVE.deferred() if _ACTIVE is not None else nullcontext()
