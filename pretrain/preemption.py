"""Stop signals and the time each one leaves to save (``faults.grace_seconds``, ``faults.warning_seconds``).

Two signals ask a rank to stop, and each leaves its own time:

* SIGTERM comes from a launcher or scheduler that kills with SIGKILL a grace period later: torchrun and the
  deepspeed launcher after 30 s (torchrun's ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``), Slurm after ``KillWait`` (30 s by
  default), Kubernetes after the pod's ``terminationGracePeriodSeconds``. That grace is ``faults.grace_seconds``,
  counted from the first SIGTERM, also when a SIGUSR1 came before it.
* SIGUSR1 is Slurm's warning (``--signal=USR1@N``): N seconds before the time limit, which then sends SIGTERM and
  KillWait later SIGKILL. N is ``faults.warning_seconds``; 0 means unknown: the stop waits for the step boundary.

``StopFlag`` records the signals for the loop, which saves at the next step boundary, or earlier when that
boundary is out of reach of the signal's time (``pretrain.loop``; ``time_left`` is the rule every rank applies to
the same numbers). A watcher thread, woken by the signal itself even while the main thread is inside a long kernel
or a collective, does the two things that cannot wait for the loop:

* a second SIGTERM ends the rank at once (``STOPPED``), saving nothing: every file a checkpoint publishes appears
  by an atomic rename (the ``COMPLETE`` marker, the export, summary.json), so what exists is whole or absent;
* when ``DEADLINE_SHARE`` of the grace has passed since the first SIGTERM and no save has begun (a single
  micro-batch or a collective outlasts it), one line says so and the rank exits without a checkpoint
  (``OUT_OF_GRACE``) rather than be killed in silence. A SIGUSR1 alone never ends a rank: what follows its warning
  is a SIGTERM, with the grace still to come, not a SIGKILL.

``faults.grace_seconds: 0`` means no grace is known: a SIGTERM waits for the step boundary, as it always did.
"""
from __future__ import annotations

import math
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

STOPPED = 143        # 128 + SIGTERM: a second SIGTERM stopped the rank at once; nothing was saved
OUT_OF_GRACE = 124   # the grace ran out before a checkpoint could begin; nothing was saved
# A rank plans to have saved within this share of a signal's time: the launcher's clock started before the signal
# reached the rank, and a step's time varies.
GRACE_SHARE = 0.8
DEADLINE_SHARE = 0.9  # the watcher gives up on a checkpoint that has not begun by then (SIGTERM's grace only)
_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
_KEYS = {signal.SIGTERM: "faults.grace_seconds", signal.SIGUSR1: "faults.warning_seconds"}
_QUIT = 0  # written to the wake-up pipe by restore(); no signal has number 0


class StopFlag:
    """Set by SIGUSR1/SIGTERM while installed; acted on by the loop (at the next step boundary, or at a micro-batch
    boundary when the step outlasts the signal's time), and by a watcher thread for a second SIGTERM or a grace
    that ran out (module docstring). ``clock`` is ``time.monotonic``; the tests pass their own."""

    def __init__(self, grace_seconds: float = 0.0, warning_seconds: float = 0.0, *, rank: int = 0,
                 checkpoints: Path | str | None = None, clock: Callable[[], float] = time.monotonic):
        self.signal: int | None = None           # the first stop signal
        self.grace, self.warning = float(grace_seconds), float(warning_seconds)
        self.rank, self.checkpoints, self.clock = rank, checkpoints, clock
        self.seen: dict[int, float] = {}         # the clock at the first signal of each kind
        self.terms = 0                           # SIGTERMs seen by the watcher
        self.saving = False                      # a save after the stop has begun: the deadline no longer applies
        self._previous: dict = {}
        self._pipe: tuple[int, int] | None = None
        self._previous_fd = -1
        self._watcher: threading.Thread | None = None

    @classmethod
    def of(cls, faults, **kwargs) -> StopFlag:
        """From the config's ``faults`` section (``pretrain.config.FaultConfig``)."""
        return cls(faults.grace_seconds, faults.warning_seconds, **kwargs)

    def install(self) -> StopFlag:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in _SIGNALS}
        read, write = os.pipe()
        os.set_blocking(write, False)  # a signal handler must never block on a full pipe
        self._pipe = (read, write)
        # The interpreter writes each signal's number here from the C handler, at once, even while the main thread
        # is inside a kernel or a collective that runs no Python for minutes.
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, name="stop-signal-watcher", daemon=True)
        self._watcher.start()
        return self

    def _handle(self, signum, _frame):
        self.note(signum)

    def note(self, signum: int) -> None:
        """Record a stop signal; the handler and the watcher both call this, so it must be idempotent."""
        if self.signal is None:
            self.signal = signum
        self.seen.setdefault(signum, self.clock())

    def governing(self) -> int | None:
        """The signal whose time applies now: the first SIGTERM once there is one, else SIGUSR1; None before both."""
        return next((sig for sig in (signal.SIGTERM, signal.SIGUSR1) if sig in self.seen), None)

    def allowed(self, signum: int) -> float:
        """The seconds ``signum`` leaves to save (0: unknown)."""
        return self.grace if signum == signal.SIGTERM else self.warning

    def elapsed(self) -> float:
        """Seconds since the governing signal arrived (0 before one)."""
        signum = self.governing()
        return 0.0 if signum is None else self.clock() - self.seen[signum]

    def left(self) -> float:
        """Seconds left to have saved by (``GRACE_SHARE`` of the governing signal's time); inf when none is known."""
        signum = self.governing()
        if signum is None or self.allowed(signum) <= 0:
            return math.inf
        return GRACE_SHARE * self.allowed(signum) - self.elapsed()

    def begin_save(self) -> None:
        """The loop calls this as it starts the save that answers the stop: from now on only a second SIGTERM
        ends the rank early."""
        self.saving = True

    def deadline_in(self) -> float | None:
        """Seconds until the watcher gives up on a checkpoint (``OUT_OF_GRACE``); None when it never will: no
        SIGTERM yet, no grace known, or a save has begun."""
        if signal.SIGTERM not in self.seen or self.grace <= 0 or self.saving:
            return None
        return max(0.0, self.seen[signal.SIGTERM] + DEADLINE_SHARE * self.grace - self.clock())

    def on_signal(self, signum: int) -> tuple[int, str] | None:
        """The watcher heard ``signum``: (status, line) when the rank must end at once."""
        if signum in _SIGNALS:
            self.note(signum)
        if signum == signal.SIGTERM:
            self.terms += 1
            if self.terms >= 2:
                return STOPPED, (f"a second SIGTERM: stopping at once, saving nothing (exit {STOPPED}); "
                                 f"{self._where()}")
        return None

    def on_timeout(self) -> tuple[int, str] | None:
        """The watcher's wait for ``deadline_in`` ran out: (status, line) when the rank must end now."""
        remaining = self.deadline_in()
        if remaining is None or remaining > 0:
            return None
        return OUT_OF_GRACE, (
            f"SIGTERM {self.clock() - self.seen[signal.SIGTERM]:.0f} s ago and no checkpoint could begin within "
            f"faults.grace_seconds={self.grace:g} (a micro-batch or a collective outlasts it): exiting without a "
            f"checkpoint (exit {OUT_OF_GRACE}); {self._where()}; to save on a stop, raise the launcher's grace and "
            "faults.grace_seconds together, or use smaller micro-batches")

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._previous_fd)
        read, write = self._pipe
        try:
            os.write(write, bytes([_QUIT]))
        except OSError:
            pass
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        os.close(read)
        os.close(write)
        self._pipe, self._watcher = None, None

    def _watch(self) -> None:
        read = self._pipe[0]
        while True:
            ready, _, _ = select.select([read], [], [], self.deadline_in())
            if not ready:
                ending = self.on_timeout()
                if ending:
                    self._exit(*ending)
                continue
            data = os.read(read, 512)
            if self._previous_fd >= 0:  # someone else's wake-up pipe: it still hears its signals
                try:
                    os.write(self._previous_fd, data)
                except OSError:
                    pass
            for signum in data:
                if signum == _QUIT:
                    return
                ending = self.on_signal(signum)
                if ending:
                    self._exit(*ending)

    def _where(self) -> str:
        return f"--resume continues from the newest complete checkpoint in {self.checkpoints or 'output_dir'}"

    def _exit(self, status: int, message: str) -> None:
        # Straight to the file descriptor: the logging module's locks may be held by the thread we leave behind.
        os.write(2, f"[rank {self.rank}] {message}\n".encode())
        os._exit(status)


# ---------------------------------------------------------------------------- the decision every rank shares

def probe(stop: StopFlag, rank: int) -> list[float]:
    """This rank's part of a probe, summed over the ranks by an all-reduce: whether it saw a stop signal and whether
    a SIGTERM, then, from rank 0 only, the same two and its seconds left (``StopFlag.left``; inf: no limit)."""
    mine = [float(stop.signal is not None), float(signal.SIGTERM in stop.seen)]
    return mine + (mine + [stop.left()] if rank == 0 else [0.0, 0.0, 0.0])


def time_left(summed: Sequence[float], *, grace: float, warning: float) -> tuple[int | None, float]:
    """From a probe summed over the ranks, the same on every rank: the signal whose time applies (SIGTERM once any
    rank has one, else SIGUSR1; None before any) and the seconds left to have saved, by rank 0's clock. A signal
    that rank 0 has not seen yet reached another rank just now: its whole time is left. inf: no limit known."""
    signalled, terms, zero_signalled, zero_terms, zero_left = summed
    if signalled <= 0:
        return None, math.inf
    signum = signal.SIGTERM if terms > 0 else signal.SIGUSR1
    if (zero_terms if signum == signal.SIGTERM else zero_signalled) > 0:
        return signum, zero_left
    seconds = grace if signum == signal.SIGTERM else warning
    return signum, GRACE_SHARE * seconds if seconds > 0 else math.inf


def key_of(signum: int) -> str:
    """The config key that holds ``signum``'s time."""
    return _KEYS[signum]


class StepStarts:
    """The loader as the loop reads it, remembering where each step began: the data position and, from
    ``rng_state``, every random generator. A step abandoned on a stop is saved as not begun, so that the resumed run
    replays it exactly."""

    def __init__(self, loader, rng_state: Callable[[], dict]):
        self.loader, self._rng_state = loader, rng_state
        self.position: dict | None = None
        self.rng: dict | None = None

    def next_step(self):
        self.position, self.rng = self.loader.state_dict(), self._rng_state()
        return self.loader.next_step()
