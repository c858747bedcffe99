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
a 16-bit wire on the GPU (blkps.torch.staging, doc/gpu.md). In gradient mode a hook on each parameter's
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

The package (doc/pytorch.md "Package layout"): session (ranks, the
launcher's environment, the job's control), layout (the device's layout
of a model, buckets), staging (the flat buffers and host staging),
optimizer (the core, with its own OptimizerOptions), delta (delta mode's
steps), weights_broadcast (broadcast_parameters through the server),
pipeline (the one module that opens connections to the model target,
through an injectable transport, and the communication thread),
collectives, compression, early_stopping, embedding, tied (a tied weight
pushed in two parts), and horovod (Horovod's names, translated into the core's). This file only
re-exports.
"""

from blkps.collectives import CollectiveTimeout, RankDied
from blkps.torch.collectives import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async,
                                     allgather_object, allreduce, allreduce_, allreduce_async, allreduce_async_,
                                     barrier, broadcast, broadcast_, broadcast_async, broadcast_async_,
                                     broadcast_object, global_process_set, grouped_allreduce, poll, synchronize)
from blkps.torch.compression import Compression
from blkps.torch.early_stopping import EarlyStopping, request_stop, stop_requested
from blkps.torch.embedding import Embedding, EmbeddingBag
from blkps.torch.horovod import (DistributedOptimizer, SyncBatchNorm, broadcast_optimizer_state,
                                 broadcast_parameters, ccl_built, cuda_built, ddl_built, elastic, gloo_built,
                                 gloo_enabled, join, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                                 rocm_built, start_timeline, stop_timeline)
from blkps.torch.layout import fingerprint, param_count
from blkps.torch.optimizer import DEFAULT_BUCKET_BYTES, PIPELINED_BUCKET_BYTES
from blkps.torch.session import (control, cross_rank, cross_size, init, is_initialized, local_rank, local_size,
                                 rank, shutdown, size, target)

__all__ = ["init", "rank", "size", "local_rank", "target", "control", "param_count",
           "fingerprint", "DistributedOptimizer", "broadcast_parameters", "DEFAULT_BUCKET_BYTES",
           "PIPELINED_BUCKET_BYTES",
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
           "stop_requested", "request_stop", "EarlyStopping", "RankDied", "CollectiveTimeout",
           # rows on the server (blkps.torch.embedding)
           "Embedding", "EmbeddingBag"]
