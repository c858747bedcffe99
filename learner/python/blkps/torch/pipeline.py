"""blkps.torch.pipeline: the one place that opens connections to the model
target. A transport opens them (blkps.Model by default: each thread
opens its own); the communication thread of gradient mode (Pipeline) hands
the optimizer's buckets (and a tied weight's head part, blkps.torch.tied)
to its connection as submissions and takes their
completions, so that the training thread never waits for the network
unless it asks to.

A transport is any callable transport(target, dtype=None) that returns a
new connection with blkps.Model's interface: size_bytes,
logical_block_size, the submit_* calls, complete() and wake(), pull_into and
pull16_into, push and push16 (blkps.torch.staging's whole-model transfers),
reconnects, reconnect_seconds, pushed_bytes_lost, close(). Tests pass one
that wraps blkps.Model to delay or fail submissions
(doc/pytorch.md "Package layout")."""

import queue
import threading
import time

import blkps

_NOTHING = object()  # _take_adjacent: the queue ran empty


def connector(transport, target, wire):
    """A function that opens a new connection to `target` through
    `transport` (None: blkps.Model) with `wire` (None: float32, else the
    16-bit dtype's name)."""
    transport = blkps.Model if transport is None else transport
    return lambda: transport(target, dtype=wire)


class Pipeline:
    """Gradient mode's communication thread and its queue. The training
    thread calls push(), pull(), wait_pushes(), raise_error(), alive() and
    close(); everything else runs on the communication thread, on a
    connection of its own (`connect()`). `owner` is the optimizer: the
    pipeline reads its flat buffers, buckets, push_scale,
    pull_during_backward, pipeline and backward_done, and adds to its
    counters (pushes, overlapped, transfers, bytes, seconds, faults). A
    failed transfer is kept, never retried: raise_error() raises it once on
    the training thread, and the transfers queued until then end unsent."""

    def __init__(self, owner, connect):
        self._owner, self._connect = owner, connect
        self._error = None
        self._work = queue.Queue()
        # The communication thread's connection, once open: the training
        # thread wakes its complete() after queueing (_queue).
        self._device = None
        self._idle = threading.Condition()
        self._pushes_in_flight = 0
        self.pull_batch = 1  # buckets the next pull may take (_communicate)
        self._thread = threading.Thread(target=self._communicate, name="blkps-torch-comm", daemon=True)
        self._thread.start()

    def push(self, bucket, zero):
        """Queues the bucket's push (zeros when `zero`; with
        pull_during_backward, an exchange)."""
        with self._idle:
            self._pushes_in_flight += 1
        self._queue(("push", bucket, zero))

    def push_part(self, part, zero):
        """Queues the push of a tied weight's part (blkps.torch.tied; zeros
        when `zero`): one call of its own at part.first, never joined with
        a bucket's."""
        with self._idle:
            self._pushes_in_flight += 1
        self._queue(("part", part, zero))

    def pull(self, bucket):
        """Queues the bucket's pull."""
        self._queue(("pull", bucket, False))

    def _queue(self, item):
        """Queues `item`, then ends the communication thread's wait for
        completions, if it waits: it looks at the queue after each wait,
        and before its connection is open it does not wait."""
        self._work.put(item)
        device = self._device
        if device is not None:
            device.wake()

    def wait_pushes(self):
        """Waits until every push queued has ended."""
        with self._idle:
            self._idle.wait_for(lambda: self._pushes_in_flight == 0)

    def alive(self):
        return self._thread.is_alive()

    def raise_error(self):
        """Raises, once, what a transfer failed with."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self):
        """Ends the thread once what is queued has ended; closes its connection."""
        self._queue(None)
        self._thread.join()

    def _communicate(self):
        """The communication thread: pushes queued buckets on its own device
        connection; with pull_during_backward, a push and the pull of its
        weights are one exchange, which also takes the buckets queued
        meanwhile that continue its range (one call does not drain the
        connections between them: doc/data-path.md "Phases at link rate");
        pulls queued alone. Each call is a submission (doc/libblkps.md
        "Streaming"): the next is handed over while earlier ones run, so the
        connections' queues stay full from bucket to bucket; a call's
        buckets are done when its completion comes back."""
        device, flight = None, {}  # flight: ticket -> (kind, batch, submitted at)
        item = self._work.get()
        while item is not None or flight:
            following = _NOTHING
            if item is not _NOTHING and item is not None:
                kind, bucket, zero = item
                batch = [(bucket, zero)]
                # Adjacent buckets queued meanwhile join this call (fewer, larger
                # transfers); a step's pulls join in batches that double from one
                # bucket, so the first layers' weights arrive first and early.
                limit = {"push": len(self._owner.buckets), "part": 1}.get(kind, self.pull_batch)
                following = self._take_adjacent(batch, kind, limit)
                ticket = None
                try:
                    if self._error is None:
                        if device is None:
                            device = self._device = self._connect()
                        ticket = self._submit(device, kind, batch)
                except Exception as e:  # reported by step() or the next forward
                    self._error = e
                if ticket is None:
                    self._batch_done(kind, batch, None)
                else:
                    flight[ticket] = (kind, batch, time.perf_counter())
            if flight:
                # Nothing else to do: wait for a completion, or for _queue's wake.
                busy = following is not _NOTHING or not self._work.empty()
                for c in device.complete(timeout=0 if busy else None):
                    kind, batch, submitted = flight.pop(c.ticket)
                    self._batch_done(kind, batch, c.error, time.perf_counter() - submitted)
            if not flight and device is not None:  # counters wait for every submission
                self._owner.faults.note("communication", device)
            if item is None:
                continue  # the end: only completions still to take
            if following is not _NOTHING:
                item = following
            elif flight:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    item = _NOTHING
            else:
                item = self._work.get()
        if device is not None:
            device.close()

    def _submit(self, device, kind, batch):
        """Hands the adjacent buckets of `batch` ((bucket, zero) pairs) to
        `device` as one submission of `kind` ("push": an exchange with
        pull_during_backward, else a push; "pull"; "part": a tied weight's
        part alone, pushed); its ticket."""
        sixteen = self._owner.flat.sixteen
        if kind == "part":
            part, zero = batch[0]
            host = part.host(zero)
            self._owner.bytes["pushed"] += host.nbytes
            return (device.submit_push16 if sixteen else device.submit_push)(part.first, host)
        first, end = min(b.first for b, _ in batch), max(b.end for b, _ in batch)
        if kind == "pull":
            into = self._owner.flat.host_weights(first, end)
            self._owner.bytes["pulled"] += into.nbytes
            return (device.submit_pull16_into if sixteen else device.submit_pull_into)(first, into)
        for bucket, zero in batch:
            self._stage_push(bucket, zero)
        host = self._owner.flat.host_pushed(first, end, batch[0][0].generation)
        self._owner.bytes["pushed"] += host.nbytes
        self._owner.overlapped += (not self._owner.backward_done) * len(batch)
        if not self._owner.pull_during_backward:
            return (device.submit_push16 if sixteen else device.submit_push)(first, host)
        into = self._owner.flat.host_weights(first, end)
        self._owner.bytes["pulled"] += into.nbytes
        return (device.submit_exchange16 if sixteen else device.submit_exchange)(first, host, into)

    def _batch_done(self, kind, batch, error, seconds=0.0):
        """A submission of `batch` ended (`error`: None, or why it failed;
        a batch never submitted, after an earlier error, ends with None):
        its weights become the parameters' (or land beside them), its
        buckets are released to the training thread."""
        if error is not None and self._error is None:
            self._error = error
        pulled = kind == "pull" or (kind == "push" and self._owner.pull_during_backward)
        if seconds:
            self._owner.transfers += 1
            part = "pull" if kind == "pull" else "exchange" if pulled else "push"
            self._owner.seconds[part] += seconds
            if kind == "push":
                self._owner.pushes += len(batch)
            elif kind == "part":
                batch[0][0].pushes += 1
            else:
                self.pull_batch = min(2 * self.pull_batch, len(self._owner.buckets))
        for b, _ in batch:
            if pulled and seconds and error is None:
                self._owner.flat.weights_arrived(b.first, b.end)
                b.landed = self._owner.pipeline
            if pulled:
                b.arrived.set()
            if kind != "pull":
                with self._idle:
                    self._pushes_in_flight -= 1
                    self._idle.notify_all()

    def _take_adjacent(self, batch, kind, limit):
        """Adds to `batch` ((bucket, zero) pairs, one to start) the items of
        `kind` already queued whose buckets extend its range on either side,
        in queue order, up to `limit` buckets in all; a push joins only once
        its gradient is on the host (on a GPU, the training thread queues
        buckets ahead of the backward kernels that finish them: waiting for
        those would hold back the pushes ready now). Returns the first
        queued item that does not join (it runs next; None is the end), or
        _NOTHING when none was taken from the queue."""
        first, end = batch[0][0].first, batch[0][0].end
        while len(batch) < limit:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                return _NOTHING
            flat = self._owner.flat
            if (item is None or item[0] != kind or not (item[1].end == first or item[1].first == end)
                    or (kind == "push" and not item[2] and not flat.gradient_copied(item[1].first, item[1].end))
                    or (kind == "push" and item[1].generation != batch[0][0].generation)):
                return item
            batch.append((item[1], item[2]))
            first, end = min(first, item[1].first), max(end, item[1].end)
        return _NOTHING

    def _stage_push(self, bucket, zero):
        """The host array of the bucket's push: its gradient, or zeros."""
        start = time.perf_counter()
        if zero:
            host = self._owner.flat.host_zeros(bucket.first, bucket.end, bucket.generation)
        else:
            host = self._owner.flat.host_gradient(bucket.first, bucket.end, self._owner.push_scale,
                                                  bucket.generation)
        self._owner.seconds["copy_out"] += time.perf_counter() - start
        return host
