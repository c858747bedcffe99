"""blkps.torch.staging: a model's flat buffers on its own device and the host
memory libblkps moves them through (blkps.torch's data path).

``weights`` and ``gradient`` are two flat float32 tensors on the model's
device (CPU or CUDA); the parameters' ``.data`` and ``.grad`` are views into
them. libblkps reads and writes host memory only, in the wire's type (the
learner LUN's dtype: float32, bfloat16 or float16). So:

- CPU model, float32 wire: the flat buffers are the host memory (page
  aligned, zero copy), nothing is staged.
- CPU model, 16-bit wire: two host buffers of the wire type; a push narrows
  the gradient into one with torch's conversion, a pull widens the other
  into the weights.
- CUDA model: two page-locked host buffers of the wire type, and a copy
  stream for each direction, so that the two directions overlap (PCIe and
  the GPU's copy engines are full duplex) and neither waits behind the
  other. A bucket's device-to-host copy (narrowed on the GPU first on a
  16-bit wire) runs on the copy-out stream behind an event of the compute
  stream taken when the bucket's gradients were complete; the
  communication thread waits for that copy only. A pull's host-to-device
  copy (widened on the GPU) runs on the copy-in stream behind the same
  event of its range (backward has read those weights by then: a node
  that reads a weight also computes its gradient) or, for a range pulled
  with no gradient of this step, behind all the compute queued before
  (after_compute()); it records an event that the compute stream waits for
  before the layers that read those weights.

A pipeline (blkps.torch's pipeline=True: the next step computes while this
step's transfers run) adds a landing buffer for the pulled weights, float32
on the model's device, which swap_in() copies into the weights at the step
boundary. On a GPU that is one more float32 copy of the parameters, beside
the flat gradient's. On the CPU with a float32 wire there are two flat
gradients instead: a step fills one while the previous step's pushes read
the other in place, and next_gradient() swaps them at the step boundary
(the parameters' .grad views follow); with a 16-bit wire the gradient is
narrowed into the host buffer at gradient_ready(), out of the next step's
way.

Everything is allocated once, at construction: no allocation per step.
torch's narrowing rounds to nearest, ties to even, exactly as
blkps/wire_dtype.hpp does (tests/gpu_test.py checks all 65,536 patterns), so
the server sees the same values whichever side converts.

Threads: gradient_ready() and wait_weights() run on the training thread
(autograd's hooks run there or on autograd's device threads); host_gradient(),
host_weights() and weights_arrived() on the communication thread. A range is
touched by one of them at a time: the optimizer's bucket protocol
guarantees it.
"""

import numpy as np
import torch

WIRE_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def host_tensor(count, dtype, pinned):
    """A zeroed CPU tensor of `count` values of `dtype` on a page boundary
    (O_DIRECT needs it), page-locked when `pinned`."""
    size = torch.tensor([], dtype=dtype).element_size()
    raw = torch.zeros(count * size + 4096, dtype=torch.uint8, pin_memory=pinned)
    start = (-raw.data_ptr()) % 4096
    return raw[start:start + count * size].view(dtype)


def as_numpy(host):
    """The numpy view libblkps takes: float32, or uint16 bit patterns."""
    if host.dtype == torch.float32:
        return host.numpy()
    return host.view(torch.int16).numpy().view(np.uint16)


# Values per piece of the look-ahead step's scratch: on a GPU 4 MiB of
# float32 (few kernel launches); on the CPU 256 KiB, so that a piece of the
# weights, the last pull and the scratch stay in a core's L2 across the
# step's three passes (25M parameters on the 2-core VM: 23 ms against 40 ms
# with 4 MiB pieces on one torch thread, 16 against 21 on two).
LOOK_AHEAD_CHUNK = 1 << 20
CPU_LOOK_AHEAD_CHUNK = 1 << 16
# Values per piece of a 16-bit wire's conversion on a GPU (2 MiB scratches).
WIRE_CHUNK = 1 << 20


class FlatModel:
    """The flat weights and gradient of `count` parameters on `device`, and
    their host staging for a wire of type `wire` ("float32", "bfloat16",
    "float16")."""

    def __init__(self, count, device, wire="float32", buckets=(), look_ahead=0.0, pipeline=False):
        self.count, self.device, self.wire = count, torch.device(device), wire
        self.cuda = self.device.type == "cuda"
        self.pipeline = bool(pipeline)
        wire_dtype = WIRE_TORCH_DTYPES[wire]
        self.sixteen = wire != "float32"
        self.gradients = None  # set below: the flat gradients the parameters' .grad views take in turn
        if not self.cuda and not self.sixteen:
            self.weights = host_tensor(count, torch.float32, False)
            self.gradient = host_tensor(count, torch.float32, False)
            self.host_weights_all, self.host_gradient_all = self.weights, self.gradient
            if self.pipeline:  # the pulls land beside the weights; two flat gradients (next_gradient())
                self.host_weights_all = host_tensor(count, torch.float32, False)
                self.gradients = (self.gradient, host_tensor(count, torch.float32, False))
        else:
            if self.cuda:
                self.weights = torch.zeros(count, dtype=torch.float32, device=self.device)
                self.gradient = torch.zeros(count, dtype=torch.float32, device=self.device)
            else:
                self.weights = host_tensor(count, torch.float32, False)
                self.gradient = host_tensor(count, torch.float32, False)
            self.host_weights_all = host_tensor(count, wire_dtype, self.cuda)
            self.host_gradient_all = host_tensor(count, wire_dtype, self.cuda)
        # Where a pull's weights land: the parameters themselves, or, in a
        # pipeline, a second buffer on the model's device that swap_in()
        # copies into the parameters at the step boundary (on the CPU with a
        # float32 wire, the host buffer the pull wrote).
        if not self.pipeline:
            self.landing = self.weights
        elif not self.cuda and not self.sixteen:
            self.landing = self.host_weights_all
        else:
            self.landing = (torch.zeros(count, dtype=torch.float32, device=self.device) if self.cuda
                            else host_tensor(count, torch.float32, False))
        self._np_weights = as_numpy(self.host_weights_all)
        # The host arrays pushes read, by generation: the one host gradient,
        # or a CPU pipeline's two flat gradients, the step's `generation`
        # filled while the other's pushes may still read it.
        self.gradients = self.gradients or (self.gradient,)
        self.generation = 0
        self._host_gradients = self.gradients if len(self.gradients) == 2 else (self.host_gradient_all,)
        self._np_gradients = tuple(as_numpy(g) for g in self._host_gradients)
        if self.cuda:
            self.copy_out = torch.cuda.Stream(device=self.device)
            self.copy_in = torch.cuda.Stream(device=self.device)
            # 16-bit wire: a range's narrowed gradient, and its pulled weights,
            # pass through the GPU a piece at a time, each piece through a
            # scratch that the next reuses: each direction's stream runs its
            # pieces in order, through its own scratch.
            self._wire_gradient, self._wire_weights = (
                [torch.zeros(min(count, WIRE_CHUNK), dtype=wire_dtype, device=self.device) for _ in range(2)]
                if self.sixteen else (None, None))
            self._ready, self._copied, self._arrived = {}, {}, {}
            for first, end in [(0, count)] + [(b.first, b.end) for b in buckets]:
                self._ready[(first, end)] = torch.cuda.Event()
                self._copied[(first, end)] = torch.cuda.Event()
                self._arrived[(first, end)] = torch.cuda.Event()
        # Look-ahead (doc/async.md "Look-ahead"): after a pull of a range its
        # weights move on by look_ahead times their move since the previous
        # pull (the weights that pull brought, in _last_pull).
        self.look_ahead = 0.0
        self._pulled_before = False
        self._last_pull = None
        self.set_look_ahead(look_ahead)

    def set_look_ahead(self, look_ahead):
        """Makes look_ahead `look_ahead` from the next pull on. REQUIRES: no
        pull landing meanwhile (between steps). From 0 the next pull takes
        no step: the last pull was not kept."""
        look_ahead = float(look_ahead)
        if look_ahead and not self.look_ahead:
            self._pulled_before = False
        if look_ahead and self._last_pull is None:
            # The move is formed a chunk at a time in a scratch of at most
            # _chunk values, so look-ahead costs one copy of the
            # weights (the last pull) on the model's device, not two. On a
            # 16-bit wire the last pull is kept in the wire's type: its values
            # came in that type, so nothing is lost, and the copy is half a
            # float32 one.
            self._last_pull = torch.zeros(self.count, dtype=WIRE_TORCH_DTYPES[self.wire], device=self.device)
            self._chunk = LOOK_AHEAD_CHUNK if self.cuda else CPU_LOOK_AHEAD_CHUNK
            self._moved = torch.zeros(min(self.count, self._chunk), dtype=self.weights.dtype,
                                      device=self.device)
        self.look_ahead = look_ahead

    def host_bytes(self):
        """Host memory this object added to the model's own: the staging
        buffers (0 for a CPU model on a float32 wire)."""
        own = {id(self.weights), id(self.gradient)}
        staging = {id(t): t for t in (self.host_weights_all, self.landing) + self._host_gradients
                   if t.device.type == "cpu" and id(t) not in own}
        return sum(t.numel() * t.element_size() for t in staging.values())

    def device_bytes(self):
        """GPU memory beyond the parameters and gradients themselves (the
        flat buffers replace their own storage): the 16-bit wire's scratches,
        the look-ahead's last pull and its scratch. 0 for a CPU model."""
        if not self.cuda:
            return 0
        extra = [self._wire_gradient, self._wire_weights] if self.sixteen else []
        extra += [self._last_pull, self._moved] if self._last_pull is not None else []
        extra += [self.landing] if self.landing is not self.weights else []
        return sum(t.numel() * t.element_size() for t in extra)

    # ---- gradients: device -> host ----

    def gradient_ready(self, first, end, scale=1.0):
        """The gradient of [first, end) is complete (training thread). On a
        GPU: queue its scaling, narrowing and device-to-host copy on the
        copy-out stream behind the compute stream's work so far. CPU, in a
        pipeline: scale and stage it now (the training thread zeroes the
        gradient for the next step while this one is on the wire)."""
        if not self.cuda:
            if self.pipeline:
                grad = self.gradient[first:end]
                if scale != 1.0:
                    grad.mul_(scale)
                if self.sixteen:
                    self.host_gradient_all[first:end].copy_(grad)
            return
        ready = self._ready[(first, end)]
        ready.record(torch.cuda.current_stream(self.device))
        with torch.cuda.device(self.device), torch.cuda.stream(self.copy_out):
            self.copy_out.wait_event(ready)
            grad = self.gradient[first:end]
            if scale != 1.0:
                grad.mul_(scale)
            if self.sixteen:
                for lo in range(first, end, WIRE_CHUNK):
                    hi = min(end, lo + WIRE_CHUNK)
                    wire = self._wire_gradient[:hi - lo]
                    wire.copy_(self.gradient[lo:hi])
                    self.host_gradient_all[lo:hi].copy_(wire, non_blocking=True)
            else:
                self.host_gradient_all[first:end].copy_(grad, non_blocking=True)
            self._copied[(first, end)].record(self.copy_out)

    def after_compute(self):
        """Orders the copy-in stream's later work (a pull's copy into the
        weights) after everything queued on the compute stream so far, such
        as the backward kernels that still read the weights (training
        thread; nothing to do on the CPU). A pull of a range whose gradient
        went out this step waits for that gradient instead
        (weights_arrived()); a pull with no push before it needs this."""
        if self.cuda:
            self.copy_in.wait_stream(torch.cuda.current_stream(self.device))

    def gradient_copied(self, first, end):
        """Whether gradient_ready()'s copy of [first, end) to the host has
        finished (on the CPU there is none to wait for); does not wait."""
        return not self.cuda or self._copied[(first, end)].query()

    def host_gradient(self, first, end, scale=1.0, generation=0):
        """The host array of [first, end) to push, in the wire's type
        (communication thread), once gradient_ready() has been called for it
        in the step of `generation` (next_gradient())."""
        if self.cuda:
            self._copied[(first, end)].synchronize()
        elif not self.pipeline:  # a pipeline staged it in gradient_ready()
            grad = self.gradient[first:end]
            if scale != 1.0:
                grad.mul_(scale)
            if self.sixteen:
                self.host_gradient_all[first:end].copy_(grad)
        return self._np_gradients[generation][first:end]

    def host_pushed(self, first, end, generation=0):
        """The host array of [first, end) as host_gradient() and
        host_zeros() of its buckets left it (communication thread): one
        push of several adjacent buckets of one generation."""
        return self._np_gradients[generation][first:end]

    def host_zeros(self, first, end, generation=0):
        """A zeroed host array of [first, end) to push instead of the
        gradient (a skipped step; communication thread)."""
        self._host_gradients[generation][first:end].zero_()
        return self._np_gradients[generation][first:end]

    def next_gradient(self):
        """The step boundary of a pipeline on the CPU with a float32 wire
        (training thread): the next step fills the other flat gradient,
        zeroed here, while this step's pushes read this one in place (no
        copy). Returns False, changing nothing, where there is one flat
        gradient (the caller zeroes it). REQUIRES: every push of the step
        before this one has ended (a pipeline's step() waits for them)."""
        if len(self.gradients) == 1:
            return False
        self.generation ^= 1
        self.gradient = self.gradients[self.generation]
        self.gradient.zero_()
        return True

    def release_gradient(self):
        """Orders the compute stream's later work (zeroing the gradient for
        the next step) after every device-to-host copy gradient_ready()
        queued (training thread; on the CPU those copies are done)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_out)

    def gradient_finite(self):
        """Whether every gradient value is finite (one reduction on the
        model's device, after the copy-out stream's scaling; waits for it)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_out)
        return bool(torch.isfinite(self.gradient).all())

    # ---- weights: host -> device ----

    def host_weights(self, first, end):
        """The host array a pull of [first, end) lands in (communication thread)."""
        return self._np_weights[first:end]

    def weights_arrived(self, first, end, look_ahead=True):
        """A pull of [first, end) landed in host_weights(): make it the
        parameters' (widened; on a GPU queued on the copy-in stream behind
        the range's gradient_ready() event, with an event that
        wait_weights() hands to the compute stream), then take the
        look-ahead step unless `look_ahead` is False. A range must be one
        that gradient_ready() or a pull knows (the whole model or a
        bucket)."""
        if self.cuda:
            with torch.cuda.device(self.device), torch.cuda.stream(self.copy_in):
                # Backward is done reading these weights once their gradient
                # is complete. An event recorded in an earlier step, or never,
                # is already complete: a pull after_compute() ordered.
                self.copy_in.wait_event(self._ready[(first, end)])
                if self.sixteen:
                    for lo in range(first, end, WIRE_CHUNK):
                        hi = min(end, lo + WIRE_CHUNK)
                        wire = self._wire_weights[:hi - lo]
                        wire.copy_(self.host_weights_all[lo:hi], non_blocking=True)
                        self.landing[lo:hi].copy_(wire)
                else:
                    self.landing[first:end].copy_(self.host_weights_all[first:end], non_blocking=True)
                if look_ahead:
                    self._look_ahead(first, end)
                self._arrived[(first, end)].record(self.copy_in)
            return
        if self.landing is not self.host_weights_all:  # widened, or a float32 pull landed beside the weights
            self.landing[first:end].copy_(self.host_weights_all[first:end])
        if look_ahead:
            self._look_ahead(first, end)

    def _look_ahead(self, first, end):
        """Moves the just-pulled weights of [first, end) on by look_ahead
        times their move since the previous pull. The first pull after
        construction or forget_pulls() moves nothing: every weight not pulled
        yet still holds what the previous pull (or the broadcast) brought."""
        if not self.look_ahead:
            return
        if not self._pulled_before:
            self._last_pull.copy_(self.weights)
            self._last_pull[first:end].copy_(self.landing[first:end])
            self._pulled_before = True
            return
        for lo in range(first, end, self._chunk):
            hi = min(end, lo + self._chunk)
            weights, last, moved = self.landing[lo:hi], self._last_pull[lo:hi], self._moved[:hi - lo]
            torch.sub(weights, last, out=moved)
            last.copy_(weights)
            weights.add_(moved, alpha=self.look_ahead)

    def forget_pulls(self):
        """The weights changed by something other than the model's training
        (a broadcast): the next pull takes no look-ahead step."""
        self._pulled_before = False

    def weights_landed(self, first, end):
        """Whether weights_arrived()'s copy of [first, end) has finished (on
        the CPU there is none); does not wait."""
        return not self.cuda or self._arrived[(first, end)].query()

    def wait_weights(self, first, end):
        """Makes the compute stream wait for weights_arrived(first, end)'s
        copy (training thread; nothing to do on the CPU)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self._arrived[(first, end)])

    def swap_in(self, first, end):
        """A pipeline's step boundary for [first, end): the weights that
        weights_arrived() landed beside the parameters become theirs
        (training thread, once the communication thread is done with the
        range; on a GPU a copy on the compute stream behind the arrival).
        REQUIRES: nothing reads the range's weights until the compute
        stream's next work (its gradient is complete, or between steps)."""
        if self.landing is self.weights:
            return
        self.wait_weights(first, end)
        with torch.no_grad():
            self.weights[first:end].copy_(self.landing[first:end])

    # ---- the whole model, outside the pipeline ----

    def pull_all(self, device, look_ahead=True):
        """Pulls every weight through `device` (a blkps.Model) and makes it
        the parameters' (waits for the copy); see weights_arrived()."""
        self.after_compute()
        pull = device.pull16_into if self.sixteen else device.pull_into
        pull(0, self._np_weights)
        self.weights_arrived(0, self.count, look_ahead)
        if self.cuda:
            self._arrived[(0, self.count)].synchronize()
        self.swap_in(0, self.count)

    def pull_ranges(self, device, ranges):
        """Pulls the weights of the parameter ranges `ranges` ([(first,
        end)], disjoint) through `device` (a blkps.Model with nothing else in
        flight: the training thread's), all submitted before the first is
        waited for, and makes them the parameters' on the compute stream,
        behind its work so far; no look-ahead (bsp only). Raises the first
        failure once all have ended. REQUIRES: no pull of the ranges in
        flight on another connection; not a pipeline."""
        submit = device.submit_pull16_into if self.sixteen else device.submit_pull_into
        flight = {submit(first, self._np_weights[first:end]) for first, end in ranges}
        error = None
        while flight:
            for c in device.complete():
                flight.discard(c.ticket)
                error = error or c.error
        if error is not None:
            raise error
        if self.weights is not self.host_weights_all and ranges:  # one gather, one copy, one scatter
            index = torch.cat([torch.arange(first, end) for first, end in ranges])
            values = self.host_weights_all[index].to(self.device, torch.float32)
            with torch.no_grad():
                self.weights.index_copy_(0, index.to(self.device), values)

    def push_all(self, device):
        """Pushes the whole gradient buffer through `device`."""
        self.gradient_ready(0, self.count)
        host = self.host_gradient(0, self.count, generation=self.generation)
        (device.push16 if self.sixteen else device.push)(0, host)
