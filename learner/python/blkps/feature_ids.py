"""Hashed feature ids: which shard holds an id's row.

A hashed table (doc/embeddings.md "Hashed ids") keys its rows by any 64-bit
id and splits them over shards by a hash of the id. The hash lives in one
place, wire/include/blkps/feature_id.h; this module asks libblkps for it
(blkps_feature_id_shards), so that Python, C and C++ agree on every id.

    >>> import numpy as np, blkps.feature_ids
    >>> blkps.feature_ids.shards(np.array([0, 1, 2**63], dtype=np.uint64), 4)
    array([...], dtype=uint32)
"""
import ctypes

import numpy as np

from . import _library

__all__ = ["shards"]

_declared = False


def shards(ids, count):
    """The shard, 0 .. count-1, of each id in `ids` (any integers that fit
    uint64), as a uint32 array of the same length. Raises ValueError for a
    count below 1 or an id that is negative or does not fit 64 bits."""
    global _declared
    if int(count) < 1:
        raise ValueError(f"shards: a count of at least 1 shard, got {count}")
    try:
        ids = np.ascontiguousarray(np.asarray(ids).astype(np.uint64, casting="safe").ravel())
    except TypeError:
        ids = np.asarray(ids).ravel()
        if ids.dtype.kind not in "iu" or (ids.size and int(ids.min()) < 0):
            raise ValueError("shards: ids are unsigned 64-bit integers (feature hashes); got "
                             f"{ids.dtype} values{' below 0' if ids.dtype.kind == 'i' else ''}") from None
        ids = np.ascontiguousarray(ids.astype(np.uint64))
    lib = _library()
    if not _declared:
        lib.blkps_feature_id_shards.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p]
        lib.blkps_feature_id_shards.restype = None
        _declared = True
    out = np.empty(ids.size, dtype=np.uint32)
    lib.blkps_feature_id_shards(ids.ctypes.data, ids.size, int(count), out.ctypes.data)
    return out
