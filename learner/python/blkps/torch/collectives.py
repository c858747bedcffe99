"""blkps.torch.collectives: Horovod's collectives (allreduce, allgather,
broadcast, broadcast_object, barrier, ...) on torch tensors, carried by the
server: every rank's bytes go through the session's exchange on the
model's control LUN (blkps.collectives), so every rank reduces the same
bytes in rank order and gets the same result. Async variants complete at
once."""

import hashlib
import pickle

import numpy as np
import torch

from blkps.torch import session
from blkps.torch.compression import Compression
from blkps.torch.session import exchange as _exchange, rank


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


def check_process_set(process_set):
    if process_set is not None and process_set is not global_process_set:
        raise ValueError("blkps.torch: process sets other than the global one are refused: a blkps job's "
                         "collectives always span all its learners")


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
    check_process_set(process_set)
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
    check_process_set(process_set)
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
    check_process_set(process_set)
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
    check_process_set(process_set)
    mine = pickle.dumps(obj) if rank() == root_rank else b""
    parts = _exchange().exchange(f"broadcast_object:{name or ''}:root{root_rank}", mine)
    return pickle.loads(parts[root_rank])


def allgather_object(obj, name=None, process_set=None):
    """Every rank's `obj`, as a list in rank order."""
    check_process_set(process_set)
    return [pickle.loads(p) for p in _exchange().exchange(f"allgather_object:{name or ''}", pickle.dumps(obj))]


def barrier(process_set=None):
    """Returns once every rank has called it, with the transfers of its
    DistributedOptimizer done (drain()): after it the server holds every
    rank's pushes."""
    check_process_set(process_set)
    if session.active_optimizer is not None:
        session.active_optimizer.drain()
    _exchange().exchange("barrier", b"")


def broadcast_named_tensors(items, root_rank, what, timeout_s=None):
    """Copies root_rank's values of the tensors in `items` ([(name,
    tensor)]) into every rank's, in one collective call that waits at most
    `timeout_s` for the others (None: as long as they heartbeat)."""
    items = [(n, t) for n, t in items if torch.is_tensor(t)]
    key = hashlib.sha256(";".join(f"{n}:{t.dtype}:{tuple(t.shape)}" for n, t in items).encode()).hexdigest()[:16]
    mine = b"".join(_to_bytes(t) for _, t in items) if rank() == root_rank else b""
    data = _exchange().exchange(f"{what}:{key}:root{root_rank}", mine, timeout_s)[root_rank]
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
