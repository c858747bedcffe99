"""blkps: a learner's access to a blkps model device (ctypes over libblkps.so).

The model is a flat float32 vector on a block device: parameter i lives at
byte 4*i. ``push`` sends gradients (the server applies them), ``pull`` reads
the current weights::

    import numpy as np
    import blkps

    with blkps.Model("iscsi://10.0.0.1/iqn.2026-11.io.blkps:t1/1") as model:
        w = model.pull(0, 1000)
        model.push(0, np.ones(1000, dtype=np.float32))

A target is a file or block device path, iscsi://host[:port]/<target-iqn>/<lun>
or iser://... (same shape). Errors raise ``OSError(errno, message)`` with
libblkps's one-line message.

A Model is used by one thread at a time; open one per thread. The library
releases the GIL during transfers.

libblkps.so is found from $BLKPS_LIB, else <repo>/build/cmake/learner/ next to
this file's checkout, else the system library path.
"""

import ctypes
import ctypes.util
import errno
import os

import numpy as np

__all__ = ["Model"]

_FLOAT_P = ctypes.POINTER(ctypes.c_float)


class _OpenOptions(ctypes.Structure):
    _fields_ = [
        ("request_bytes", ctypes.c_uint32),
        ("queue_depth", ctypes.c_uint32),
        ("initiator_name", ctypes.c_char_p),
    ]


def _library_path():
    path = os.environ.get("BLKPS_LIB")
    if path:
        return path
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    built = os.path.join(repo, "build", "cmake", "learner", "libblkps.so")
    if os.path.exists(built):
        return built
    found = ctypes.util.find_library("blkps")
    if found:
        return found
    raise OSError(errno.ENOENT,
                  "blkps: libblkps.so not found; build it "
                  "(cmake --build build/cmake) or set BLKPS_LIB to its path")


def _declare(lib):
    handle = ctypes.c_void_p
    lib.blkps_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(_OpenOptions),
                               ctypes.POINTER(handle), ctypes.c_char_p,
                               ctypes.c_size_t]
    lib.blkps_open.restype = ctypes.c_int
    lib.blkps_close.argtypes = [handle]
    lib.blkps_close.restype = None
    lib.blkps_size_bytes.argtypes = [handle]
    lib.blkps_size_bytes.restype = ctypes.c_uint64
    lib.blkps_logical_block_size.argtypes = [handle]
    lib.blkps_logical_block_size.restype = ctypes.c_uint32
    lib.blkps_push.argtypes = [handle, ctypes.c_uint64, _FLOAT_P, ctypes.c_uint64]
    lib.blkps_push.restype = ctypes.c_int
    lib.blkps_pull.argtypes = [handle, ctypes.c_uint64, _FLOAT_P, ctypes.c_uint64]
    lib.blkps_pull.restype = ctypes.c_int
    lib.blkps_read_bytes.argtypes = [handle, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]
    lib.blkps_read_bytes.restype = ctypes.c_int
    lib.blkps_write_bytes.argtypes = [handle, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64]
    lib.blkps_write_bytes.restype = ctypes.c_int
    lib.blkps_sync.argtypes = [handle]
    lib.blkps_sync.restype = ctypes.c_int
    lib.blkps_last_error.argtypes = [handle]
    lib.blkps_last_error.restype = ctypes.c_char_p
    return lib


_lib = None


def _library():
    """Loads libblkps.so on first use, so that importing never fails."""
    global _lib
    if _lib is None:
        _lib = _declare(ctypes.CDLL(_library_path()))
    return _lib


class Model:
    """An open model device. Close it with close() or a with-block."""

    def __init__(self, target, request_bytes=0, queue_depth=0,
                 initiator_name=None):
        """Opens `target`. request_bytes (per I/O request) and queue_depth
        (requests in flight) of 0 take libblkps's defaults (1 MiB, or 512 KiB
        for iser://; 16); initiator_name is the iSCSI initiator IQN (None:
        libblkps's default)."""
        lib = _library()
        options = _OpenOptions(
            request_bytes, queue_depth,
            initiator_name.encode() if initiator_name is not None else None)
        handle = ctypes.c_void_p()
        message = ctypes.create_string_buffer(1024)
        rc = lib.blkps_open(os.fsencode(target), ctypes.byref(options),
                            ctypes.byref(handle), message, len(message))
        if rc != 0:
            raise OSError(-rc, message.value.decode(errors="replace"))
        self._lib = lib
        self._handle = handle

    @property
    def size_bytes(self):
        """Device size in bytes (parameters: size_bytes // 4)."""
        return self._lib.blkps_size_bytes(self._open_handle())

    @property
    def logical_block_size(self):
        return self._lib.blkps_logical_block_size(self._open_handle())

    def push(self, first_param, grad):
        """Sends gradients for parameters [first_param, first_param + grad.size).
        grad is converted to a C-contiguous float32 array if it is not one
        already (then it is copied). Partial blocks are padded with zero
        gradients, which leave those parameters unchanged."""
        grad = np.ascontiguousarray(grad, dtype=np.float32)
        self._check(self._lib.blkps_push(self._open_handle(), first_param,
                                         grad.ctypes.data_as(_FLOAT_P), grad.size))

    def pull(self, first_param, count):
        """Returns the current weights of parameters
        [first_param, first_param + count) as a new float32 array."""
        return self.pull_into(first_param, np.empty(count, dtype=np.float32))

    def pull_into(self, first_param, out):
        """Reads the weights of parameters [first_param, first_param + out.size)
        into `out`, a writable C-contiguous float32 array; returns out."""
        if (not isinstance(out, np.ndarray) or out.dtype != np.float32
                or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError("blkps: pull_into needs a writable C-contiguous "
                             "float32 numpy array")
        self._check(self._lib.blkps_pull(self._open_handle(), first_param,
                                         out.ctypes.data_as(_FLOAT_P), out.size))
        return out

    def read_bytes(self, offset, length):
        """Returns device bytes [offset, offset + length) as bytes (e.g. the
        control LUN's status region)."""
        buf = ctypes.create_string_buffer(length)
        self._check(self._lib.blkps_read_bytes(self._open_handle(), offset, buf, length))
        return buf.raw

    def write_bytes(self, offset, data):
        """Writes `data` (bytes) at device byte `offset` (e.g. a command to
        the control LUN)."""
        self._check(self._lib.blkps_write_bytes(self._open_handle(), offset, bytes(data), len(data)))

    def sync(self):
        """Returns once the server has checkpointed the model durably."""
        self._check(self._lib.blkps_sync(self._open_handle()))

    def close(self):
        """Closes the device; further calls raise ValueError. Idempotent."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            self._lib.blkps_close(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        self.close()

    def _open_handle(self):
        if self._handle is None:
            raise ValueError("blkps: operation on a closed Model")
        return self._handle

    def _check(self, rc):
        if rc != 0:
            message = self._lib.blkps_last_error(self._handle)
            raise OSError(-rc, message.decode(errors="replace"))
