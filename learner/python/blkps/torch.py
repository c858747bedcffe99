"""blkps.torch: train any torch.nn.Module through a blkps model device, with
Horovod's two-line change::

    import blkps.torch as bps                     # was: import horovod.torch as hvd
    bps.init()                                    # BLKPS_TARGET, BLKPS_CONTROL, rank from the launcher
    optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()           # buckets are pushed while backward runs
        optimizer.step()                          # the parameters are now the server's weights

The device holds exactly the model's parameters, float32, in the order of
``named_parameters`` (a parameter shared under two names counts once), so the
server is started with ``params=param_count(model)``. Buffers (BatchNorm's
running statistics) are not on the device: each learner keeps its own,
updated by its own forward passes; broadcast_parameters leaves them alone.

Two modes:

- gradient mode (``DistributedOptimizer(None, named_parameters=...)``): the
  gradients are pushed and the server's rule (sgd, momentum, adam, ...)
  updates the model; step() makes the parameters the server's newest weights.
- delta mode (any torch.optim optimizer): step() runs the local optimizer,
  pushes the change of the weights to a server with rule ``sum`` (or
  ``average``), then makes the parameters the server's weights. With
  torch.optim.SGD in bsp and rule sum this equals gradient mode with server
  sgd up to float rounding (a bsp round averages the learners' pushes).

Parameters and gradients live in two flat, page-aligned float32 buffers in
the device's layout: each parameter's ``.data`` and ``.grad`` are views into
them, so a pull lands in the parameters and autograd accumulates straight
into the buffer that is pushed. In gradient mode a hook on each parameter's
gradient accumulator marks it done; a bucket (a range of the flat gradient,
``bucket_bytes``, cut at 4 KiB boundaries so that every push is whole 512-byte
blocks) is pushed on a communication thread as soon as all parameters in it
are done, while backward goes on. Each bucket is pushed exactly once per
step; step() pushes those whose parameters got no gradient (as zeros), so
every parameter is written once per iteration, as bsp and ssp require. When
the server's mode is async or ssp (read from the control LUN), a bucket's
weights are pulled right after its push, still during backward; in bsp the
pull waits for the round, so step() pulls the whole model after the last push.

One DistributedOptimizer per process; it is driven from one thread.
"""

import hashlib
import os
import queue
import threading
import time

import numpy as np
import torch

import blkps
from blkps.control import Control as _ControlLun

__all__ = ["init", "rank", "size", "local_rank", "target", "control", "param_count",
           "fingerprint", "DistributedOptimizer", "broadcast_parameters"]

DEFAULT_BUCKET_BYTES = 4 << 20  # measured best of 64 KiB..64 MiB: README "PyTorch"
_BUCKET_ALIGN = 1024            # floats: 4 KiB, whole blocks for every device
_TAG_PREFIX = "torch:"
_BROADCAST_MARK = ":broadcast"

_job = None


class _Job:
    """What init() found: this process's place in the job and its targets."""

    def __init__(self, target, control, rank, size, local_rank):
        self.target, self.control = target, control
        self.rank, self.size, self.local_rank = rank, size, local_rank


def _launcher_env(env):
    """(rank, size, local_rank) from a launcher's environment: torchrun,
    mpirun (Open MPI) or Slurm; else (0, 1, 0)."""
    for rank_key, size_key, local_key in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                                          ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK"),
                                          ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")):
        if rank_key not in env:
            continue
        values = []
        for key, default in ((rank_key, None), (size_key, "1"), (local_key, env[rank_key])):
            text = env.get(key, default)
            if not text.isdigit():
                raise ValueError(f"blkps.torch: {key}={text!r} is not a whole number")
            values.append(int(text))
        rank_, size_, local = values
        if rank_ >= size_:
            raise ValueError(f"blkps.torch: {rank_key}={rank_} is not below {size_key}={size_}")
        return rank_, size_, local
    return 0, 1, 0


def _format_target(text, rank_):
    """`text` with {rank} (0-based) and {slot} (1-based LUN) filled in."""
    return None if text is None else text.replace("{rank}", str(rank_)).replace("{slot}", str(rank_ + 1))


def init(target=None, control=None, env=None):
    """Finds this learner's rank and size from the launcher's environment
    (RANK/WORLD_SIZE/LOCAL_RANK, OMPI_COMM_WORLD_*, SLURM_PROCID/SLURM_NTASKS;
    else rank 0 of 1) and its model target: `target` or $BLKPS_TARGET, and the
    model's control LUN: `control` or $BLKPS_CONTROL (optional, but needed for
    broadcast_parameters and the fingerprint check). In both, {rank} becomes
    the rank and {slot} the rank + 1, so one string serves every learner:
    iscsi://h:3260/iqn.../{slot}, /mnt/model/slot{slot},
    layout:/d/slot-{slot}.layout. Raises ValueError when no target is given."""
    global _job
    env = os.environ if env is None else env
    rank_, size_, local = _launcher_env(env)
    target = target if target is not None else env.get("BLKPS_TARGET")
    control = control if control is not None else env.get("BLKPS_CONTROL")
    if not target:
        raise ValueError("blkps.torch: no model target; pass init(target=...) or set BLKPS_TARGET")
    _job = _Job(_format_target(target, rank_), _format_target(control or None, rank_), rank_, size_, local)


def _the_job():
    if _job is None:
        raise ValueError("blkps.torch: call blkps.torch.init() first")
    return _job


def rank():
    """This learner's rank, 0-based."""
    return _the_job().rank


def size():
    """The number of learners."""
    return _the_job().size


def local_rank():
    """This learner's rank on its node."""
    return _the_job().local_rank


def target():
    """This learner's model target (formatted)."""
    return _the_job().target


def control():
    """The model's control LUN (formatted), or None."""
    return _the_job().control


def _unique_parameters(named_parameters):
    """[(name, parameter)] in order, each parameter once (the first name of a
    shared parameter)."""
    seen, out = set(), []
    for name, p in named_parameters:
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def param_count(model):
    """The number of float32 values the device must hold for `model` (an
    nn.Module, or its named_parameters()): start the server with
    params=param_count(model). Buffers are not counted (they stay local)."""
    named = model.named_parameters() if isinstance(model, torch.nn.Module) else model
    return sum(p.numel() for _, p in _unique_parameters(named))


def fingerprint(model):
    """A short hash of the parameters' names and shapes in device order (an
    nn.Module or its named_parameters()): what the model keeps in its tag."""
    named = model.named_parameters() if isinstance(model, torch.nn.Module) else model
    text = ";".join(f"{name}:{tuple(p.shape)}" for name, p in _unique_parameters(named))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _aligned_floats(count):
    """A zeroed float32 numpy array of `count` values on a page boundary."""
    raw = np.zeros(count * 4 + 4096, dtype=np.uint8)
    start = (-raw.ctypes.data) % 4096
    return raw[start:start + count * 4].view(np.float32)


class _Control(_ControlLun):
    """The model's control LUN (blkps.control: status, commands such as the
    tag), and the whole weights window written at once."""

    def write_weights(self, weights):
        data = weights.tobytes()
        data += b"\0" * (-len(data) % self.device.logical_block_size)  # the device's padding ignores it
        self.device.write_bytes(self.layout.weights_offset, data)


class _Layout:
    """The device's layout of a model: parameter k at [offsets[k], offsets[k]
    + numel) of the flat vector, in named_parameters order."""

    def __init__(self, named_parameters):
        self.named = _unique_parameters(named_parameters)
        if not self.named:
            raise ValueError("blkps.torch: the model has no parameters")
        self.offsets, at = [], 0
        for name, p in self.named:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"blkps.torch: parameter {name} is {p.dtype} on {p.device}; "
                                 "the device holds float32 parameters of a CPU model")
            self.offsets.append(at)
            at += p.numel()
        self.count = at
        self.fingerprint = fingerprint(self.named)

    def views(self, flat):
        """Each parameter's view into the flat float32 numpy array `flat`."""
        base = torch.from_numpy(flat)
        return [base[at:at + p.numel()].view(p.shape) for (_, p), at in zip(self.named, self.offsets)]


def _check_device(layout, device, ctl):
    """Refuses a model that does not match the device, in one line naming the
    difference: its parameter count (the control LUN's status, else the
    device size) or the fingerprint kept in the model's tag. Stamps the
    fingerprint on a model that has none. Returns the status (or None)."""
    if ctl is None:
        want = layout.count * 4
        have = device.size_bytes
        if not want <= have < want + max(512, device.logical_block_size):
            raise ValueError(f"blkps.torch: the model has {layout.count} parameters but the device "
                             f"holds {have // 4}; start the server with params={layout.count}")
        return None
    status = ctl.status()
    if status["params"] != layout.count:
        raise ValueError(f"blkps.torch: the model has {layout.count} parameters but the device "
                         f"holds {status['params']}; start the server with params={layout.count}")
    tag = status.get("tag", "")
    if tag.startswith(_TAG_PREFIX):
        theirs = tag[len(_TAG_PREFIX):].split(":", 1)[0]
        if theirs != layout.fingerprint:
            raise ValueError(f"blkps.torch: the model's parameter names and shapes (fingerprint "
                             f"{layout.fingerprint}) differ from the device's ({theirs}); same "
                             f"count {layout.count}: check the model's definition")
    elif not tag:
        ctl.command(f"tag={_TAG_PREFIX}{layout.fingerprint}")
    return status


class _Bucket:
    """A range [first, end) of the flat vector and the parameters in it."""

    def __init__(self, first, end, members, needed):
        self.first, self.end, self.members = first, end, members
        self.needed = needed         # members that get gradients (requires_grad)
        self.waiting = needed        # of them, those still without this step's gradient
        self.queued = False


def _cut_buckets(layout, bucket_floats):
    """Buckets in reverse layout order (backward produces the last layers'
    gradients first), each `bucket_floats` long but the first, cut at
    _BUCKET_ALIGN boundaries; also the buckets of each parameter."""
    bucket_floats = max(_BUCKET_ALIGN, bucket_floats // _BUCKET_ALIGN * _BUCKET_ALIGN)
    buckets, end = [], layout.count
    while end > 0:
        first = max(0, (end - 1) // bucket_floats * bucket_floats)
        members = [k for k, ((_, p), at) in enumerate(zip(layout.named, layout.offsets))
                   if at < end and at + p.numel() > first]
        needed = sum(1 for k in members if layout.named[k][1].requires_grad)
        buckets.append(_Bucket(first, end, members, needed))
        end = first
    of_param = [[] for _ in layout.named]
    for b in buckets:
        for k in b.members:
            of_param[k].append(b)
    return buckets, of_param


class _DistributedOptimizer:
    """See DistributedOptimizer()."""

    def __init__(self, optimizer, named_parameters, bucket_bytes, pull_during_backward):
        job = _the_job()
        self.optimizer = optimizer
        if named_parameters is None:
            if optimizer is None:
                raise ValueError("blkps.torch: gradient mode (optimizer=None) needs named_parameters")
            named_parameters = [(f"param.{g}.{k}", p) for g, group in enumerate(optimizer.param_groups)
                                for k, p in enumerate(group["params"])]
        self.layout = layout = _Layout(named_parameters)
        self.device = blkps.Model(job.target)  # this thread's; the comm thread opens its own
        self._ctl = _Control(job.control) if job.control else None
        try:
            status = _check_device(layout, self.device, self._ctl)
        except Exception:
            self.close()
            raise
        self.weights = _aligned_floats(layout.count)
        self.gradient = _aligned_floats(layout.count)
        self._grad_views = layout.views(self.gradient)
        with torch.no_grad():
            for (_, p), w in zip(layout.named, layout.views(self.weights)):
                w.copy_(p)  # keep the local values until broadcast_parameters or step()
                p.data = w
        self.steps = 0
        self.pushes = 0      # bucket pushes (gradient mode) or whole-model pushes (delta)
        self.overlapped = 0  # gradient mode: buckets pushed while backward still ran
        self._hooks = []
        self._push_device = None
        if optimizer is None:
            mode = status["mode"] if status else "bsp"
            self.pull_during_backward = (mode != "bsp" if pull_during_backward is None
                                         else bool(pull_during_backward))
            self._start_gradient_mode(max(1, bucket_bytes // 4))

    # ---- gradient mode ----

    def _start_gradient_mode(self, bucket_floats):
        self.buckets, self._buckets_of = _cut_buckets(self.layout, bucket_floats)
        self._backward_done = False  # set by step(): later bucket pushes did not overlap
        self._error = None
        self._misuse = None  # set by a hook, raised by step()
        self._work = queue.Queue()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._comm = threading.Thread(target=self._communicate, name="blkps-torch-comm", daemon=True)
        self._comm.start()
        for k, ((_, p), g) in enumerate(zip(self.layout.named, self._grad_views)):
            if not p.requires_grad:
                continue  # frozen: pushed as zeros by step()
            p.grad = g  # autograd adds into the flat gradient
            p.register_hook(self._make_guard(k))
            with torch.enable_grad():
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(k))
            self._hooks.append(accumulator)  # keep it alive

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
        """Parameter k's gradient is complete: push the buckets it finishes."""
        _, p = self.layout.named[k]
        view = self._grad_views[k]
        if p.grad is None or p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)  # grads were set to None: move them back into the flat buffer
            p.grad = view
        for b in self._buckets_of[k]:
            if b.queued:
                return  # a second gradient, zeroed by the guard
            b.waiting -= 1
            if b.waiting == 0:
                self._queue(b)

    def _queue(self, bucket):
        bucket.queued = True
        with self._idle:
            self._in_flight += 1
        self._work.put(bucket)

    def _communicate(self):
        """The communication thread: pushes queued buckets (and pulls their
        weights when pull_during_backward) on its own device connection."""
        device = None
        while True:
            bucket = self._work.get()
            if bucket is None:
                break
            try:
                if self._error is None:
                    if device is None:
                        device = blkps.Model(_the_job().target)
                    overlapped = not self._backward_done
                    device.push(bucket.first, self.gradient[bucket.first:bucket.end])
                    self.pushes += 1
                    self.overlapped += overlapped
                    if self.pull_during_backward:
                        device.pull_into(bucket.first, self.weights[bucket.first:bucket.end])
            except Exception as e:  # reported by step()
                self._error = e
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
        if device is not None:
            device.close()

    def _gradient_step(self):
        self._backward_done = True
        for b in self.buckets:
            if not b.queued:  # parameters that got no gradient: push zeros once
                self._queue(b)
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0)
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if not self.pull_during_backward:
            self.device.pull_into(0, self.weights)
        self.gradient[:] = 0.0
        for b in self.buckets:
            b.waiting, b.queued = b.needed, False
        self._backward_done = False
        if self._misuse is not None:
            misuse, self._misuse = self._misuse, None
            raise RuntimeError(misuse)

    # ---- delta mode ----

    def _delta_step(self, closure):
        before = self.weights.copy()
        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        np.subtract(self.weights, before, out=self.gradient)
        if self._push_device is None:  # pushes on their own connection, as in gradient mode
            self._push_device = blkps.Model(_the_job().target)
        self._push_device.push(0, self.gradient)
        self.pushes += 1
        self.device.pull_into(0, self.weights)
        return loss

    # ---- the optimizer's interface ----

    def step(self, closure=None):
        """Gradient mode: pushes what backward has not pushed yet, then makes
        the parameters the server's newest weights. Delta mode: steps the
        local optimizer, pushes the change of the weights, pulls."""
        if self.optimizer is None:
            loss = closure() if closure is not None else None
            self._gradient_step()
        else:
            loss = self._delta_step(closure)
        self.steps += 1
        return loss

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients (in place in gradient mode, whatever
        set_to_none says: they stay views into the flat buffer)."""
        if self.optimizer is None:
            self.gradient[:] = 0.0
        else:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self):
        return self.optimizer.param_groups if self.optimizer is not None else []

    def state_dict(self):
        return self.optimizer.state_dict() if self.optimizer is not None else {}

    def load_state_dict(self, state):
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state)

    def broadcast(self, values, root_rank, timeout_s):
        """broadcast_parameters() for this model: see there."""
        job = _the_job()
        if self._ctl is None:
            raise ValueError("blkps.torch: broadcast_parameters needs the model's control LUN "
                             "(init(control=...) or BLKPS_CONTROL)")
        tag = _TAG_PREFIX + self.layout.fingerprint
        if job.rank == root_rank:
            flat = self.weights.copy()
            for (name, _), at, v in zip(self.layout.named, self.layout.offsets, values):
                flat[at:at + v.numel()] = v.detach().reshape(-1).numpy()
            self._ctl.command(f"tag={tag}")  # clear the mark while the weights change
            self._ctl.write_weights(flat)
            self._ctl.command(f"tag={tag}{_BROADCAST_MARK}")
        else:
            deadline = time.monotonic() + timeout_s
            while True:
                seen = self._ctl.status().get("tag", "")
                if seen == tag + _BROADCAST_MARK:
                    break
                if seen.startswith(_TAG_PREFIX) and not seen.startswith(tag):
                    raise ValueError(f"blkps.torch: rank {root_rank} broadcast a model with fingerprint "
                                     f"{seen[len(_TAG_PREFIX):]}, this one is {self.layout.fingerprint}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"blkps.torch: rank {root_rank} did not broadcast its weights "
                                       f"within {timeout_s:g} s (model tag {seen!r})")
                time.sleep(0.05)
        self.device.pull_into(0, self.weights)

    def close(self):
        """Stops the communication thread and closes the connections."""
        comm = getattr(self, "_comm", None)
        if comm is not None and comm.is_alive():
            self._work.put(None)
            comm.join()
        for conn in (self.device, self._ctl, getattr(self, "_push_device", None)):
            if conn is not None:
                conn.close()


_optimizer = None


def DistributedOptimizer(optimizer, named_parameters=None, bucket_bytes=DEFAULT_BUCKET_BYTES,
                         pull_during_backward=None):
    """Wraps `optimizer` (delta mode) or None (gradient mode) so that step()
    trains through this learner's model target (init()). named_parameters
    (model.named_parameters()) fixes the device layout; it is required in
    gradient mode. The parameters become views into the flat weights and
    keep their values until broadcast_parameters() or the first step()
    makes them the server's. Refuses, with ValueError, a model
    whose parameter count or fingerprint differs from the device's.
    bucket_bytes: gradient mode's push size; pull_during_backward: None
    (yes unless the server's mode is bsp or there is no control LUN to ask),
    True or False. The result has step(closure=None), zero_grad(),
    param_groups, state_dict(), close(), and counters steps, pushes,
    overlapped."""
    global _optimizer
    if _optimizer is not None:
        _optimizer.close()
    _optimizer = _DistributedOptimizer(optimizer, named_parameters, bucket_bytes, pull_during_backward)
    return _optimizer


def broadcast_parameters(params, root_rank=0, timeout_s=120.0):
    """Every learner starts from root_rank's parameters: root writes them
    through the model's control LUN and marks the model's tag; the others
    wait for the mark (at most timeout_s), then every learner pulls them.
    `params` is model.state_dict() or model.named_parameters(); buffers in a
    state_dict stay local. Call it after DistributedOptimizer, before
    training. A stale mark from an earlier job on the same server would let
    others go on early: clear it between jobs (blkps set tag=) or restart
    the server."""
    if _optimizer is None:
        raise ValueError("blkps.torch: create the DistributedOptimizer before broadcast_parameters")
    given = dict(params.items() if hasattr(params, "items") else params)
    values = []
    for name, p in _optimizer.layout.named:
        if name not in given:
            raise ValueError(f"blkps.torch: broadcast_parameters: no value for parameter {name}")
        if tuple(given[name].shape) != tuple(p.shape):
            raise ValueError(f"blkps.torch: broadcast_parameters: {name} has shape "
                             f"{tuple(given[name].shape)}, the model's is {tuple(p.shape)}")
        values.append(given[name])
    _optimizer.broadcast(values, root_rank, timeout_s)
