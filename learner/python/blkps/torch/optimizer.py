"""blkps.torch.optimizer: the optimizer core. It keeps a model's parameters
and gradients as views into flat buffers in the device's layout
(blkps.torch.layout, blkps.torch.staging), pushes each bucket of the
gradient as backward finishes it and makes the parameters the server's
weights (gradient mode), or pushes the change of the weights a local
optimizer made (delta mode, blkps.torch.delta); pipelined, a step computes
on the weights the previous step's exchanges brought. Its transfers go
through blkps.torch.pipeline, its forwards wait for weights through
blkps.torch.forward_waits (overlap_pull), broadcast_parameters writes
through blkps.torch.weights_broadcast; its knobs are OptimizerOptions, its
place in the job the session's. The Horovod-shaped face over it is
blkps.torch.horovod."""

import contextlib
import threading
import time

import torch

from blkps import metrics as _metrics
from blkps.control import open_control as _open_control
from blkps.pushing_learners import PushingLearners as _PushingLearners
from blkps.torch.delta import DeltaSteps
from blkps.torch.forward_waits import ForwardWaits
from blkps.torch.staging import FlatModel
from blkps.torch.layout import Layout, check_device, check_wire, cut_buckets, learner_lun
from blkps.torch.pipeline import Pipeline, connector
from blkps.torch.tied import RowsFirst, TiedWeight, check_parts
from blkps.torch.weights_broadcast import broadcast_weights

DEFAULT_BUCKET_BYTES = 4 << 20  # measured best of 64 KiB..64 MiB: doc/pytorch.md "PyTorch"
# A pipelined learner's: its transfers overlap a whole step, not the rest of
# its backward, so fewer, larger buckets cost it nothing in overlap and cut
# the host's work per bucket (doc/gpu.md "Measured on an H200").
PIPELINED_BUCKET_BYTES = 16 << 20


class OptimizerOptions:
    """The optimizer core's options, as DistributedOptimizer() documents
    them: `wire` the wire type (float32, float16, bfloat16: the learner
    LUN's dtype); `combine` how pushes combine: None (the server's rule),
    "average" or "sum" (pushes scaled so that a bsp round or N async
    pushes move the model by the learners' mean or sum);
    backward_passes_per_step, bucket_bytes (None: DEFAULT_BUCKET_BYTES,
    PIPELINED_BUCKET_BYTES for a pipelined learner), pull_during_backward,
    overlap_pull, skip_nonfinite, look_ahead, pipeline; tied_head (the
    output head module whose weight is tied, pushed in two parts:
    blkps.torch.tied)."""

    def __init__(self, wire="float32", combine=None, backward_passes_per_step=1,
                 bucket_bytes=None, pull_during_backward=None, overlap_pull=None,
                 skip_nonfinite=False, look_ahead=None, pipeline=None, tied_head=None):
        if combine not in (None, "average", "sum"):
            raise ValueError(f"blkps.torch: combine={combine!r}: expected None, 'average' or 'sum'")
        self.wire, self.combine = wire, combine
        self.backward_passes_per_step = backward_passes_per_step
        self.bucket_bytes, self.pull_during_backward = bucket_bytes, pull_during_backward
        self.overlap_pull, self.skip_nonfinite = overlap_pull, skip_nonfinite
        self.look_ahead, self.pipeline = look_ahead, pipeline
        self.tied_head = tied_head

    def push_scale(self, mode, size_, delta):
        """The factor on what a learner pushes so that the model moves as
        `combine` says: a bsp round applies the mean of the round's pushes; async
        and ssp apply each push as it comes (doc/pytorch.md "Horovod's API").
        combine None: gradient mode leaves the combination to the server's rule
        (staleness-aware in async and ssp); delta mode in async and ssp
        pushes 1/N of the local step, as "average" does: the server's
        sum adds each push exactly, and N learners each adding their
        whole step would move the model N times as far as one process
        on the total batch, which diverges with momentum (doc/async.md).
        `size_`: N, the learners of a round (bsp: the launcher's size;
        async and ssp: blkps.pushing_learners)."""
        if self.combine is None:
            return 1.0 / size_ if delta and mode != "bsp" else 1.0
        if mode == "bsp":
            return 1.0 if self.combine == "average" else float(size_)
        return 1.0 / size_ if self.combine == "average" else 1.0


def _pipeline_of(pipeline, gradient_mode, mode, device):
    """Whether steps are pipelined (doc/gpu.md "Pipelined learners"): as
    given, by default for a CUDA model in gradient mode when the server's
    `mode` is async or ssp (None: no control LUN to ask). Refuses delta mode
    and bsp in one line."""
    if pipeline is None:
        return gradient_mode and mode in ("async", "ssp") and device.type == "cuda"
    if pipeline and not gradient_mode:
        raise ValueError("blkps.torch: pipeline=True needs gradient mode (DistributedOptimizer(None, ...)): "
                         "delta mode steps its own optimizer on the weights it pulled")
    if pipeline and mode == "bsp":
        raise ValueError("blkps.torch: pipeline=True in bsp: a bsp step computes on its own round's weights; "
                         "pipelining is for async and ssp (doc/gpu.md \"Pipelined learners\")")
    return bool(pipeline)


class Optimizer:
    """The optimizer core: blkps.torch.DistributedOptimizer() documents it.
    It trains `optimizer` (delta mode) or None (gradient mode) over
    named_parameters through the model target of `job` (the session's),
    as `options` (OptimizerOptions) say, on connections that `transport`
    opens (blkps.torch.pipeline; None: blkps.Model). Driven from one thread."""

    def __init__(self, optimizer, named_parameters, job, options, transport=None):
        pull_during_backward, overlap_pull = options.pull_during_backward, options.overlap_pull
        self.optimizer = optimizer
        self._job = job
        self._wire = None if options.wire == "float32" else options.wire
        self._connect = connector(transport, job.target, self._wire)
        self.backward_passes_per_step = options.backward_passes_per_step
        if named_parameters is None:
            if optimizer is None:
                raise ValueError("blkps.torch: gradient mode (optimizer=None) needs named_parameters")
            named_parameters = [(f"param.{g}.{k}", p) for g, group in enumerate(optimizer.param_groups)
                                for k, p in enumerate(group["params"])]
        self.layout = layout = Layout(named_parameters)
        self.device = self._connect()  # this thread's; the comm thread opens its own
        self._ctl = None
        try:
            self._ctl = _open_control(job.control) if job.control else None
            self._check_server(options, optimizer is None)
        except Exception:
            self.close()
            raise
        self._options, self._look_ahead_given = options, options.look_ahead
        # The N of async steps, the server's (bsp: none; no control LUN: the launcher's size).
        self._pushing = _PushingLearners(job.size, self._ctl if self.mode != "bsp" else None)
        self._take_share(job.size)
        self.skip_nonfinite = bool(options.skip_nonfinite)
        self._skip_synchronize = False
        bucket_bytes = options.bucket_bytes
        if bucket_bytes is None:
            bucket_bytes = PIPELINED_BUCKET_BYTES if self.pipeline else DEFAULT_BUCKET_BYTES
        self.buckets, self._buckets_of = (cut_buckets(layout, max(1, bucket_bytes // 4)) if optimizer is None
                                          else ([], []))
        self.flat = FlatModel(layout.count, layout.device, options.wire, self.buckets,
                              self.look_ahead, self.pipeline)
        self.weights, self.gradient = self.flat.weights, self.flat.gradient
        # The parameters' .grad views into each flat gradient (two in a
        # pipeline on the CPU: FlatModel.next_gradient()).
        self._grad_views_of = [layout.views(g) for g in self.flat.gradients]
        self._grad_views = self._grad_views_of[0]
        with torch.no_grad():
            for (_, p), w in zip(layout.named, layout.views(self.weights)):
                w.copy_(p)  # keep the local values until broadcast_parameters or step()
                p.data = w
        self.steps = 0
        self.pushes = 0         # bucket pushes (gradient mode) or whole-model pushes (delta)
        self.overlapped = 0     # gradient mode: buckets pushed while backward still ran
        self.transfers = 0      # gradient mode: device calls (a push, pull or exchange of adjacent buckets)
        self.bytes = {"pushed": 0, "pulled": 0}  # gradient mode: bytes on the wire, by direction
        self.skipped_steps = 0  # steps with non-finite gradients, not pushed (skip_nonfinite)
        self.forward_waits = 0  # forward pre-hooks that found a bucket's weights still arriving
        # Gradient mode, where the time goes (seconds, summed): the communication
        # thread's wait for a bucket's copy to the host (and its narrowing on
        # the CPU), its pushes, its pulls (with the copy back queued), its
        # exchanges (a push and the pull after it); the training thread's
        # waits in step() for the pushes still running once backward is done,
        # and in forwards for weights still arriving; a pipeline's wait in
        # step() for the previous step's transfers.
        self.seconds = {"copy_out": 0.0, "push": 0.0, "pull": 0.0, "exchange": 0.0, "step_wait": 0.0,
                        "weights_wait": 0.0, "pipeline_wait": 0.0}
        # Reconnects and pushes lost at server restarts, as each thread's
        # Models count them (blkps.metrics.SessionFaults).
        self.faults = _metrics.SessionFaults()
        self._stepped = True    # skip_nonfinite: step() ran since the last zero_grad()
        self._zeroed_version = None  # the flat gradient's version when it was last zeroed
        self._hooks = []         # the parameters' hooks' handles, removed by close()
        self._accumulators = []  # their gradient accumulators, kept alive for their hooks
        self._delta = DeltaSteps(optimizer, self.flat, self.device, self._connect) if optimizer is not None else None
        self.forwards = None  # overlap_pull: the forwards' waits (blkps.torch.forward_waits)
        self._tied = None  # gradient mode with tied_head: the head's part (blkps.torch.tied)
        self.rows_first = None  # ... and overlap_pull, from the first step(): the tied weight's pull order
        if optimizer is None:
            self.pull_during_backward = (self.mode != "bsp" if pull_during_backward is None
                                         else bool(pull_during_backward))
            self.overlap_pull = layout.device.type == "cuda" if overlap_pull is None else bool(overlap_pull)
            if self.pipeline:  # each push's pull lands beside the weights; no forward waits for any
                self.pull_during_backward, self.overlap_pull = True, False
            self._start_gradient_mode()

    def _check_server(self, options, gradient_mode):
        """Checks the model target and its server against the model and
        `options`, sets mode, pipeline and the tied weight's range, and
        tells the server this learner's pipeline depth. Raises ValueError
        in one line (or the connection's error)."""
        job, layout = self._job, self.layout
        check_wire(options.wire, self._ctl.status() if self._ctl else None, self.device, layout.count, job.target)
        status = check_device(layout, self.device, self._ctl, 4 if self._wire is None else 2)
        self.mode = status["mode"] if status else "bsp"
        self._tied_range = check_parts(status, layout, options.tied_head, gradient_mode,
                                       options.pull_during_backward)
        self.pipeline = _pipeline_of(options.pipeline, gradient_mode, status["mode"] if status else None,
                                     layout.device)
        look_ahead = options.look_ahead
        if look_ahead is not None and not 0.0 <= float(look_ahead) <= 1.0 + self.pipeline:
            raise ValueError(f"blkps.torch: look_ahead={look_ahead}: expected a number in [0, {1 + self.pipeline}]")
        lun = learner_lun(job.target)
        if self._ctl and self.mode != "bsp" and lun is not None:
            # The server counts a push's staleness from the read its gradient
            # was taken on: a pipeline's is one step back
            # (doc/async.md "Pipelined learners").
            self._ctl.command(f"pipeline={lun}:{int(self.pipeline)}")

    def _take_share(self, learners):
        """Sets push_scale, and look_ahead unless it was given, for a step
        that is 1/`learners` of a round (pushing_learners.py). Async and
        ssp, both modes: after each pull the parameters move on by
        look_ahead times the model's move since the previous pull, so the
        next gradient is taken about where the model will be when its push
        lands (doc/async.md "Look-ahead"); by default (N-1)/N, the others'
        share. One learner and bsp: 0. REQUIRES: between steps (no push or
        pull in flight)."""
        self.push_scale = self._options.push_scale(self.mode, learners, self.optimizer is not None)
        given = self._look_ahead_given
        # A pipeline's gradient is taken on weights one step older again:
        # its own previous push, and the others' of that step, land before
        # it (doc/async.md "Pipelined learners").
        self.look_ahead = float(given if given is not None else
                                (learners - 1) / learners + self.pipeline if self.mode != "bsp" else 0.0)
        if getattr(self, "flat", None) is not None:  # built after the first share
            self.flat.set_look_ahead(self.look_ahead)

    def _follow_pushing_learners(self):
        """Takes the server's N for the next push (one counters read; bsp or
        no control LUN: none, and nothing changes)."""
        self._take_share(self._pushing.count())

    # ---- gradient mode ----

    def _start_gradient_mode(self):
        self.backward_done = False  # set by step(): later bucket pushes did not overlap
        self._misuse = None  # set by a hook, raised by step()
        self._passes = [0] * len(self.layout.named)  # backward passes this step, by parameter
        for b in self.buckets:
            b.arrived = threading.Event()  # its weights of this step are in the parameters (a pipeline: landed)
            b.arrived.set()
            b.landed = False  # a pipeline: weights landed beside the parameters, not swapped in yet
            b.generation = 0  # the flat gradient its last push reads (FlatModel.next_gradient())
        self._comm = Pipeline(self, self._connect)
        if self._tied_range is not None:
            first, count, index = self._tied_range
            self._tied = TiedWeight(self.layout, self.flat, self._options.tied_head, first, count, index,
                                    self._tied_gradient)
        for k, ((_, p), g) in enumerate(zip(self.layout.named, self._grad_views)):
            if not p.requires_grad:
                continue  # frozen: pushed as zeros by step()
            p.grad = g  # autograd adds into the flat gradient
            self._hooks.append(p.register_hook(self._make_guard(k)))
            with torch.enable_grad():
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(accumulator.register_hook(self._make_hook(k)))
            self._accumulators.append(accumulator)  # keep it alive
        if self.overlap_pull:
            self.forwards = ForwardWaits(self.layout, self.buckets, self._buckets_of, self.wait_weights,
                                         self._wait_buckets)

    def _learnt(self):
        """The first step() with overlap_pull: the forwards that run are
        known (ForwardWaits), and so the tied weight's readers, whose
        forwards read its rows first (RowsFirst)."""
        if self._tied is None:
            return
        readers = self._tied.readers(self.forwards.ran)
        if readers:
            self.rows_first = RowsFirst(self._tied, self.flat, self.device,
                                        self.forwards.buckets_of_params([self._tied.weight]), readers,
                                        self._queue_pull)
            self.forwards.skip = self.rows_first.reads_rows

    def _wait_buckets(self, buckets):
        if self.rows_first is not None:
            self.rows_first.queue_due(buckets)
        for b in buckets:
            self._wait_arrived(b)
            self.flat.wait_weights(b.first, b.end)

    def _wait_arrived(self, bucket):
        if self._await_transfers(bucket, "weights_wait"):
            self.forward_waits += 1
        self._comm.raise_error()

    def _await_transfers(self, bucket, part):
        """Waits until the bucket's transfers in flight are done, adding the
        time to seconds[part]; whether it had to wait."""
        if bucket.arrived.is_set():
            return False
        start = time.perf_counter()
        while not bucket.arrived.wait(1.0):
            if not self._comm.alive():
                raise RuntimeError("blkps.torch: the communication thread has stopped")
        self.seconds[part] += time.perf_counter() - start
        return True

    def wait_weights(self):
        """Waits until every weight of the last step() is in the parameters
        (overlap_pull: step() returns before; forward waits by layer; a
        pipeline: drain())."""
        if self.optimizer is None:
            self.drain()

    def _make_hook(self, k):
        def hook(*_):
            self._gradient_ready(k)
        return hook

    def _make_guard(self, k):
        def guard(grad):
            if any(b.queued for b in self._buckets_of[k]):
                # A second gradient before step(): its bucket may be on the wire,
                # so it must not reach the flat buffer. step() raises; raising
                # here would abort backward inside autograd's engine.
                self._misuse = (f"blkps.torch: a second gradient for {self.layout.named[k][0]} "
                                "before step(), dropped: its bucket was already pushed; call step() "
                                "after each backward()")
                return torch.zeros_like(grad)
            return grad
        return guard

    def _gradient_ready(self, k):
        """Parameter k's gradient is complete: push the buckets it finishes
        (skip_nonfinite: step() pushes them, once it knows the step is finite)."""
        _, p = self.layout.named[k]
        view = self._grad_views[k]
        if p.grad is None or p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)  # grads were set to None: move them back into the flat buffer
            p.grad = view
        self._passes[k] += 1
        if self._passes[k] < self.backward_passes_per_step:
            return  # accumulates in the flat buffer until the last pass of the step
        for b in self._buckets_of[k]:
            if b.queued:
                return  # a second gradient, zeroed by the guard
            b.waiting -= 1
            if b.waiting == 0 and not self.skip_nonfinite:
                if not self.pipeline:
                    self._queue(b)
                elif b.arrived.is_set():  # its last exchange is done: swap its weights in, push
                    self._swap_in(b)
                    self._queue(b)
                # else step() queues it once its last exchange is done

    def _tied_gradient(self, added):
        """The head's gradient of the tied weight came (TiedWeight.add):
        push its part once the step's passes are in (skip_nonfinite:
        step() pushes it); one after the part was pushed was dropped."""
        if not added:
            self._misuse = (f"blkps.torch: a second gradient for {self._tied.name} through its output head "
                            "before step(), dropped: its part was already pushed; call step() after each backward()")
        elif self._tied.passes == self.backward_passes_per_step and not self.skip_nonfinite:
            self._queue_part()

    def _queue_part(self, zero=False):
        """Queues the push of the tied weight's head part (zeros when `zero`)."""
        self._tied.ready(self.push_scale, zero)
        self._comm.push_part(self._tied, zero)

    @property
    def part_pushes(self):
        """Tied weight's head parts pushed (tied_head; else 0)."""
        return self._tied.pushes if self._tied is not None else 0

    def _queue(self, bucket, zero=False):
        """Queues the bucket's push (zeros when `zero`) and, when pulling
        during backward, its pull; on a GPU its copy to the host starts now."""
        bucket.queued = True
        bucket.generation = self.flat.generation
        if zero:
            self.flat.after_compute()  # its pull's copy must not overtake backward
        else:
            self.flat.gradient_ready(bucket.first, bucket.end, self.push_scale)
        if self.pull_during_backward:
            bucket.arrived.clear()
        self._comm.push(bucket, zero)

    def _swap_in(self, bucket):
        """A pipeline: the weights the bucket's last exchange brought become
        the parameters' (its gradient of this step is complete, so nothing
        reads them before the next forward)."""
        if bucket.landed:
            bucket.landed = False
            self.flat.swap_in(bucket.first, bucket.end)

    def _queue_pull(self, bucket):
        bucket.arrived.clear()
        self._comm.pull(bucket)

    def _push_remaining(self, skipped=False):
        """Pushes the buckets not pushed yet (parameters that got no
        gradient: zeros; a skipped step: zeros, or nothing in async) and
        waits for every push of this step."""
        self.backward_done = True
        if self._tied is not None and not self._tied.queued:  # the head got no gradient, or skip_nonfinite
            self._queue_part(zero=skipped)
        for b in self.buckets:
            if not b.queued:
                if skipped and self.mode == "async":
                    b.queued = True  # async counts no writes: a skipped step sends nothing
                else:
                    self._queue(b, zero=skipped)
        start = time.perf_counter()
        self._comm.wait_pushes()
        self.seconds["step_wait"] += time.perf_counter() - start
        self._comm.raise_error()

    def _queue_pipelined(self, skipped=False):
        """A pipeline's step(): each bucket not pushed yet waits for its
        exchange of the previous step (the time in seconds pipeline_wait),
        takes the weights it brought and is pushed (zeros, or nothing in
        async, for a skipped step); this step's exchanges are not waited for."""
        self.backward_done = True
        for b in self.buckets:
            if b.queued:
                continue
            self._await_transfers(b, "pipeline_wait")
            self._comm.raise_error()
            self._swap_in(b)
            if skipped and self.mode == "async":
                b.queued = True  # async counts no writes: a skipped step sends nothing
            else:
                self._queue(b, zero=skipped)

    def drain(self):
        """Gradient mode: waits for every transfer in flight; in a pipeline
        the weights they brought then become the parameters (the server's
        after this learner's last push), so what is read or saved next is
        defined (doc/gpu.md "Drain points"). Pushes nothing new."""
        if self.optimizer is not None or getattr(self, "_comm", None) is None:
            return
        if not self.pipeline:
            self._wait_buckets(self.buckets)
            return
        for b in self.buckets:
            self._await_transfers(b, "pipeline_wait")
            self._swap_in(b)
        self._comm.raise_error()

    def _gradient_step(self, skipped=False):
        if self.skip_nonfinite and not skipped and not (self.flat.gradient_finite() and
                                                        (self._tied is None or self._tied.finite())):
            skipped = True
        self.skipped_steps += skipped
        if self.pipeline:
            self._queue_pipelined(skipped)
        else:
            self._push_remaining(skipped)
        self._follow_pushing_learners()  # for the pulls still to come and the next pushes
        if not self.pipeline and (not self.pull_during_backward or (skipped and self.mode == "async")):
            self.flat.after_compute()
            self._comm.pull_batch = 1  # the step's first pull: one bucket, the first layers'
            for b in reversed(self.buckets):  # the first layers' weights first
                if self.rows_first is None or not self.rows_first.defers(b):
                    self._queue_pull(b)
        self.flat.release_gradient()
        if self.flat.next_gradient():  # the next step fills the other flat gradient, zeroed
            self._take_gradient()
        else:
            self._zero_gradient()
        if self._tied is not None:
            self._tied.reset()
        for b in self.buckets:
            b.waiting, b.queued = b.needed, False
        self._passes = [0] * len(self.layout.named)
        self.backward_done = False
        if self.pipeline:
            pass  # the weights of the exchanges just queued are swapped in next step
        elif not self.overlap_pull:
            self.wait_weights()
        elif self.forwards.stepped():
            self._learnt()
        if self._misuse is not None:
            misuse, self._misuse = self._misuse, None
            raise RuntimeError(misuse)

    # ---- delta mode (blkps.torch.delta) ----

    def _delta_step(self, closure):
        loss, skipped, pushed = self._delta.step(closure, self.skip_nonfinite, self._scale_now,
                                                 push_skipped=self.mode != "async")
        self.skipped_steps += skipped
        self.pushes += pushed
        return loss

    def _scale_now(self):
        """push_scale for the push about to go, the server's N followed."""
        self._follow_pushing_learners()
        return self.push_scale

    def _zero_gradient(self):
        """Gradient mode: zeroes the flat gradient unless nothing has written
        it since it was last zeroed (its version counter, which every
        in-place write through a parameter's .grad view bumps, is unchanged),
        so that a loop's zero_grad() right after step() costs no second pass
        over the model."""
        if self.gradient._version != self._zeroed_version:
            self.gradient.zero_()
            self._zeroed_version = self.gradient._version

    def _take_gradient(self):
        """The flat gradient became the other one (FlatModel.next_gradient()):
        the parameters' .grad views follow it."""
        self.gradient = self.flat.gradient
        self._grad_views = self._grad_views_of[self.flat.generation]
        for (_, p), g in zip(self.layout.named, self._grad_views):
            if p.requires_grad:
                p.grad = g
        self._zeroed_version = self.gradient._version

    def _skipped_step(self):
        """A step GradScaler skipped (no step() between two zero_grad()):
        push what bsp and ssp count (zeros), pull."""
        if self.optimizer is None:
            self._gradient_step(skipped=True)
        else:
            self.skipped_steps += 1
            self._delta.skipped(push=self.mode != "async")
            self.pushes += self.mode != "async"
        self.steps += 1

    # ---- the optimizer's interface ----

    def step(self, closure=None):
        """Gradient mode: pushes what backward has not pushed yet, then makes
        the parameters the server's newest weights (overlap_pull: as the
        next forward reaches each layer). Delta mode: steps the local
        optimizer, pushes the change of the weights, pulls. skip_nonfinite:
        a step with a NaN or infinite gradient (delta) is not pushed."""
        if self.optimizer is None:
            loss = closure() if closure is not None else None
            self._gradient_step()
        else:
            loss = self._delta_step(closure)
        self.steps += 1
        self._stepped = True
        self._note_faults()
        return loss

    def _note_faults(self):
        """Copies the training thread's Models' reconnect counts."""
        self.faults.note("training", self.device)
        if self._delta is not None and self._delta.push_device is not None:
            self.faults.note("delta pushes", self._delta.push_device)

    def synchronize(self):
        """Horovod's synchronize(): after it the gradients are final for this
        step, so GradScaler.unscale_ or clipping may act on them before
        step() (under skip_synchronize()). Gradient mode: pushes every bucket
        not pushed yet and waits (the server applies what was pushed, so
        unscale_ after it does not change the update: do not scale the loss
        in gradient mode unless skip_nonfinite, where nothing is pushed
        before step()). Delta mode: nothing to do, the local gradients are
        the ones the local optimizer steps with; the combination is the
        server's, after step()."""
        if self.optimizer is None and not self.skip_nonfinite:
            if self.pipeline:
                self._queue_pipelined()
                self.drain()
            else:
                self._push_remaining()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's context for step() after synchronize(). step() never
        pushes a bucket twice, with it or without."""
        self._skip_synchronize = True
        try:
            yield
        finally:
            self._skip_synchronize = False

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients (in place in gradient mode, whatever
        set_to_none says: they stay views into the flat buffer).
        skip_nonfinite: a zero_grad() with no step() since the previous one
        (and, in gradient mode, a backward in between) is a step GradScaler
        skipped: it is counted and written as zeros where bsp and ssp count
        writes (doc/gpu.md)."""
        if self.skip_nonfinite:
            backward_ran = any(self._passes) if self.optimizer is None else True
            if not self._stepped and backward_ran:
                self._skipped_step()
            self._stepped = False
        if self.optimizer is None:
            self.flat.release_gradient()  # a pipeline's copies out of it may still run
            self._zero_gradient()
            if self._tied is not None and not self._tied.queued:
                self._tied.reset()
        else:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def has_control(self):
        """Whether the model's control LUN is open (broadcast() needs it)."""
        return self._ctl is not None

    @property
    def param_groups(self):
        """The wrapped optimizer's; in gradient mode one group of the
        parameters (what GradScaler.unscale_ walks)."""
        if self.optimizer is not None:
            return self.optimizer.param_groups
        return [{"params": [p for _, p in self.layout.named]}]

    def state_dict(self):
        """The wrapped optimizer's; gradient mode: {} (the rule's state is
        the server's), after drain(), so that the model's parameters saved
        beside it are the server's after this learner's last push."""
        if self.optimizer is None:
            self.drain()
            return {}
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state)

    def _wait_idle(self):
        """Waits for the communication thread's pulls (gradient mode)."""
        if self.optimizer is None and getattr(self, "_comm", None) is not None and self._comm.alive():
            self.wait_weights()

    def broadcast(self, values, root_rank, timeout_s=None):
        """broadcast_parameters() for this model: see there
        (blkps.torch.weights_broadcast)."""
        if self._ctl is None:
            raise ValueError("blkps.torch: broadcast_parameters needs the model's control LUN "
                             "(init(control=...) or BLKPS_CONTROL)")
        self._wait_idle()
        broadcast_weights(self._job, self._ctl, self.layout, self.flat, self.device, values, root_rank, timeout_s)

    def pull_server_weights(self):
        """Makes the parameters the server's current weights, without the
        look-ahead step (e.g. to evaluate the model once every learner has
        finished); the next step() pulls as usual."""
        self._wait_idle()
        self.flat.pull_all(self.device, look_ahead=False)
        self._note_faults()

    def close(self):
        """Waits for the transfers in flight (drain(): a pipeline's last
        pushes are acknowledged and their weights swapped in), stops the
        communication thread and closes the connections; then raises what
        the last transfers failed with, if anything."""
        comm, failed = getattr(self, "_comm", None), None
        if comm is not None and comm.alive():
            try:
                self.drain()
            except Exception as e:  # raised once everything is closed
                failed = e
            comm.close()
        if getattr(self, "forwards", None) is not None:
            self.forwards.close()
        for hook in getattr(self, "_hooks", ()):  # a closed optimizer leaves the parameters alone
            hook.remove()
        self._hooks, self._accumulators = [], []
        if getattr(self, "_tied", None) is not None:
            self._tied.close()
        if getattr(self, "rows_first", None) is not None:
            self.rows_first.close()
        if getattr(self, "_delta", None) is not None:
            self._delta.close()
        for conn in (self.device, self._ctl):
            if conn is not None:
                conn.close()
        server, self.metrics_server = getattr(self, "metrics_server", None), None
        if server is not None:
            server.shutdown()
            server.server_close()
        if failed is not None:
            raise failed
