"""Transports for blkps.torch's tests (blkps.torch.pipeline's seam,
DistributedOptimizer(transport=...)): real blkps.Model connections whose
submissions can be held back or whose completions can fail, so that tests
drive a slow or failing network through the public API instead of patching
the optimizer's private methods."""

import threading
import time

import blkps

# The transfers blkps.torch makes, by kind: a push (the communication
# thread's pushes and exchanges) or a pull (its pulls, and the whole-model
# pulls of broadcast_parameters and delta mode).
_KIND_OF_CALL = {"submit_push": "push", "submit_push16": "push", "submit_exchange": "push",
                 "submit_exchange16": "push", "submit_pull_into": "pull", "submit_pull16_into": "pull",
                 "pull_into": "pull", "pull16_into": "pull"}


class Transport:
    """transport(target, dtype=None) opens a blkps.Model. `delay_s` maps a
    kind ("push", "pull") to the seconds each of its transfers waits before
    it is handed to the device. After fail_next_push(), the next push
    submission (over every connection) is never handed to the device and
    completes with an OSError instead; `failed` lists the ranges (first
    parameter, count) of the failed ones. `submitted` counts the transfers
    by kind, failed ones included."""

    def __init__(self, delay_s=None):
        self.delay_s = dict(delay_s or {})
        self.submitted = {"push": 0, "pull": 0}
        self.failed = []
        self._fail_next = False
        self._lock = threading.Lock()

    def fail_next_push(self):
        with self._lock:
            self._fail_next = True

    def __call__(self, target, dtype=None):
        return _Connection(blkps.Model(target, dtype=dtype), self)

    def _before_submit(self, kind, first_param, values):
        """Whether this submission fails; waits its kind's delay first."""
        if self.delay_s.get(kind):
            time.sleep(self.delay_s[kind])  # the slow network itself, not a synchronisation
        with self._lock:
            self.submitted[kind] += 1
            fails, self._fail_next = self._fail_next and kind == "push", self._fail_next and kind != "push"
            if fails:
                self.failed.append((first_param, len(values)))
        return fails


class _Connection:
    """A blkps.Model as the transport sees it: its transfers pass through
    the transport; a failed submission gets a ticket of its own, which
    complete() returns (first) with the error."""

    def __init__(self, model, transport):
        self._model, self._transport = model, transport
        self._failed = []  # tickets of failed submissions, not yet completed
        self._next_failed = -1

    def __getattr__(self, name):
        attr = getattr(self._model, name)
        kind = _KIND_OF_CALL.get(name)
        if kind is None:
            return attr

        def submit(first_param, values, *rest):
            if self._transport._before_submit(kind, first_param, values):
                ticket, self._next_failed = self._next_failed, self._next_failed - 1
                self._failed.append(ticket)
                return ticket
            return attr(first_param, values, *rest)
        return submit

    def complete(self, timeout=None, max_completions=64):
        if self._failed:
            failed, self._failed = self._failed, []
            return [blkps.Completion(t, None, OSError(5, "injected: the push never reached the target"))
                    for t in failed]
        return self._model.complete(timeout, max_completions)
