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
  ``average``), then makes the parameters the server's weights. In async
  and ssp it pushes 1/N of the change, N the learners that push as the
  server counts them (doc/async.md "One N: the learners that push"), so
  that N learners move the model as one process on the total batch would. With
  torch.optim.SGD in bsp and rule sum this equals gradient mode with server
  sgd up to float rounding (a bsp round averages the learners' pushes).

Parameters and gradients live in two flat float32 buffers in the device's
layout, on the model's own device (CPU or CUDA): each parameter's ``.data``
and ``.grad`` are views into them, so a pull lands in the parameters and
autograd accumulates straight into the buffer that is pushed. On the CPU
libblkps reads and writes them directly (page aligned); a CUDA model's
buckets go through page-locked host staging on a copy stream for each
direction, narrowed to
a 16-bit wire on the GPU (blkps.staging, doc/gpu.md). In gradient mode a hook on each parameter's
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

Horovod's API (doc/pytorch.md "Horovod's API" has the table): the launcher's ranks
(local_size, cross_rank, ...), collectives through the server (allreduce,
allgather, broadcast, broadcast_object: blkps.collectives), Compression
(the 16-bit wire), op=Average/Sum, backward_passes_per_step,
synchronize()/skip_synchronize(), broadcast_parameters and
broadcast_optimizer_state before or after DistributedOptimizer, early
stopping (stop_requested, EarlyStopping); what blkps cannot do (Adasum,
join, elastic, SyncBatchNorm) is refused in one line.
"""

import contextlib
import hashlib
import os
import pickle
import queue
import re
import threading
import time
import weakref

import numpy as np
import torch

import blkps
from blkps.collectives import Exchange as _Exchange, Heartbeat as _Heartbeat, session_of as _session_of
from blkps.collectives import RankDied, heartbeat_period as _heartbeat_period
from blkps.control import describe_layout as _describe_layout, open_control as _open_control
from blkps.pushing_learners import PushingLearners as _PushingLearners
from blkps import metrics as _metrics
from blkps.staging import FlatModel as _FlatModel
from blkps.torch_embedding import Embedding, EmbeddingBag

__all__ = ["init", "rank", "size", "local_rank", "target", "control", "param_count",
           "fingerprint", "DistributedOptimizer", "broadcast_parameters",
           # Horovod's API
           "shutdown", "is_initialized", "local_size", "cross_rank", "cross_size",
           "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
           "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
           "Compression", "Average", "Sum", "Adasum", "Min", "Max", "Product", "global_process_set",
           "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
           "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async",
           "broadcast_async_", "broadcast_object", "allgather_object", "barrier", "poll",
           "synchronize", "broadcast_optimizer_state", "join", "elastic", "SyncBatchNorm",
           "start_timeline", "stop_timeline",
           # early stopping
           "stop_requested", "request_stop", "EarlyStopping", "RankDied",
           # rows on the server (blkps.torch_embedding)
           "Embedding", "EmbeddingBag"]

DEFAULT_BUCKET_BYTES = 4 << 20  # measured best of 64 KiB..64 MiB: doc/pytorch.md "PyTorch"
_BUCKET_ALIGN = 1024            # floats: 4 KiB, whole blocks for every device
_TAG_PREFIX = "torch:"
_BROADCAST_MARK = ":broadcast"

_job = None


class _Job:
    """What init() found: this process's place in the job and its targets;
    the collectives' exchange, opened on first use, and this rank's
    heartbeat (several ranks and a control LUN: from init() on)."""

    def __init__(self, target, control, rank, size, local_rank, topology=(1, 0, 1), session=b""):
        self.target, self.control = target, control
        self.rank, self.size, self.local_rank = rank, size, local_rank
        self.local_size, self.cross_rank, self.cross_size = topology
        self.session = session
        self.exchange = None
        self.heartbeat = None
        self.stop_reader = None  # a Control for stop_requested()


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


def _whole(env, key, default=None):
    text = env.get(key, default)
    if text is None:
        return None
    if not text.isdigit():
        raise ValueError(f"blkps.torch: {key}={text!r} is not a whole number")
    return int(text)


def _slurm_tasks_on_node(text, node):
    """Tasks on node `node` from Slurm's SLURM_TASKS_PER_NODE ("2(x3),1"),
    or None when the text is not of that form."""
    counts = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if node < len(counts) else None


def _launcher_topology(env, rank_, size_, local):
    """(local_size, cross_rank, cross_size) as Horovod means them: the
    processes on this node, this node's index, the nodes. torchrun:
    LOCAL_WORLD_SIZE, GROUP_RANK (GROUP_WORLD_SIZE, else WORLD_SIZE /
    LOCAL_WORLD_SIZE); mpirun: OMPI_COMM_WORLD_LOCAL_SIZE, the node index
    taken as rank // local_size (ranks filled node by node, mpirun's
    default mapping); Slurm: SLURM_TASKS_PER_NODE (or
    SLURM_NTASKS_PER_NODE), SLURM_NODEID, SLURM_NNODES. Without them:
    (size, 0, 1), one node."""
    if "RANK" in env and "LOCAL_WORLD_SIZE" in env:
        local_size = max(1, _whole(env, "LOCAL_WORLD_SIZE"))
        cross = _whole(env, "GROUP_RANK", str(rank_ // local_size))
        nodes = _whole(env, "GROUP_WORLD_SIZE", str(-(-size_ // local_size)))
        return local_size, cross, nodes
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_LOCAL_SIZE" in env:
        local_size = max(1, _whole(env, "OMPI_COMM_WORLD_LOCAL_SIZE"))
        return local_size, rank_ // local_size, -(-size_ // local_size)
    if "SLURM_PROCID" in env and "SLURM_NODEID" in env:
        node = _whole(env, "SLURM_NODEID")
        nodes = _whole(env, "SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1"))
        local_size = _slurm_tasks_on_node(env.get("SLURM_TASKS_PER_NODE", ""), node)
        if local_size is None:
            local_size = _whole(env, "SLURM_NTASKS_PER_NODE", str(-(-size_ // max(1, nodes))))
        return local_size, node, nodes
    return size_, 0, 1


def _format_target(text, rank_):
    """`text` with {rank} (0-based) and {slot} (1-based LUN) filled in."""
    return None if text is None else text.replace("{rank}", str(rank_)).replace("{slot}", str(rank_ + 1))


def init(target=None, control=None, env=None):
    """Finds this learner's rank and size from the launcher's environment
    (RANK/WORLD_SIZE/LOCAL_RANK, OMPI_COMM_WORLD_*, SLURM_PROCID/SLURM_NTASKS;
    else rank 0 of 1) and its model target: `target` or $BLKPS_TARGET, and the
    model's control LUN: `control` or $BLKPS_CONTROL (optional, but needed for
    broadcast_parameters and the fingerprint check; a layout:PATH target
    whose file names its shards' control LUNs is its own control). In both, {rank} becomes
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
    if not control and target.startswith("layout:"):
        # A layout that names its shards' control LUNs (blkps target start
        # --tgtd N) is the job's control too (doc/data-path.md "Scale-out").
        try:
            if _describe_layout(_format_target(target, rank_)[len("layout:"):])["controls"]:
                control = target
        except OSError:
            pass  # no layout there (yet): opening the target says so
    shutdown()
    _job = _Job(_format_target(target, rank_), _format_target(control or None, rank_), rank_, size_, local,
                _launcher_topology(env, rank_, size_, local), _session_of(env, size_))
    if size_ > 1 and _job.control:
        # From here on, however busy this rank is, the others waiting in a
        # collective see it alive (blkps.collectives "A dead rank and a slow one").
        job = _job
        job.heartbeat = _Heartbeat(lambda: _collectives_control(job), rank_, job.session,
                                   _heartbeat_period(_collective_dead_after_s()))


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


def local_size():
    """The number of learners on this node (_launcher_topology)."""
    return _the_job().local_size


def cross_rank():
    """This learner's node, 0-based (_launcher_topology)."""
    return _the_job().cross_rank


def cross_size():
    """The number of nodes (_launcher_topology)."""
    return _the_job().cross_size


def is_initialized():
    """Whether init() has run (and shutdown() has not)."""
    return _job is not None


def shutdown():
    """Closes the collectives' connection and the DistributedOptimizer;
    is_initialized() is False afterwards."""
    global _job, _optimizer, _pending_broadcast
    if _optimizer is not None:
        _optimizer.close()
        _optimizer = None
    _pending_broadcast = None
    if _job is not None:
        for conn in (_job.exchange, _job.heartbeat, _job.stop_reader):
            if conn is not None:
                conn.close()
        _job = None


# What blkps is built with, in Horovod's words: no MPI, Gloo, NCCL, DDL,
# oneCCL or GPU collectives; the server carries everything, from the CPU.
def mpi_threads_supported():
    """False: blkps uses no MPI (mpirun only launches the processes)."""
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    """False: collectives go through the server, from the CPU."""
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """False as Horovod means it (no GPU collectives): CUDA tensors are
    staged through the host for the server (doc/gpu.md)."""
    return False


def rocm_built():
    return False


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
    """A short hash of the parameters' names and shapes in device order, and
    of the memory order of those kept channels_last (_memory_strides), (an
    nn.Module or its named_parameters()): what the model keeps in its tag."""
    named = model.named_parameters() if isinstance(model, torch.nn.Module) else model
    text = ";".join(f"{name}:{tuple(p.shape)}" + ("" if _memory_strides(p) is None else ":channels_last")
                    for name, p in _unique_parameters(named))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _memory_strides(p):
    """The strides of a parameter kept channels_last (a 4-D or 5-D tensor
    whose channels are innermost, as model.to(memory_format=...) leaves a
    convolution's weight), else None: the parameter is, or becomes, a
    contiguous view."""
    if p.is_contiguous():
        return None
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    if p.dim() in formats and p.is_contiguous(memory_format=formats[p.dim()]):
        return p.stride()
    return None


class _Layout:
    """The device's layout of a model: parameter k at [offsets[k], offsets[k]
    + numel) of the flat vector, in named_parameters order, its values in
    its own memory order (a channels_last parameter keeps its layout, so
    its convolutions need no conversion; the fingerprint says so)."""

    def __init__(self, named_parameters):
        self.named = _unique_parameters(named_parameters)
        if not self.named:
            raise ValueError("blkps.torch: the model has no parameters")
        self.offsets, at = [], 0
        self.device = self.named[0][1].device
        for name, p in self.named:
            if p.dtype != torch.float32 or p.device != self.device:
                raise ValueError(f"blkps.torch: parameter {name} is {p.dtype} on {p.device}; the "
                                 f"model's parameters must all be float32 on one device ({self.device}, "
                                 "as the first one); keep the model float32 and use autocast for "
                                 "16-bit compute")
            self.offsets.append(at)
            at += p.numel()
        self.count = at
        self.strides = [_memory_strides(p) for _, p in self.named]
        self.fingerprint = fingerprint(self.named)

    def views(self, flat):
        """Each parameter's view into the flat float32 tensor `flat`, with
        the parameter's own strides."""
        return [flat[at:at + p.numel()].view(p.shape) if strides is None
                else flat[at:at + p.numel()].as_strided(p.shape, strides)
                for (_, p), at, strides in zip(self.named, self.offsets, self.strides)]


def _lun_dtype(status, target_):
    """The learner LUN's dtype as the status shows it: the LUN that an
    iscsi:// or iser:// target names, else the one dtype every attached
    learner LUN has; None when the status cannot tell."""
    learners = [entry for entry in status.get("learners", []) if entry.get("dtype")]
    m = re.fullmatch(r"(?:iscsi|iser)://.*/(\d+)", target_ or "")
    if m:
        for entry in learners:
            if entry["lun"] == int(m.group(1)):
                return entry["dtype"]
    dtypes = {entry["dtype"] for entry in learners}
    return dtypes.pop() if len(dtypes) == 1 else None


def _check_wire(compression, status, device, count):
    """Refuses, in one line naming both, a compression whose wire type is
    not the learner LUN's dtype (the status's, else told float32 from
    16-bit by the device size)."""
    wire = compression.wire_dtype
    have = _lun_dtype(status, _the_job().target) if status else None
    if have is None:
        size = device.size_bytes
        if wire == "float32" and size < count * 4:
            have = "16-bit (bfloat16 or float16)"
        elif wire != "float32" and size >= count * 4:
            have = "float32"
    if have is not None and have != wire:
        match = {"float32": "none", "float16": "fp16", "bfloat16": "bf16"}.get(have)
        hint = f"use compression=Compression.{match}" if match else "use Compression.bf16 or fp16"
        raise ValueError(f"blkps.torch: compression=Compression.{compression.name} sends {wire} but the "
                         f"learner LUN's dtype is {have}; {hint} or serve the LUN with --bsopts dtype={wire}")


def _check_device(layout, device, ctl, bytes_per_param=4):
    """Refuses a model that does not match the device, in one line naming the
    difference: its parameter count (the control LUN's status, else the
    device size) or the fingerprint kept in the model's tag. Stamps the
    fingerprint on a model that has none. Returns the status (or None)."""
    if ctl is None:
        want = layout.count * bytes_per_param
        have = device.size_bytes
        if not want <= have < want + max(512, device.logical_block_size):
            raise ValueError(f"blkps.torch: the model has {layout.count} parameters but the device "
                             f"holds {have // bytes_per_param}; start the server with params={layout.count}")
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


def _params_read(module, ran):
    """The parameters `module`'s forward reads, as far as modules tell: its
    own, and those of its descendants whose forward is not in `ran` (the
    modules whose forward ran): a module may read a child's parameters
    without calling it, as nn.MultiheadAttention reads its out_proj's."""
    params = list(module.parameters(recurse=False))
    for child in module.children():
        if child not in ran:
            params += _params_read(child, ran)
    return params


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


class _DistributedOptimizer:
    """See DistributedOptimizer()."""

    def __init__(self, optimizer, named_parameters, bucket_bytes, pull_during_backward, options=None,
                 overlap_pull=None, skip_nonfinite=False, look_ahead=None, pipeline=None):
        job = _the_job()
        options = options if options is not None else _HorovodOptions()
        self.optimizer = optimizer
        self.compression = options.compression
        self._wire = None if options.compression.wire_dtype == "float32" else options.compression.wire_dtype
        self.backward_passes_per_step = options.backward_passes_per_step
        if named_parameters is None:
            if optimizer is None:
                raise ValueError("blkps.torch: gradient mode (optimizer=None) needs named_parameters")
            named_parameters = [(f"param.{g}.{k}", p) for g, group in enumerate(optimizer.param_groups)
                                for k, p in enumerate(group["params"])]
        self.layout = layout = _Layout(named_parameters)
        self.device = blkps.Model(job.target, dtype=self._wire)  # this thread's; the comm thread opens its own
        self._ctl = _open_control(job.control) if job.control else None
        try:
            _check_wire(options.compression, self._ctl.status() if self._ctl else None, self.device,
                        layout.count)
            status = _check_device(layout, self.device, self._ctl, 4 if self._wire is None else 2)
        except Exception:
            self.close()
            raise
        self.mode = status["mode"] if status else "bsp"
        try:
            self.pipeline = _pipeline_of(pipeline, optimizer is None, status["mode"] if status else None,
                                         layout.device)
        except ValueError:
            self.close()
            raise
        if look_ahead is not None and not 0.0 <= float(look_ahead) <= 1.0 + self.pipeline:
            self.close()
            raise ValueError(f"blkps.torch: look_ahead={look_ahead}: expected a number in [0, {1 + self.pipeline}]")
        self._options, self._look_ahead_given = options, look_ahead
        # The N of async steps, the server's (bsp: none; no control LUN: the launcher's size).
        self._pushing = _PushingLearners(job.size, self._ctl if self.mode != "bsp" else None)
        self._take_share(job.size)
        self.skip_nonfinite = bool(skip_nonfinite)
        self._skip_synchronize = False
        self.buckets, self._buckets_of = (_cut_buckets(layout, max(1, bucket_bytes // 4)) if optimizer is None
                                          else ([], []))
        self.flat = _FlatModel(layout.count, layout.device, options.compression.wire_dtype, self.buckets,
                               self.look_ahead, self.pipeline)
        self.weights, self.gradient = self.flat.weights, self.flat.gradient
        self._grad_views = layout.views(self.gradient)
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
        self._hooks = []
        self._push_device = None
        self._forward_hook = None
        if optimizer is None:
            self.pull_during_backward = (self.mode != "bsp" if pull_during_backward is None
                                         else bool(pull_during_backward))
            self.overlap_pull = layout.device.type == "cuda" if overlap_pull is None else bool(overlap_pull)
            if self.pipeline:  # each push's pull lands beside the weights; no forward waits for any
                self.pull_during_backward, self.overlap_pull = True, False
            self._start_gradient_mode()

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
        self._backward_done = False  # set by step(): later bucket pushes did not overlap
        self._error = None
        self._misuse = None  # set by a hook, raised by step()
        self._work = queue.Queue()
        self._idle = threading.Condition()
        self._pushes_in_flight = 0
        self._pull_batch = 1  # buckets the next pull may take (_communicate)
        self._passes = [0] * len(self.layout.named)  # backward passes this step, by parameter
        for b in self.buckets:
            b.arrived = threading.Event()  # its weights of this step are in the parameters (a pipeline: landed)
            b.arrived.set()
            b.landed = False  # a pipeline: weights landed beside the parameters, not swapped in yet
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
        if self.overlap_pull:
            self._param_index = {id(p): k for k, (_, p) in enumerate(self.layout.named)}
            self._buckets_of_module = weakref.WeakKeyDictionary()
            # Until the first step() the forwards that run are recorded, and
            # each waits for the whole model (nothing is in flight then).
            self._ran = weakref.WeakSet()
            self._learning = True
            self._unread_buckets = []  # of parameters no module that ran reads: waited for first
            self._unread_due = False
            self.waited = []  # (module, [bucket indices]) of the last forward_log_steps
            self._forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(self._before_forward)

    def _before_forward(self, module, _inputs):
        """Every module's forward starts here: wait for the weights this
        module's forward reads (_params_read: its own parameters' buckets
        and those of children read through it), so the first layers run
        while the last ones still arrive. The first forward after step()
        waits first for the parameters no module's forward reads."""
        if self._learning:
            self._ran.add(module)
            self.wait_weights()
            return
        if self._unread_due:
            self._unread_due = False
            self._wait_buckets(self._unread_buckets)
        buckets = self._buckets_of_module.get(module)
        if buckets is None:
            buckets = self._buckets_of_params(_params_read(module, self._ran))
            self._buckets_of_module[module] = buckets
        if self.log_forward_waits and buckets:
            self.waited.append((module, [self.buckets.index(b) for b in buckets]))
        self._wait_buckets(buckets)

    def _buckets_of_params(self, params):
        """The buckets that this optimizer's parameters among `params` lie in, in layout order."""
        ks = [self._param_index[id(p)] for p in params if id(p) in self._param_index]
        return sorted({id(b): b for k in ks for b in self._buckets_of[k]}.values(), key=lambda b: b.first)

    def _learnt(self):
        """The first step(): which modules' forwards run is known. The
        parameters that none of them reads (_params_read) are waited for
        at the start of each forward."""
        self._learning = False
        read = {id(p) for m in self._ran for p in _params_read(m, self._ran)}
        self._unread_buckets = self._buckets_of_params(p for _, p in self.layout.named if id(p) not in read)

    def _wait_buckets(self, buckets):
        for b in buckets:
            self._wait_arrived(b)
            self.flat.wait_weights(b.first, b.end)

    log_forward_waits = False  # tests: record which buckets each module's forward waited for

    def _wait_arrived(self, bucket):
        if self._await_transfers(bucket, "weights_wait"):
            self.forward_waits += 1
        self._raise_error()

    def _await_transfers(self, bucket, part):
        """Waits until the bucket's transfers in flight are done, adding the
        time to seconds[part]; whether it had to wait."""
        if bucket.arrived.is_set():
            return False
        start = time.perf_counter()
        while not bucket.arrived.wait(1.0):
            if not self._comm.is_alive():
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

    def _queue(self, bucket, zero=False):
        """Queues the bucket's push (zeros when `zero`) and, when pulling
        during backward, its pull; on a GPU its copy to the host starts now."""
        bucket.queued = True
        if zero:
            self.flat.after_compute()  # its pull's copy must not overtake backward
        else:
            self.flat.gradient_ready(bucket.first, bucket.end, self.push_scale)
        if self.pull_during_backward:
            bucket.arrived.clear()
        with self._idle:
            self._pushes_in_flight += 1
        self._work.put(("push", bucket, zero))

    def _swap_in(self, bucket):
        """A pipeline: the weights the bucket's last exchange brought become
        the parameters' (its gradient of this step is complete, so nothing
        reads them before the next forward)."""
        if bucket.landed:
            bucket.landed = False
            self.flat.swap_in(bucket.first, bucket.end)

    def _queue_pull(self, bucket):
        bucket.arrived.clear()
        self._work.put(("pull", bucket, False))

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
                limit = len(self.buckets) if kind == "push" else self._pull_batch
                following = self._take_adjacent(batch, kind, limit)
                ticket = None
                try:
                    if self._error is None:
                        if device is None:
                            device = blkps.Model(_the_job().target, dtype=self._wire)
                        ticket = self._submit(device, kind, batch)
                except Exception as e:  # reported by step() or the next forward
                    self._error = e
                if ticket is None:
                    self._batch_done(kind, batch, None)
                else:
                    flight[ticket] = (kind, batch, time.perf_counter())
            if flight:
                busy = following is not _NOTHING or not self._work.empty()
                for c in device.complete(timeout=0 if busy else _COMPLETION_POLL_S):
                    kind, batch, submitted = flight.pop(c.ticket)
                    self._batch_done(kind, batch, c.error, time.perf_counter() - submitted)
            if not flight and device is not None:  # counters wait for every submission
                self.faults.note("communication", device)
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
        pull_during_backward, else a push; "pull"); its ticket."""
        first, end = min(b.first for b, _ in batch), max(b.end for b, _ in batch)
        sixteen = self.flat.sixteen
        if kind == "pull":
            into = self.flat.host_weights(first, end)
            self.bytes["pulled"] += into.nbytes
            return (device.submit_pull16_into if sixteen else device.submit_pull_into)(first, into)
        for bucket, zero in batch:
            self._stage_push(bucket, zero)
        host = self.flat.host_pushed(first, end)
        self.bytes["pushed"] += host.nbytes
        self.overlapped += (not self._backward_done) * len(batch)
        if not self.pull_during_backward:
            return (device.submit_push16 if sixteen else device.submit_push)(first, host)
        into = self.flat.host_weights(first, end)
        self.bytes["pulled"] += into.nbytes
        return (device.submit_exchange16 if sixteen else device.submit_exchange)(first, host, into)

    def _batch_done(self, kind, batch, error, seconds=0.0):
        """A submission of `batch` ended (`error`: None, or why it failed;
        a batch never submitted, after an earlier error, ends with None):
        its weights become the parameters' (or land beside them), its
        buckets are released to the training thread."""
        if error is not None and self._error is None:
            self._error = error
        pulled = kind == "pull" or self.pull_during_backward
        if seconds:
            self.transfers += 1
            part = "pull" if kind == "pull" else "exchange" if pulled else "push"
            self.seconds[part] += seconds
            if kind == "push":
                self.pushes += len(batch)
            else:
                self._pull_batch = min(2 * self._pull_batch, len(self.buckets))
        for b, _ in batch:
            if pulled and seconds and error is None:
                self.flat.weights_arrived(b.first, b.end)
                b.landed = self.pipeline
            if pulled:
                b.arrived.set()
            if kind == "push":
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
            if (item is None or item[0] != kind or not (item[1].end == first or item[1].first == end)
                    or (kind == "push" and not item[2] and not self.flat.gradient_copied(item[1].first, item[1].end))):
                return item
            batch.append((item[1], item[2]))
            first, end = min(first, item[1].first), max(end, item[1].end)
        return _NOTHING

    def _stage_push(self, bucket, zero):
        """The host array of the bucket's push: its gradient, or zeros."""
        start = time.perf_counter()
        if zero:
            host = self.flat.host_zeros(bucket.first, bucket.end)
        else:
            host = self.flat.host_gradient(bucket.first, bucket.end, self.push_scale)
        self.seconds["copy_out"] += time.perf_counter() - start
        return host

    def _raise_error(self):
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _push_remaining(self, skipped=False):
        """Pushes the buckets not pushed yet (parameters that got no
        gradient: zeros; a skipped step: zeros, or nothing in async) and
        waits for every push of this step."""
        self._backward_done = True
        for b in self.buckets:
            if not b.queued:
                if skipped and self.mode == "async":
                    b.queued = True  # async counts no writes: a skipped step sends nothing
                else:
                    self._queue(b, zero=skipped)
        start = time.perf_counter()
        with self._idle:
            self._idle.wait_for(lambda: self._pushes_in_flight == 0)
        self.seconds["step_wait"] += time.perf_counter() - start
        self._raise_error()

    def _queue_pipelined(self, skipped=False):
        """A pipeline's step(): each bucket not pushed yet waits for its
        exchange of the previous step (the time in seconds pipeline_wait),
        takes the weights it brought and is pushed (zeros, or nothing in
        async, for a skipped step); this step's exchanges are not waited for."""
        self._backward_done = True
        for b in self.buckets:
            if b.queued:
                continue
            self._await_transfers(b, "pipeline_wait")
            self._raise_error()
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
        self._raise_error()

    def _gradient_step(self, skipped=False):
        if self.skip_nonfinite and not skipped and not self.flat.gradient_finite():
            skipped = True
        self.skipped_steps += skipped
        if self.pipeline:
            self._queue_pipelined(skipped)
        else:
            self._push_remaining(skipped)
        self._follow_pushing_learners()  # for the pulls still to come and the next pushes
        if not self.pipeline and (not self.pull_during_backward or (skipped and self.mode == "async")):
            self.flat.after_compute()
            self._pull_batch = 1  # the step's first pull: one bucket, the first layers'
            for b in reversed(self.buckets):  # the first layers' weights first
                self._queue_pull(b)
        self.flat.release_gradient()
        self.gradient.zero_()
        for b in self.buckets:
            b.waiting, b.queued = b.needed, False
        self._passes = [0] * len(self.layout.named)
        self._backward_done = False
        if self.pipeline:
            pass  # the weights of the exchanges just queued are swapped in next step
        elif not self.overlap_pull:
            self.wait_weights()
        elif self._learning:
            self._learnt()
        self._unread_due = self.overlap_pull
        if self._misuse is not None:
            misuse, self._misuse = self._misuse, None
            raise RuntimeError(misuse)

    # ---- delta mode ----

    def _delta_step(self, closure):
        delta = self.gradient
        delta.copy_(self.weights)  # the weights before the local step
        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        torch.sub(self.weights, delta, out=delta)
        if self._push_device is None:  # pushes on their own connection, as in gradient mode
            self._push_device = blkps.Model(_the_job().target, dtype=self._wire)
        skipped = self.skip_nonfinite and not self.flat.gradient_finite()
        if skipped:
            self.skipped_steps += 1
            delta.zero_()
        self._follow_pushing_learners()
        if self.push_scale != 1.0:
            delta.mul_(self.push_scale)
        if not (skipped and self.mode == "async"):
            self.flat.push_all(self._push_device)
            self.pushes += 1
        self._pull_delta()  # a skipped step's local change is undone here
        return loss

    def _pull_delta(self):
        """Delta mode: the server's weights into the parameters, then the
        look-ahead step (look_ahead times the move since the last pull)."""
        self.flat.pull_all(self.device)

    def _skipped_step(self):
        """A step GradScaler skipped (no step() between two zero_grad()):
        push what bsp and ssp count (zeros), pull."""
        if self.optimizer is None:
            self._gradient_step(skipped=True)
        else:
            self.gradient.zero_()
            self.skipped_steps += 1
            if self.mode != "async":
                if self._push_device is None:
                    self._push_device = blkps.Model(_the_job().target, dtype=self._wire)
                self.flat.push_all(self._push_device)
                self.pushes += 1
            self._pull_delta()
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
        if self._push_device is not None:
            self.faults.note("delta pushes", self._push_device)

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
            self.gradient.zero_()
        else:
            self.optimizer.zero_grad(set_to_none=set_to_none)

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
        if self.optimizer is None and getattr(self, "_comm", None) is not None and self._comm.is_alive():
            self.wait_weights()

    def broadcast(self, values, root_rank, timeout_s):
        """broadcast_parameters() for this model: see there."""
        job = _the_job()
        if self._ctl is None:
            raise ValueError("blkps.torch: broadcast_parameters needs the model's control LUN "
                             "(init(control=...) or BLKPS_CONTROL)")
        self._wait_idle()
        tag = _TAG_PREFIX + self.layout.fingerprint
        if job.size > 1:
            # Every learner has stamped the model's tag (_check_device, when
            # it found none) before root marks it: a stamp read before
            # root's and written after its mark would clear the mark. The
            # fingerprint is in the label, so learners of different models
            # fail here naming both.
            _exchange().exchange(f"broadcast_parameters:{tag}:root{root_rank}", b"")
        if job.rank == root_rank:
            flat = self.weights.detach().to("cpu", copy=True)
            with torch.no_grad():
                for view, v in zip(self.layout.views(flat), values):
                    view.copy_(v.detach())  # in the parameter's own memory order
            self._ctl.command(f"tag={tag}")  # clear the mark while the weights change
            self._ctl.write_weights(flat.numpy())
            self._ctl.command(f"tag={tag}{_BROADCAST_MARK}")
        if job.size > 1:
            # Root has written the weights before it joins: after this round
            # every learner reads them.
            _exchange().exchange(f"broadcast_parameters:{tag}:written", b"")
            seen = self._ctl.status().get("tag", "")
            if seen != tag + _BROADCAST_MARK:
                raise ValueError(f"blkps.torch: rank {root_rank} broadcast no weights of this model "
                                 f"(model tag {seen!r}, expected {tag + _BROADCAST_MARK!r})")
        self.flat.forget_pulls()  # the broadcast is no move of the model (look_ahead)
        self.flat.pull_all(self.device)
        if job.size > 1:
            # Nobody steps before everyone has pulled: in async a quick
            # learner's first push would otherwise reach a slower learner's
            # pull, and that learner would not start from root's weights.
            _exchange().exchange(f"broadcast_parameters:{tag}:pulled", b"")

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
        if comm is not None and comm.is_alive():
            try:
                self.drain()
            except Exception as e:  # raised once everything is closed
                failed = e
            self._work.put(None)
            comm.join()
        if getattr(self, "_forward_hook", None) is not None:
            self._forward_hook.remove()
            self._forward_hook = None
        for conn in (self.device, self._ctl, getattr(self, "_push_device", None)):
            if conn is not None:
                conn.close()
        server, self.metrics_server = getattr(self, "metrics_server", None), None
        if server is not None:
            server.shutdown()
            server.server_close()
        if failed is not None:
            raise failed


_NOTHING = object()  # _take_adjacent: the queue ran empty
_COMPLETION_POLL_S = 0.001  # the communication thread's wait for a completion while the queue is empty
_optimizer = None
_pending_broadcast = None  # root_rank of a broadcast_parameters made before DistributedOptimizer


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
                         op=None, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None, bucket_bytes=DEFAULT_BUCKET_BYTES,
                         pull_during_backward=None, overlap_pull=None, skip_nonfinite=False, look_ahead=None,
                         pipeline=None):
    """Wraps `optimizer` (delta mode) or None (gradient mode) so that step()
    trains through this learner's model target (init()). named_parameters
    (model.named_parameters()) fixes the device layout; it is required in
    gradient mode. The parameters become views into the flat weights and
    keep their values until broadcast_parameters() or the first step()
    makes them the server's (a broadcast_parameters() made before this call
    is carried out on the server now). Refuses, with ValueError, a model
    whose parameter count or fingerprint differs from the device's.
    Horovod's options (doc/pytorch.md "Horovod's API"): compression
    (Compression.none/fp16/bf16: the wire type, which must be the learner
    LUN's dtype), op (None: the server's own combination, except delta
    mode in async and ssp, which pushes 1/size of each step as Average
    does: doc/async.md; Average or Sum: pushes scaled so that a bsp round or N async pushes move the model by
    the learners' mean or sum; Adasum refused), gradient_predivide_factor
    (op Average only; the result is the average whatever the factor),
    backward_passes_per_step (gradients accumulate locally, one push per
    step); num_groups, groups, sparse_as_dense are accepted and change
    nothing (buckets are blkps's grouping). bucket_bytes: gradient mode's
    push size; pull_during_backward: None (yes unless the server's mode is
    bsp or there is no control LUN to ask), True (each bucket's pull goes
    with its push, an exchange) or False (every pull after the step's
    pushes, the first layers' first: doc/pytorch.md "PyTorch"). The model may
    be on the CPU or a CUDA device (doc/gpu.md): the flat buffers live on
    its device, the host copies are staged through page-locked memory.
    overlap_pull (gradient mode; default: True for a CUDA model): step()
    returns once every bucket is pushed and its pull queued; each module's
    forward waits only for its own parameters' weights (wait_weights()
    waits for all). skip_nonfinite: a step whose gradients (delta mode: the
    change of the weights) are NaN or infinite, or that GradScaler skipped
    (zero_grad() with no step() since the last), is not pushed; bsp and ssp
    get zeros so that every parameter is still written once per iteration;
    pushes then wait for step() (no push during backward). look_ahead
    (async and ssp, both modes; default (N-1)/N, N the learners that push
    as the server counts them, read each step: doc/async.md "One N: the
    learners that push"; 0 in bsp and for one learner): after each pull
    the parameters move on by look_ahead
    times the model's move since the previous pull, so the next gradient is
    taken near where the model will be when its push lands (doc/async.md
    "Look-ahead"); 0 leaves them the server's weights. pipeline (gradient
    mode, async and ssp; default True for a CUDA model there, refused in
    bsp and delta mode): step() returns without waiting for its transfers;
    the next step computes on the weights the previous step's exchanges
    brought while this step's gradients are pushed and the weights for the
    step after are pulled (one-step delayed updates; look_ahead's default
    grows by 1; doc/gpu.md "Pipelined learners", and its drain points).
    The result has
    step(closure=None), synchronize(), skip_synchronize(), zero_grad(),
    wait_weights(), drain(), pull_server_weights(), param_groups,
    state_dict(), close(), and counters steps,
    pushes, overlapped, skipped_steps, forward_waits, seconds (gradient
    mode: copy_out, push, pull, exchange, step_wait, weights_wait,
    pipeline_wait), bytes (gradient mode: pushed, pulled on the wire)."""
    global _optimizer, _pending_broadcast
    options = _HorovodOptions(compression, backward_passes_per_step, op, gradient_predivide_factor, process_set)
    if _optimizer is not None:
        _optimizer.close()
        _optimizer = None
    _optimizer = _DistributedOptimizer(optimizer, named_parameters, bucket_bytes, pull_during_backward, options,
                                       overlap_pull, skip_nonfinite, look_ahead, pipeline)
    job = _the_job()  # BLKPS_METRICS_PORT: its counters over HTTP (doc/monitoring.md "Learner metrics")
    _optimizer.metrics_server = _metrics.serve_optimizer(_optimizer, job.rank, job.local_rank)
    if _pending_broadcast is not None:
        root, _pending_broadcast = _pending_broadcast, None
        if _optimizer._ctl is not None or _the_job().size > 1:
            _optimizer.broadcast([p for _, p in _optimizer.layout.named], root, 120.0)
    return _optimizer


def broadcast_parameters(params, root_rank=0, timeout_s=120.0):
    """Every learner gets root_rank's values of `params`
    (model.state_dict() or model.named_parameters()), before or after
    DistributedOptimizer. After it: once every learner has joined (a
    collective round), root writes the model's parameters through the
    control LUN and marks the model's tag; after a second round they all
    pull them, and return once all have (a third): the server and every
    learner hold root's weights, even in async, where the first pushes
    follow at once. Before it: every tensor of `params` (buffers too) is
    broadcast through the collectives, and the server gets root's
    parameters when DistributedOptimizer is created. Afterwards, entries
    that are not the model's parameters (buffers) are broadcast through the
    collectives too (as Horovod does). timeout_s bounds the wait for the
    others."""
    global _pending_broadcast
    items = list(params.items() if hasattr(params, "items") else params)
    if _optimizer is None:
        _broadcast_named_tensors(items, root_rank, "broadcast_parameters", timeout_s)
        _pending_broadcast = root_rank
        return
    given = dict(items)
    values = []
    for name, p in _optimizer.layout.named:
        if name not in given:
            raise ValueError(f"blkps.torch: broadcast_parameters: no value for parameter {name}")
        if tuple(given[name].shape) != tuple(p.shape):
            raise ValueError(f"blkps.torch: broadcast_parameters: {name} has shape "
                             f"{tuple(given[name].shape)}, the model's is {tuple(p.shape)}")
        values.append(given[name])
    _optimizer.broadcast(values, root_rank, timeout_s)
    on_device = {name for name, _ in _optimizer.layout.named}
    rest = [(name, t) for name, t in items if name not in on_device and torch.is_tensor(t)]
    if rest:
        _broadcast_named_tensors(rest, root_rank, "broadcast_buffers", timeout_s)


def broadcast_optimizer_state(optimizer, root_rank=0, model=None):
    """Every learner's optimizer gets root_rank's state (state_dict(): the
    per-parameter state and the hyperparameters), through the collectives;
    before or after DistributedOptimizer (given either the wrapper or the
    torch optimizer). In gradient mode (DistributedOptimizer(None, ...)) the
    state is the server rule's and there is nothing to broadcast. `model`
    is accepted for Horovod's signature."""
    inner = optimizer.optimizer if isinstance(optimizer, _DistributedOptimizer) else optimizer
    if inner is None or _the_job().size == 1:
        return
    state = broadcast_object(inner.state_dict() if rank() == root_rank else None, root_rank,
                             name="broadcast_optimizer_state")
    if rank() != root_rank:
        inner.load_state_dict(state)


# ---- Horovod's optimizer options ----

class _Compressor:
    """A Horovod compressor: compress() returns (tensor, context),
    decompress(tensor, context) the tensor in its own dtype again. On
    blkps, DistributedOptimizer's compression is the wire type
    (`wire_dtype`): the learner LUN's --bsopts dtype."""

    name, wire_dtype, torch_dtype = "none", "float32", None

    @classmethod
    def compress(cls, tensor):
        if cls.torch_dtype is None or not tensor.dtype.is_floating_point:
            return tensor, None
        return tensor.to(cls.torch_dtype), tensor.dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class NoneCompressor(_Compressor):
    """No compression: float32 on the wire."""


class FP16Compressor(_Compressor):
    """IEEE half precision on the wire (a LUN with dtype=float16)."""
    name, wire_dtype, torch_dtype = "fp16", "float16", torch.float16


class BF16Compressor(_Compressor):
    """bfloat16 on the wire (a LUN with dtype=bfloat16)."""
    name, wire_dtype, torch_dtype = "bf16", "bfloat16", torch.bfloat16


class Compression:
    """Horovod's compression choices, plus bf16."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


class _ReduceOp:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


Average, Sum, Adasum = _ReduceOp("Average"), _ReduceOp("Sum"), _ReduceOp("Adasum")
Min, Max, Product = _ReduceOp("Min"), _ReduceOp("Max"), _ReduceOp("Product")


class _ProcessSet:
    """Horovod's global process set: every rank. Other process sets are
    refused (add_process_set is not offered)."""

    def __repr__(self):
        return "global_process_set"


global_process_set = _ProcessSet()


def _check_process_set(process_set):
    if process_set is not None and process_set is not global_process_set:
        raise ValueError("blkps.torch: process sets other than the global one are refused: a blkps job's "
                         "collectives always span all its learners")


class _HorovodOptions:
    """DistributedOptimizer's Horovod options, checked."""

    def __init__(self, compression=None, backward_passes_per_step=1, op=None, gradient_predivide_factor=1.0,
                 process_set=None):
        compression = compression if compression is not None else Compression.none
        if not (isinstance(compression, type) and issubclass(compression, _Compressor)):
            raise ValueError(f"blkps.torch: compression={compression!r} is not one of Compression.none, "
                             "fp16, bf16")
        if op is Adasum:
            raise ValueError("blkps.torch: op=Adasum is refused: the server combines pushes by its rule "
                             "(doc/pytorch.md \"Horovod's API\"); use op=Average or op=Sum")
        if op not in (None, Average, Sum):
            raise ValueError(f"blkps.torch: DistributedOptimizer op={op!r}: expected Average or Sum")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"blkps.torch: backward_passes_per_step={backward_passes_per_step!r}: "
                             "expected a whole number >= 1")
        if not gradient_predivide_factor > 0:
            raise ValueError(f"blkps.torch: gradient_predivide_factor={gradient_predivide_factor!r}: "
                             "expected > 0")
        if gradient_predivide_factor != 1.0 and op is Sum:
            raise ValueError("blkps.torch: gradient_predivide_factor is for op=Average only (as in Horovod)")
        _check_process_set(process_set)
        self.compression, self.op = compression, op
        self.backward_passes_per_step = backward_passes_per_step
        self.gradient_predivide_factor = gradient_predivide_factor

    def push_scale(self, mode, size_, delta):
        """The factor on what a learner pushes so that the model moves as
        `op` says: a bsp round applies the mean of the round's pushes; async
        and ssp apply each push as it comes (doc/pytorch.md "Horovod's API").
        op=None: gradient mode leaves the combination to the server's rule
        (staleness-aware in async and ssp); delta mode in async and ssp
        pushes 1/N of the local step, as op=Average does: the server's
        sum adds each push exactly, and N learners each adding their
        whole step would move the model N times as far as one process
        on the total batch, which diverges with momentum (doc/async.md).
        `size_`: N, the learners of a round (bsp: the launcher's size;
        async and ssp: blkps.pushing_learners)."""
        if self.op is None:
            return 1.0 / size_ if delta and mode != "bsp" else 1.0
        if mode == "bsp":
            return 1.0 if self.op is Average else float(size_)
        return 1.0 / size_ if self.op is Average else 1.0


# ---- Collectives through the server (blkps.collectives) ----

# A rank silent this long is dead; a live rank heartbeats (blkps.collectives).
_COLLECTIVE_DEAD_AFTER_S = 30.0


def _collective_dead_after_s():
    text = os.environ.get("BLKPS_COLLECTIVE_DEAD_S", "")
    try:
        seconds = float(text) if text else _COLLECTIVE_DEAD_AFTER_S
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"blkps.torch: BLKPS_COLLECTIVE_DEAD_S={text}: expected seconds, a number > 0")
    return seconds


def _collectives_control(job):
    """A new Control of the job's control LUN for collectives and heartbeats:
    a sharded job's is shard 0's."""
    control = _open_control(job.control)
    if hasattr(control, "shards"):
        for other in control.shards[1:]:
            other.close()
        control = control.shards[0]
    return control


def _exchange():
    """This process's Exchange on the model's control LUN, opened on first use."""
    job = _the_job()
    if job.exchange is None:
        if job.size > 1 and not job.control:
            raise ValueError("blkps.torch: collectives need the model's control LUN (init(control=...) "
                             "or BLKPS_CONTROL)")
        if job.size == 1:
            job.exchange = _SoloExchange()
        else:
            dead_after = _collective_dead_after_s()
            control = _collectives_control(job)
            try:
                job.exchange = _Exchange(control, job.rank, job.size, job.session, dead_after)
            except Exception:
                control.close()
                raise
    return job.exchange


class _SoloExchange:
    """One learner: every collective is its own data."""
    rounds = 0

    def exchange(self, label, data):
        return [bytes(data)]

    def close(self):
        pass


def _to_bytes(tensor):
    """A CPU copy of `tensor`'s values as bytes (C order)."""
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes() if t.numel() else b""


def _from_bytes(data, dtype, shape):
    """A new CPU tensor of `dtype` and `shape` from bytes."""
    if not data:
        return torch.zeros(shape, dtype=dtype)
    if dtype == torch.bfloat16:
        return torch.frombuffer(bytearray(data), dtype=torch.int16).view(torch.bfloat16).reshape(shape)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def _label(kind, name, tensor, shape=None):
    shape = tuple(tensor.shape) if shape is None else shape
    return f"{kind}:{name or ''}:{str(tensor.dtype).replace('torch.', '')}:{shape}"


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """A new tensor (on `tensor`'s device, of its dtype): the ranks'
    tensors reduced by `op` (Average, the default, Sum, Min, Max, Product;
    average=True/False is Horovod's older spelling). Every rank reduces the
    same bytes in rank order (floating point in float64, integers in int64),
    so every rank gets the same result. prescale_factor multiplies each
    rank's tensor before, postscale_factor the result after; compression
    casts what travels (Compression.fp16: float16). Average of integers
    truncates toward zero."""
    _check_process_set(process_set)
    if op is None:
        op = Sum if average is False else Average
    if op is Adasum:
        raise ValueError("blkps.torch: allreduce op=Adasum is refused: use Average or Sum")
    compression = compression if compression is not None else Compression.none
    device = tensor.device
    sent = tensor.detach()
    if prescale_factor != 1.0:
        sent = sent * prescale_factor
    sent, ctx = compression.compress(sent)
    parts = _exchange().exchange(_label("allreduce", name, sent) + f":{op.name}", _to_bytes(sent))
    wide = torch.float64 if sent.dtype.is_floating_point else torch.int64
    values = [_from_bytes(p, sent.dtype, sent.shape).to(wide) for p in parts]
    if op is Min:
        out = torch.stack(values).min(0).values
    elif op is Max:
        out = torch.stack(values).max(0).values
    elif op is Product:
        out = torch.stack(values).prod(0)
    else:
        out = values[0].clone()
        for v in values[1:]:
            out += v
        if op is Average:
            out = out / len(values) if wide == torch.float64 else torch.div(out, len(values), rounding_mode="trunc")
    if postscale_factor != 1.0:
        out = out * postscale_factor
    out = compression.decompress(out.to(sent.dtype), ctx)
    return out.to(dtype=tensor.dtype, device=device)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None):
    """allreduce() into `tensor` itself; returns it."""
    with torch.no_grad():
        tensor.copy_(allreduce(tensor, average, name, None, op, prescale_factor, postscale_factor,
                               process_set))
    return tensor


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None):
    """allreduce() of each tensor of a list; a list."""
    return [allreduce(t, average, f"{name}.{k}" if name else None, compression, op, prescale_factor,
                      postscale_factor, process_set) for k, t in enumerate(tensors)]


def allgather(tensor, name=None, process_set=None):
    """The ranks' tensors concatenated along the first dimension, in rank
    order (they may differ in that dimension only)."""
    _check_process_set(process_set)
    t = tensor.detach()
    if t.dim() == 0:
        raise ValueError("blkps.torch: allgather needs a tensor of at least one dimension")
    parts = _exchange().exchange(_label("allgather", name, t, tuple(t.shape[1:])), _to_bytes(t))
    row = int(np.prod(t.shape[1:], dtype=np.int64)) * t.element_size()
    gathered = [_from_bytes(p, t.dtype, (len(p) // row if row else 0, *t.shape[1:])) for p in parts]
    return torch.cat(gathered).to(tensor.device)


def broadcast(tensor, root_rank, name=None, process_set=None):
    """A new tensor holding root_rank's `tensor` (same shape and dtype on
    every rank)."""
    _check_process_set(process_set)
    t = tensor.detach()
    mine = _to_bytes(t) if rank() == root_rank else b""
    parts = _exchange().exchange(_label("broadcast", name, t) + f":root{root_rank}", mine)
    return _from_bytes(parts[root_rank], t.dtype, t.shape).to(tensor.device)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """broadcast() into `tensor` itself; returns it."""
    with torch.no_grad():
        tensor.copy_(broadcast(tensor, root_rank, name, process_set))
    return tensor


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's `obj` (anything pickle takes) on every rank."""
    _check_process_set(process_set)
    mine = pickle.dumps(obj) if rank() == root_rank else b""
    parts = _exchange().exchange(f"broadcast_object:{name or ''}:root{root_rank}", mine)
    return pickle.loads(parts[root_rank])


def allgather_object(obj, name=None, process_set=None):
    """Every rank's `obj`, as a list in rank order."""
    _check_process_set(process_set)
    return [pickle.loads(p) for p in _exchange().exchange(f"allgather_object:{name or ''}", pickle.dumps(obj))]


def barrier(process_set=None):
    """Returns once every rank has called it, with the transfers of its
    DistributedOptimizer done (drain()): after it the server holds every
    rank's pushes."""
    _check_process_set(process_set)
    if _optimizer is not None:
        _optimizer.drain()
    _exchange().exchange("barrier", b"")


def _broadcast_named_tensors(items, root_rank, what, timeout_s=None):
    """Copies root_rank's values of the tensors in `items` ([(name,
    tensor)]) into every rank's, in one collective call."""
    items = [(n, t) for n, t in items if torch.is_tensor(t)]
    key = hashlib.sha256(";".join(f"{n}:{t.dtype}:{tuple(t.shape)}" for n, t in items).encode()).hexdigest()[:16]
    mine = b"".join(_to_bytes(t) for _, t in items) if rank() == root_rank else b""
    data = _exchange().exchange(f"{what}:{key}:root{root_rank}", mine)[root_rank]
    at = 0
    with torch.no_grad():
        for _, t in items:
            n = t.numel() * t.element_size()
            t.copy_(_from_bytes(data[at:at + n], t.dtype, t.shape))
            at += n


class _Handle:
    """An async collective's handle: blkps's collectives complete at once."""

    def __init__(self, result):
        self.result = result


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None):
    return _Handle(allreduce(tensor, average, name, None, op, prescale_factor, postscale_factor, process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    return _Handle(allreduce_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allgather_async(tensor, name=None, process_set=None):
    return _Handle(allgather(tensor, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    return _Handle(broadcast(tensor, root_rank, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    return _Handle(broadcast_(tensor, root_rank, name, process_set))


def poll(handle):
    """True: an async collective is done when its call returns."""
    return True


def synchronize(handle):
    """The result of an async collective."""
    return handle.result


# ---- Early stopping ----

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
        if self.stopped and _optimizer is not None:
            _optimizer.drain()  # what is saved after the decision is the server's newest
        if self.stopped and self.stop_job and not asked and rank() == 0:
            request_stop()
        return self.stopped


# ---- Refused, in one line each ----

def join(device=-1):
    raise NotImplementedError("blkps.torch: join is refused: uneven inputs would leave bsp rounds waiting for "
                              "a learner that has stopped; give every learner the same number of steps "
                              "(DistributedSampler does)")


class _Refused:
    """A Horovod module blkps does not offer: any use raises one line."""

    def __init__(self, what, why):
        self._what, self._why = what, why

    def __getattr__(self, name):
        raise NotImplementedError(f"blkps.torch: {self._what}.{name} is refused: {self._why}")


elastic = _Refused("elastic", "a blkps job's learners are its LUNs; a dead learner is left out and "
                              "rejoins by itself (doc/libblkps.md \"Faults\"), no elastic driver is needed")


class SyncBatchNorm(torch.nn.Module):
    """Refused at construction (doc/pytorch.md "Horovod's API")."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("blkps.torch: SyncBatchNorm is refused: blkps shares weights, not "
                                  "activations; use torch.nn.BatchNorm (each learner keeps its own "
                                  "statistics)")


def start_timeline(file_path, mark_cycles=False):
    raise NotImplementedError("blkps.torch: start_timeline is refused: blkps has no Horovod timeline; "
                              "the server's status has per-learner counters")


def stop_timeline():
    raise NotImplementedError("blkps.torch: stop_timeline is refused: blkps has no Horovod timeline")
