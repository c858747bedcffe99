"""blkps.torch.compression: Horovod's compression choices, plus bf16. On
blkps, DistributedOptimizer's compression is the wire type (`wire_dtype`):
the learner LUN's --bsopts dtype; allreduce(compression=...) casts what
travels."""

import torch


class Compressor:
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


class NoneCompressor(Compressor):
    """No compression: float32 on the wire."""


class FP16Compressor(Compressor):
    """IEEE half precision on the wire (a LUN with dtype=float16)."""
    name, wire_dtype, torch_dtype = "fp16", "float16", torch.float16


class BF16Compressor(Compressor):
    """bfloat16 on the wire (a LUN with dtype=bfloat16)."""
    name, wire_dtype, torch_dtype = "bf16", "bfloat16", torch.bfloat16


class Compression:
    """Horovod's compression choices, plus bf16."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
