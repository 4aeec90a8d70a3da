"""SIGTERM and SIGINT end a run cleanly: the current step finishes, a checkpoint is written, the process exits.

SLURM sends SIGTERM at a job's time limit (and on ``scancel`` and preemption), then SIGKILL ``KillWait`` seconds later
(30 s by default); a user presses Ctrl-C (SIGINT). Without a handler the first kills the run silently and the second
prints a traceback, and every step since the last periodic checkpoint is lost.

While :func:`stop_on_signals` is active the first SIGTERM or SIGINT only sets a flag. The training loop asks
:meth:`StopRequest.agreed` after each optimizer step; on several ranks the flag is combined over a CPU (gloo) group, so
every rank stops after the same step even if the signal reached them at different moments, and no GPU sync is added.
The loop then saves a checkpoint and raises :class:`Interrupted`; ``dm-train`` exits with ``128 + signal number`` —
**143 for SIGTERM, 130 for SIGINT**, the statuses a shell reports for a process killed by that signal, so SLURM and
Snakemake see a failed job (Snakemake's ``--retries`` and ``scontrol requeue`` rerun it, and the rerun resumes from the
checkpoint). A second SIGINT aborts at once (``KeyboardInterrupt``), for a user who does not want to wait.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from deltamatch.models.train.distributed import Layout

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(Exception):
    """The run stopped on a signal after writing a checkpoint; ``exit_status`` is ``128 + signum``."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    @classmethod
    def after_step(cls, signum: int, step: int, checkpoint) -> Interrupted:
        name = signal.Signals(signum).name
        return cls(signum, f"{name} received: stopped after step {step} with checkpoint {checkpoint}; rerun the same "
                           f"command to resume (exit status {128 + signum})")


class StopRequest:
    """The first SIGTERM/SIGINT this process received (0 while none), and its agreement over ranks."""

    def __init__(self, layout: Layout):
        self.layout, self.signum = layout, 0
        self._group = None
        if layout.sharded:
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")  # CPU-side: asking costs no GPU synchronisation

    def handle(self, signum: int, frame) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt("second SIGINT: aborting without a checkpoint")
        self.signum = self.signum or signum

    def agreed(self) -> int:
        """The signal any rank received (the same answer on every rank; a collective when sharded), or 0."""
        if self._group is None:
            return self.signum
        import torch
        import torch.distributed as dist

        flag = torch.tensor([self.signum], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return int(flag)


@contextlib.contextmanager
def stop_on_signals(layout: Layout) -> Iterator[StopRequest]:
    """Catch SIGTERM/SIGINT into a :class:`StopRequest` for the duration; the previous handlers come back after.
    Outside the main thread (where Python cannot install handlers) the request simply never fires."""
    request = StopRequest(layout)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {sig: signal.signal(sig, request.handle) for sig in SIGNALS}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
