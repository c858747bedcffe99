"""blkps.torch.layout: a model's place on the device. Parameter k of
named_parameters (a shared parameter once) is at [offsets[k], offsets[k] +
numel) of the flat float32 vector, in its own memory order; the model's
fingerprint (names, shapes, channels_last) is kept in the model's tag, and a
model that does not match the device is refused in one line. Gradient
mode's buckets are ranges of that vector cut at 4 KiB boundaries."""

import hashlib
import re

import torch

_BUCKET_ALIGN = 1024            # floats: 4 KiB, whole blocks for every device
TAG_PREFIX = "torch:"


def unique_parameters(named_parameters):
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
    return sum(p.numel() for _, p in unique_parameters(named))


def fingerprint(model):
    """A short hash of the parameters' names and shapes in device order, and
    of the memory order of those kept channels_last (_memory_strides), (an
    nn.Module or its named_parameters()): what the model keeps in its tag."""
    named = model.named_parameters() if isinstance(model, torch.nn.Module) else model
    text = ";".join(f"{name}:{tuple(p.shape)}" + ("" if _memory_strides(p) is None else ":channels_last")
                    for name, p in unique_parameters(named))
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


class Layout:
    """The device's layout of a model: parameter k at [offsets[k], offsets[k]
    + numel) of the flat vector, in named_parameters order, its values in
    its own memory order (a channels_last parameter keeps its layout, so
    its convolutions need no conversion; the fingerprint says so)."""

    def __init__(self, named_parameters):
        self.named = unique_parameters(named_parameters)
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


_COMPRESSION_OF_WIRE = {"float32": "none", "float16": "fp16", "bfloat16": "bf16"}  # in messages


def learner_lun(target_):
    """The learner LUN that an iscsi:// or iser:// target names; None for
    any other target (a file, a block device)."""
    m = re.fullmatch(r"(?:iscsi|iser)://.*/(\d+)", target_ or "")
    return int(m.group(1)) if m else None


def _lun_dtype(status, target_):
    """The learner LUN's dtype as the status shows it: the LUN that an
    iscsi:// or iser:// target names, else the one dtype every attached
    learner LUN has; None when the status cannot tell."""
    learners = [entry for entry in status.get("learners", []) if entry.get("dtype")]
    lun = learner_lun(target_)
    if lun is not None:
        for entry in learners:
            if entry["lun"] == lun:
                return entry["dtype"]
    dtypes = {entry["dtype"] for entry in learners}
    return dtypes.pop() if len(dtypes) == 1 else None


def check_wire(wire, status, device, count, target):
    """Refuses, in one line naming both, a wire type `wire` (float32,
    float16, bfloat16; messages name it as compression= does) that is not
    the dtype of `target`'s learner LUN (the status's, else told float32
    from 16-bit by the device size)."""
    have = _lun_dtype(status, target) if status else None
    if have is None:
        size = device.size_bytes
        if wire == "float32" and size < count * 4:
            have = "16-bit (bfloat16 or float16)"
        elif wire != "float32" and size >= count * 4:
            have = "float32"
    if have is not None and have != wire:
        match = _COMPRESSION_OF_WIRE.get(have)
        hint = f"use compression=Compression.{match}" if match else "use Compression.bf16 or fp16"
        raise ValueError(f"blkps.torch: compression=Compression.{_COMPRESSION_OF_WIRE[wire]} sends {wire} but the "
                         f"learner LUN's dtype is {have}; {hint} or serve the LUN with --bsopts dtype={wire}")


def check_device(layout, device, ctl, bytes_per_param=4):
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
    if tag.startswith(TAG_PREFIX):
        theirs = tag[len(TAG_PREFIX):].split(":", 1)[0]
        if theirs != layout.fingerprint:
            raise ValueError(f"blkps.torch: the model's parameter names and shapes (fingerprint "
                             f"{layout.fingerprint}) differ from the device's ({theirs}); same "
                             f"count {layout.count}: check the model's definition")
    elif not tag:
        ctl.command(f"tag={TAG_PREFIX}{layout.fingerprint}")
    return status


class Bucket:
    """A range [first, end) of the flat vector and the parameters in it."""

    def __init__(self, first, end, members, needed):
        self.first, self.end, self.members = first, end, members
        self.needed = needed         # members that get gradients (requires_grad)
        self.waiting = needed        # of them, those still without this step's gradient
        self.queued = False


def cut_buckets(layout, bucket_floats):
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
        buckets.append(Bucket(first, end, members, needed))
        end = first
    of_param = [[] for _ in layout.named]
    for b in buckets:
        for k in b.members:
            of_param[k].append(b)
    return buckets, of_param
