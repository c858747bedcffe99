"""blkps.torch.early_stopping: stopping a job together. stop_requested()
and request_stop() read and send the control LUN's stop; EarlyStopping
averages a metric over the ranks so that every rank decides the same, and
drains the session's optimizer when it stops."""

import torch

from blkps import metrics as _metrics
from blkps.control import open_control as _open_control
from blkps.torch import session
from blkps.torch.collectives import Max, allgather, allreduce
from blkps.torch.session import rank, the_job as _the_job


def _local_stop_flag():
    """The control LUN's counters' stop (one 4 KiB read); False without a
    control LUN."""
    job = _the_job()
    if not job.control:
        return False
    if job.stop_reader is None:
        job.stop_reader = _open_control(job.control)
    return bool(job.stop_reader.counters()["stop"])


def stop_requested():
    """Whether the job was asked to stop (control stop=1, status "stop"),
    read fresh from the control LUN. With several learners it is a
    collective (every rank calls it at the same point, e.g. after each
    step) and all get the same answer: True if any of them saw the stop, so
    that all stop after the same step (which bsp needs)."""
    seen = _local_stop_flag()
    if _the_job().size == 1:
        return seen
    return bool(allreduce(torch.tensor([int(seen)]), op=Max, name="stop_requested").item())


def request_stop():
    """Asks the whole job to stop: the control command stop=1, which every
    learner sees (status "stop", counters' stop, stop_requested(),
    blkps.Engine.stop_requested). Needs the control LUN and an operator's
    rights (--bsopts operators=)."""
    job = _the_job()
    if not job.control:
        raise ValueError("blkps.torch: request_stop needs the model's control LUN (BLKPS_CONTROL)")
    if job.stop_reader is None:
        job.stop_reader = _open_control(job.control)
    job.stop_reader.command("stop=1")


class EarlyStopping:
    """Early stopping across learners (the EPFL seed's "persistence"): call
    step(metric) on every rank after each evaluation, with this learner's
    metric (e.g. its validation loss). The metric is averaged over the
    ranks through the collectives, so every rank decides the same: stop
    when the average has not improved on the best by more than min_delta
    for `patience` evaluations in a row, or when the job was asked to stop
    (control stop=1). mode "min" (a loss) or "max" (an accuracy).
    stop_job=True: rank 0 also sends stop=1 when it decides, so that
    learners on other access paths see it. Attributes: best, bad_evals,
    stopped, last (the averaged metric)."""

    def __init__(self, patience=5, min_delta=0.0, mode="min", stop_job=False):
        if not isinstance(patience, int) or patience < 1:
            raise ValueError(f"blkps.torch: EarlyStopping patience={patience!r}: expected a whole number >= 1")
        if min_delta < 0 or mode not in ("min", "max"):
            raise ValueError("blkps.torch: EarlyStopping expects min_delta >= 0 and mode 'min' or 'max'")
        self.patience, self.min_delta, self.mode, self.stop_job = patience, min_delta, mode, stop_job
        self.best, self.bad_evals, self.stopped, self.last = None, 0, False, None
        _metrics.watch_early_stopping(self)  # exported with the optimizer's counters (BLKPS_METRICS_PORT)

    def step(self, metric):
        """Takes this evaluation's metric; returns True when training stops."""
        seen = _local_stop_flag()
        both = allgather(torch.tensor([[float(metric), float(seen)]], dtype=torch.float64),
                         name="early_stopping")
        self.last = float(both[:, 0].mean())
        asked = bool(both[:, 1].max() > 0)
        sign = 1.0 if self.mode == "min" else -1.0
        if self.best is None or sign * (self.best - self.last) > self.min_delta:
            self.best, self.bad_evals = self.last, 0
        else:
            self.bad_evals += 1
        self.stopped = asked or self.bad_evals >= self.patience
        if self.stopped and session.active_optimizer is not None:
            session.active_optimizer.drain()  # what is saved after the decision is the server's newest
        if self.stopped and self.stop_job and not asked and rank() == 0:
            request_stop()
        return self.stopped
