"""blkps.torch.horovod: Horovod's names for blkps.torch's optimizer, a thin
face: DistributedOptimizer() checks Horovod's options and translates them
into the core's OptimizerOptions (compression: the wire type; op: how
pushes combine), broadcast_parameters and broadcast_optimizer_state; what
blkps is built with, in Horovod's words; and what blkps cannot do (join,
elastic, SyncBatchNorm, the timeline), refused in one line each. No
Horovod type reaches the core (blkps.torch.optimizer)."""

import torch

from blkps import metrics as _metrics
from blkps.torch import session
from blkps.torch.collectives import Adasum, Average, Sum, broadcast_named_tensors, broadcast_object
from blkps.torch.collectives import check_process_set
from blkps.torch.compression import Compression, Compressor
from blkps.torch.optimizer import Optimizer, OptimizerOptions
from blkps.torch.session import rank, the_job as _the_job


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
                         op=None, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None, bucket_bytes=None,
                         pull_during_backward=None, overlap_pull=None, skip_nonfinite=False, look_ahead=None,
                         pipeline=None, transport=None, tied_head=None):
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
    push size (None: DEFAULT_BUCKET_BYTES, 4 MiB; PIPELINED_BUCKET_BYTES,
    16 MiB, for a pipelined learner); pull_during_backward: None (yes unless the server's mode is
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
    pipeline_wait), bytes (gradient mode: pushed, pulled on the wire).
    tied_head (gradient mode, bsp): the output head module whose weight
    is tied to an earlier use (GPT-2's lm_head, whose weight is wte's); the
    server must take that weight's blocks in two parts
    (--bsopts parts=FIRST:COUNT:2): the head's part is pushed as soon as
    the head's backward is done, the rest at the end
    (doc/pytorch.md "A tied weight in two parts"). A server with parts=
    and no tied_head given is refused, in one line, as is the converse.
    transport (tests and tools): what opens the connections to the model
    target, transport(target, dtype=None) (blkps.torch.pipeline; None:
    blkps.Model)."""
    horovod = _HorovodOptions(compression, backward_passes_per_step, op, gradient_predivide_factor, process_set)
    options = horovod.optimizer_options(bucket_bytes=bucket_bytes, pull_during_backward=pull_during_backward,
                                        overlap_pull=overlap_pull, skip_nonfinite=skip_nonfinite,
                                        look_ahead=look_ahead, pipeline=pipeline, tied_head=tied_head)
    if session.active_optimizer is not None:
        session.active_optimizer.close()
        session.active_optimizer = None
    opt = session.active_optimizer = Optimizer(optimizer, named_parameters, _the_job(), options, transport)
    opt.compression = horovod.compression
    job = _the_job()  # BLKPS_METRICS_PORT: its counters over HTTP (doc/monitoring.md "Learner metrics")
    opt.metrics_server = _metrics.serve_optimizer(opt, job.rank, job.local_rank)
    if session.pending_broadcast is not None:
        (root, timeout_s), session.pending_broadcast = session.pending_broadcast, None
        if opt.has_control or _the_job().size > 1:
            opt.broadcast([p for _, p in opt.layout.named], root, timeout_s)
    return opt


def broadcast_parameters(params, root_rank=0, timeout_s=None):
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
    collectives too (as Horovod does). timeout_s bounds each wait for the
    others (CollectiveTimeout naming those missing); None: they are waited
    for as long as they heartbeat (RankDied once one stops)."""
    items = list(params.items() if hasattr(params, "items") else params)
    opt = session.active_optimizer
    if opt is None:
        broadcast_named_tensors(items, root_rank, "broadcast_parameters", timeout_s)
        session.pending_broadcast = (root_rank, timeout_s)
        return
    given = dict(items)
    values = []
    for name, p in opt.layout.named:
        if name not in given:
            raise ValueError(f"blkps.torch: broadcast_parameters: no value for parameter {name}")
        if tuple(given[name].shape) != tuple(p.shape):
            raise ValueError(f"blkps.torch: broadcast_parameters: {name} has shape "
                             f"{tuple(given[name].shape)}, the model's is {tuple(p.shape)}")
        values.append(given[name])
    opt.broadcast(values, root_rank, timeout_s)
    on_device = {name for name, _ in opt.layout.named}
    rest = [(name, t) for name, t in items if name not in on_device and torch.is_tensor(t)]
    if rest:
        broadcast_named_tensors(rest, root_rank, "broadcast_buffers", timeout_s)


def broadcast_optimizer_state(optimizer, root_rank=0, model=None):
    """Every learner's optimizer gets root_rank's state (state_dict(): the
    per-parameter state and the hyperparameters), through the collectives;
    before or after DistributedOptimizer (given either the wrapper or the
    torch optimizer). In gradient mode (DistributedOptimizer(None, ...)) the
    state is the server rule's and there is nothing to broadcast. `model`
    is accepted for Horovod's signature."""
    inner = optimizer.optimizer if isinstance(optimizer, Optimizer) else optimizer
    if inner is None or _the_job().size == 1:
        return
    state = broadcast_object(inner.state_dict() if rank() == root_rank else None, root_rank,
                             name="broadcast_optimizer_state")
    if rank() != root_rank:
        inner.load_state_dict(state)


class _HorovodOptions:
    """DistributedOptimizer's Horovod options, checked."""

    def __init__(self, compression=None, backward_passes_per_step=1, op=None, gradient_predivide_factor=1.0,
                 process_set=None):
        compression = compression if compression is not None else Compression.none
        if not (isinstance(compression, type) and issubclass(compression, Compressor)):
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
        check_process_set(process_set)
        self.compression, self.op = compression, op
        self.backward_passes_per_step = backward_passes_per_step
        self.gradient_predivide_factor = gradient_predivide_factor

    def optimizer_options(self, **knobs):
        """The core's OptimizerOptions for these options and blkps's own
        `knobs` (bucket_bytes, pipeline, ...): the wire type of the
        compression, op as the combination of pushes."""
        combine = {None: None, Average: "average", Sum: "sum"}[self.op]
        return OptimizerOptions(wire=self.compression.wire_dtype, combine=combine,
                                backward_passes_per_step=self.backward_passes_per_step, **knobs)


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


