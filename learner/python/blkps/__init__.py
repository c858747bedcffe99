"""blkps: a learner's access to a blkps model device (ctypes over libblkps.so).

The model is a flat float32 vector on a block device: parameter i lives at
byte 4*i (2*i on a LUN with a 16-bit ``dtype``). ``push`` sends gradients (the
server applies them), ``pull`` reads the current weights::

    import numpy as np
    import blkps

    with blkps.Model("iscsi://10.0.0.1/iqn.2026-11.io.blkps:t1/1") as model:
        w = model.pull(0, 1000)
        model.push(0, np.ones(1000, dtype=np.float32))

A target is a file or block device path, iscsi://host[:port]/<target-iqn>/<lun>,
iser://... (same shape) or layout:PATH (a model striped over shards; see
doc/server.md "Sharding"). ``submit_push``/``submit_pull_into``/``submit_exchange``
return a ticket at once and ``complete`` reports them (doc/libblkps.md
"Streaming"). ``Engine`` is the double-buffered training loop. Errors
raise ``OSError(errno, message)`` with libblkps's one-line message.

A Model is used by one thread at a time; open one per thread. The library
releases the GIL during transfers.

libblkps.so is found from $BLKPS_LIB, else where `cmake --install` put it
beside this package (any prefix: _installed.py, written at install, has the
relative path), else <repo>/build/cmake/learner/ next to this file's
checkout, else the system library path.
"""

import contextlib
import ctypes
import ctypes.util
import errno
import os
import threading

import numpy as np

__all__ = ["Model", "Engine", "Completion"]

_FLOAT_P = ctypes.POINTER(ctypes.c_float)


class _OpenOptions(ctypes.Structure):
    _fields_ = [
        ("request_bytes", ctypes.c_uint32),
        ("queue_depth", ctypes.c_uint32),
        ("initiator_name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("sessions", ctypes.c_uint32),
    ]


class _EngineOptions(ctypes.Structure):
    _fields_ = [
        ("open", _OpenOptions),
        ("first_param", ctypes.c_uint64),
        ("param_count", ctypes.c_uint64),
        ("double_buffering", ctypes.c_int),
        ("adaptive_pull", ctypes.c_int),
        ("smoothing", ctypes.c_double),
        ("control_target", ctypes.c_char_p),
        ("drop_ratio", ctypes.c_double),
        ("drop_run_params", ctypes.c_uint64),
        ("drop_group_params", ctypes.c_uint64),
    ]


class _Completion(ctypes.Structure):
    _fields_ = [
        ("ticket", ctypes.c_uint64),
        ("result", ctypes.c_int32),
        ("error", ctypes.c_char * 512),
    ]


class _EngineMetrics(ctypes.Structure):
    _fields_ = [
        ("iteration", ctypes.c_uint64),
        ("compute_s", ctypes.c_double),
        ("stall_s", ctypes.c_double),
        ("push_s", ctypes.c_double),
        ("pull_s", ctypes.c_double),
        ("bubble_s", ctypes.c_double),
        ("staleness", ctypes.c_int64),
        ("concurrent", ctypes.c_int),
    ]


def _library_path():
    path = os.environ.get("BLKPS_LIB")
    if path:
        return path
    try:
        from . import _installed  # only in an installed copy (packaging/CMakeLists.txt)
        return os.path.normpath(os.path.join(os.path.dirname(__file__), _installed.LIBRARY))
    except ImportError:
        pass
    # <repo>/learner/python/blkps/__init__.py -> <repo>
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
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
    lib.blkps_param_capacity.argtypes = [handle]
    lib.blkps_param_capacity.restype = ctypes.c_uint64
    lib.blkps_logical_block_size.argtypes = [handle]
    lib.blkps_logical_block_size.restype = ctypes.c_uint32
    lib.blkps_push.argtypes = [handle, ctypes.c_uint64, _FLOAT_P, ctypes.c_uint64]
    lib.blkps_push.restype = ctypes.c_int
    lib.blkps_pull.argtypes = [handle, ctypes.c_uint64, _FLOAT_P, ctypes.c_uint64]
    lib.blkps_pull.restype = ctypes.c_int
    lib.blkps_exchange.argtypes = [handle, ctypes.c_uint64, _FLOAT_P, _FLOAT_P, ctypes.c_uint64]
    lib.blkps_exchange.restype = ctypes.c_int
    lib.blkps_push16.argtypes = [handle, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]
    lib.blkps_push16.restype = ctypes.c_int
    lib.blkps_pull16.argtypes = [handle, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]
    lib.blkps_pull16.restype = ctypes.c_int
    lib.blkps_exchange16.argtypes = [handle, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
    lib.blkps_exchange16.restype = ctypes.c_int
    _TICKET_P = ctypes.POINTER(ctypes.c_uint64)
    # Submissions take every array as its address (Model._submit).
    for name in ("blkps_submit_push", "blkps_submit_pull", "blkps_submit_push16", "blkps_submit_pull16"):
        getattr(lib, name).argtypes = [handle, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, _TICKET_P]
        getattr(lib, name).restype = ctypes.c_int
    for name in ("blkps_submit_exchange", "blkps_submit_exchange16"):
        getattr(lib, name).argtypes = [handle, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64,
                                       _TICKET_P]
        getattr(lib, name).restype = ctypes.c_int
    lib.blkps_complete.argtypes = [handle, ctypes.POINTER(_Completion), ctypes.c_size_t, ctypes.c_int]
    lib.blkps_complete.restype = ctypes.c_int
    lib.blkps_outstanding.argtypes = [handle]
    lib.blkps_outstanding.restype = ctypes.c_uint64
    lib.blkps_wake.argtypes = [handle]
    lib.blkps_wake.restype = None
    _U64_P = ctypes.POINTER(ctypes.c_uint64)
    lib.blkps_pull_rows.argtypes = [handle, _U64_P, ctypes.c_uint64, ctypes.c_uint64, _FLOAT_P]
    lib.blkps_pull_rows.restype = ctypes.c_int
    lib.blkps_push_rows.argtypes = [handle, _U64_P, ctypes.c_uint64, ctypes.c_uint64, _FLOAT_P]
    lib.blkps_push_rows.restype = ctypes.c_int
    lib.blkps_table_width.argtypes = [handle]
    lib.blkps_table_width.restype = ctypes.c_uint64
    lib.blkps_table_hashed.argtypes = [handle]
    lib.blkps_table_hashed.restype = ctypes.c_int
    lib.blkps_read_bytes.argtypes = [handle, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]
    lib.blkps_read_bytes.restype = ctypes.c_int
    lib.blkps_write_bytes.argtypes = [handle, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64]
    lib.blkps_write_bytes.restype = ctypes.c_int
    lib.blkps_sync.argtypes = [handle]
    lib.blkps_sync.restype = ctypes.c_int
    lib.blkps_pushed_bytes_lost.argtypes = [handle]
    lib.blkps_pushed_bytes_lost.restype = ctypes.c_uint64
    lib.blkps_reconnects.argtypes = [handle]
    lib.blkps_reconnects.restype = ctypes.c_uint64
    lib.blkps_reconnect_seconds.argtypes = [handle]
    lib.blkps_reconnect_seconds.restype = ctypes.c_double
    lib.blkps_engine_pushed_bytes_lost.argtypes = [handle]
    lib.blkps_engine_pushed_bytes_lost.restype = ctypes.c_uint64
    lib.blkps_last_error.argtypes = [handle]
    lib.blkps_last_error.restype = ctypes.c_char_p
    # The learner engine.
    lib.blkps_engine_options_init.argtypes = [ctypes.POINTER(_EngineOptions)]
    lib.blkps_engine_options_init.restype = None
    lib.blkps_engine_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(_EngineOptions),
                                      ctypes.POINTER(handle), ctypes.c_char_p,
                                      ctypes.c_size_t]
    lib.blkps_engine_open.restype = ctypes.c_int
    lib.blkps_engine_param_count.argtypes = [handle]
    lib.blkps_engine_param_count.restype = ctypes.c_uint64
    lib.blkps_engine_weights.argtypes = [handle]
    lib.blkps_engine_weights.restype = _FLOAT_P
    lib.blkps_engine_gradient.argtypes = [handle]
    lib.blkps_engine_gradient.restype = _FLOAT_P
    for name in ("blkps_engine_step", "blkps_engine_finish"):
        getattr(lib, name).argtypes = [handle]
        getattr(lib, name).restype = ctypes.c_int
    lib.blkps_engine_last_metrics.argtypes = [handle, ctypes.POINTER(_EngineMetrics)]
    lib.blkps_engine_last_metrics.restype = None
    lib.blkps_engine_gradients_pushed.argtypes = [handle]
    lib.blkps_engine_gradients_pushed.restype = ctypes.c_uint64
    lib.blkps_engine_params_pushed.argtypes = [handle]
    lib.blkps_engine_params_pushed.restype = ctypes.c_uint64
    lib.blkps_engine_stop_requested.argtypes = [handle]
    lib.blkps_engine_stop_requested.restype = ctypes.c_int
    lib.blkps_engine_residual.argtypes = [handle]
    lib.blkps_engine_residual.restype = _FLOAT_P
    lib.blkps_engine_last_error.argtypes = [handle]
    lib.blkps_engine_last_error.restype = ctypes.c_char_p
    lib.blkps_engine_close.argtypes = [handle]
    lib.blkps_engine_close.restype = None
    return lib


_lib = None


def _check_mirrors(lib, mirrors):
    """Raises OSError (EPROTO), one line, unless every ctypes mirror in
    `mirrors` (C struct name -> ctypes.Structure) has the size libblkps
    reports for the C struct (blkps_struct_size): a package and a library
    of different builds must not misread each other's structs."""
    try:
        lib.blkps_struct_size.argtypes = [ctypes.c_char_p]
    except AttributeError:
        raise OSError(errno.EPROTO, f"blkps: libblkps ({lib._name}) has no blkps_struct_size: it is older "
                      "than the Python package; use the package and the library of one build") from None
    lib.blkps_struct_size.restype = ctypes.c_size_t
    for name, mirror in mirrors.items():
        c_bytes = lib.blkps_struct_size(name.encode())
        if c_bytes != ctypes.sizeof(mirror):
            raise OSError(errno.EPROTO,
                          f"blkps: {name} is {c_bytes} bytes in libblkps ({lib._name}) but "
                          f"{ctypes.sizeof(mirror)} in the Python package ({__file__}): they are from "
                          "different builds; use the package and the library of one build")


_MIRRORS = {"blkps_open_options": _OpenOptions, "blkps_engine_options": _EngineOptions,
            "blkps_engine_metrics": _EngineMetrics, "blkps_completion": _Completion}


def _library():
    """Loads libblkps.so on first use, so that importing never fails, and
    checks this module's struct mirrors against it."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(_library_path())
        _check_mirrors(lib, _MIRRORS)
        _lib = _declare(lib)
    return _lib


def _open_options(request_bytes, queue_depth, initiator_name, dtype, sessions=0):
    """blkps_open_options from Model's and Engine's keyword arguments."""
    return _OpenOptions(
        request_bytes, queue_depth,
        initiator_name.encode() if initiator_name is not None else None,
        dtype.encode() if dtype is not None else None, sessions)


class _Handle:
    """What Model and Engine share: a libblkps handle, opened by the
    subclass's constructor (through _open) and freed by `_CLOSE`; errors
    raise OSError(errno, message) with the handle's last error (`_LAST_ERROR`).
    close() is idempotent; later calls raise ValueError."""

    _CLOSE = _LAST_ERROR = None  # names of the libblkps functions

    def _open(self, open_fn, target, options):
        """Calls open_fn(target, options, &handle, message, len) and keeps the
        handle; raises OSError with libblkps's one-line message."""
        lib = _library()
        handle = ctypes.c_void_p()
        message = ctypes.create_string_buffer(1024)
        rc = getattr(lib, open_fn)(os.fsencode(target), ctypes.byref(options),
                                   ctypes.byref(handle), message, len(message))
        if rc != 0:
            raise OSError(-rc, message.value.decode(errors="replace"))
        self._lib = lib
        self._handle = handle

    def close(self):
        """Frees the handle (see the class's docs for what that does)."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            getattr(self._lib, self._CLOSE)(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        self.close()

    def _open_handle(self):
        if self._handle is None:
            raise ValueError(f"blkps: operation on a closed {type(self).__name__}")
        return self._handle

    def _check(self, rc):
        if rc != 0:
            message = getattr(self._lib, self._LAST_ERROR)(self._handle)
            raise OSError(-rc, message.decode(errors="replace"))


def _float32_out(what, out):
    """`out` checked: a writable C-contiguous float32 numpy array."""
    if (not isinstance(out, np.ndarray) or out.dtype != np.float32
            or not out.flags.c_contiguous or not out.flags.writeable):
        raise ValueError(f"blkps: {what} needs a writable C-contiguous float32 numpy array")
    return out


def _uint16_in(what, grad):
    """`grad` checked: a C-contiguous uint16 numpy array (16-bit values)."""
    if not isinstance(grad, np.ndarray) or grad.dtype != np.uint16 or not grad.flags.c_contiguous:
        raise ValueError(f"blkps: {what} needs `grad` as a C-contiguous uint16 numpy array")
    return grad


def _uint16_out(what, out):
    """`out` checked: a writable C-contiguous uint16 numpy array."""
    if (not isinstance(out, np.ndarray) or out.dtype != np.uint16
            or not out.flags.c_contiguous or not out.flags.writeable):
        raise ValueError(f"blkps: {what} needs a writable C-contiguous uint16 numpy array")
    return out


def _exchange_out(what, grad, out):
    """`out` for an exchange of `grad` (None: a new array of grad's dtype),
    checked: writable, C-contiguous, grad's dtype and size, and either grad
    itself or apart from it."""
    if out is None:
        out = np.empty(grad.size, dtype=grad.dtype)
    if (not isinstance(out, np.ndarray) or out.dtype != grad.dtype
            or not out.flags.c_contiguous or not out.flags.writeable):
        raise ValueError(f"blkps: {what} needs `out` as a writable C-contiguous {grad.dtype} numpy array")
    if out.size != grad.size:
        raise ValueError(f"blkps: {what}: out holds {out.size} values, grad {grad.size}")
    if out.ctypes.data != grad.ctypes.data and np.may_share_memory(out, grad):
        raise ValueError(f"blkps: {what}: out overlaps grad; pass grad itself or a separate array")
    return out


class Completion:
    """The end of a submission (Model.submit_*; doc/libblkps.md "Streaming"):
    `ticket` as the submission returned it, `out` the array it filled (None
    for a push), `error` None or the OSError the synchronous call would have
    raised. result() returns `out` or raises `error`."""

    __slots__ = ("ticket", "out", "error")

    def __init__(self, ticket, out, error):
        self.ticket, self.out, self.error = ticket, out, error

    def result(self):
        if self.error is not None:
            raise self.error
        return self.out

    def __repr__(self):
        return f"Completion(ticket={self.ticket}, error={self.error!r})"


class Model(_Handle):
    """An open model device. Close it with close() or a with-block (which
    closes the device and logs out of its iSCSI session)."""

    _CLOSE, _LAST_ERROR = "blkps_close", "blkps_last_error"

    def __init__(self, target, request_bytes=0, queue_depth=0,
                 initiator_name=None, dtype=None, sessions=0):
        """Opens `target`. request_bytes (per I/O request) and queue_depth
        (requests in flight) of 0 take libblkps's defaults (1 MiB, or 256 KiB
        for iser://, its most; 16); initiator_name is the iSCSI initiator IQN (None:
        libblkps's default). dtype is the LUN's --bsopts dtype: None or
        "float32", "bfloat16", "float16" (doc/server.md "16-bit wire"); push and
        pull still take and give float32 arrays. sessions: iSCSI sessions per
        LUN (each shard's), 0 or 1 = one (doc/libblkps.md "Several sessions
        per LUN")."""
        self._submitted = {}  # ticket -> (grad, out), alive until completed
        self._wake_lock = threading.Lock()  # wake() against close()
        self._open("blkps_open", target,
                   _open_options(request_bytes, queue_depth, initiator_name, dtype, sessions))

    @property
    def size_bytes(self):
        """Device size in bytes."""
        return self._lib.blkps_size_bytes(self._open_handle())

    @property
    def param_capacity(self):
        """Parameters the device holds: size_bytes // 4, or // 2 on a 16-bit
        device."""
        return self._lib.blkps_param_capacity(self._open_handle())

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
        _float32_out("pull_into", out)
        self._check(self._lib.blkps_pull(self._open_handle(), first_param,
                                         out.ctypes.data_as(_FLOAT_P), out.size))
        return out

    def exchange(self, first_param, grad, out=None):
        """push(first_param, grad) then pull_into(first_param, out), pipelined:
        each request's pull starts once its push has completed, while later
        pushes are in flight (doc/libblkps.md "Exchange"). The weights include
        this push. `out`: a writable C-contiguous float32 array of grad's size
        (grad itself is allowed: in place), or None for a new one; returns
        out."""
        grad = np.ascontiguousarray(grad, dtype=np.float32)
        out = _exchange_out("exchange", grad, out)
        self._check(self._lib.blkps_exchange(self._open_handle(), first_param,
                                             grad.ctypes.data_as(_FLOAT_P),
                                             out.ctypes.data_as(_FLOAT_P), grad.size))
        return out

    def exchange16(self, first_param, grad, out=None):
        """On a 16-bit device: exchange() in the device dtype's bit patterns,
        as push16 and pull16_into take them: `grad` a C-contiguous uint16
        array, `out` a writable C-contiguous uint16 array of its size (grad
        itself is allowed) or None for a new one; returns out. Raises on a
        float32 device or a NaN/infinite value (nothing sent)."""
        out = _exchange_out("exchange16", _uint16_in("exchange16", grad), out)
        self._check(self._lib.blkps_exchange16(self._open_handle(), first_param, grad.ctypes.data,
                                               out.ctypes.data, grad.size))
        return out

    def push16(self, first_param, grad):
        """On a 16-bit device: sends `grad`, a C-contiguous uint16 array of
        the device dtype's bit patterns (e.g. a torch bfloat16 tensor's
        .view(torch.int16).numpy().view(np.uint16)), as is: no conversion,
        no copy. Raises on a float32 device or a NaN/infinite value."""
        _uint16_in("push16", grad)
        self._check(self._lib.blkps_push16(self._open_handle(), first_param, grad.ctypes.data, grad.size))

    def pull16_into(self, first_param, out):
        """On a 16-bit device: reads the weights of parameters
        [first_param, first_param + out.size) as the device's 16-bit values
        into `out`, a writable C-contiguous uint16 array; returns out."""
        _uint16_out("pull16_into", out)
        self._check(self._lib.blkps_pull16(self._open_handle(), first_param, out.ctypes.data, out.size))
        return out

    # ---- Streaming (doc/libblkps.md "Streaming") ----------------------------
    # Each submit_* checks its arguments as the call of its name does (same
    # errors: ValueError for a wrong array, OSError for a range or value the
    # library refuses; then nothing is sent), returns a ticket (an int > 0)
    # at once, and keeps its arrays alive until complete() returns that
    # ticket: do not change `grad` or read `out` before. complete() hands
    # back Completions, each ticket once, in the order they ended.

    def _submit(self, function, first_param, grad, out):
        """Calls libblkps's `function` and keeps (grad, out) until the
        ticket completes; returns the ticket."""
        ticket = ctypes.c_uint64()
        values = (ctypes.c_void_p(grad.ctypes.data) if grad is not None else None,
                  ctypes.c_void_p(out.ctypes.data) if out is not None else None)
        count = (grad if grad is not None else out).size
        args = [v for v in values if v is not None]
        self._check(getattr(self._lib, function)(self._open_handle(), first_param, *args, count,
                                                 ctypes.byref(ticket)))
        self._submitted[ticket.value] = (grad, out)
        return ticket.value

    def submit_push(self, first_param, grad):
        """push() that returns a ticket at once. grad is copied to a
        C-contiguous float32 array first if it is not one."""
        grad = np.ascontiguousarray(grad, dtype=np.float32)
        return self._submit("blkps_submit_push", first_param, grad, None)

    def submit_pull_into(self, first_param, out):
        """pull_into() that returns a ticket at once; `out` is filled when
        the ticket completes (its Completion's `out`)."""
        return self._submit("blkps_submit_pull", first_param, None, _float32_out("submit_pull_into", out))

    def submit_exchange(self, first_param, grad, out=None):
        """exchange() that returns a ticket at once; the weights land in
        `out` (None: a new array, the Completion's `out`)."""
        grad = np.ascontiguousarray(grad, dtype=np.float32)
        return self._submit("blkps_submit_exchange", first_param, grad, _exchange_out("submit_exchange", grad, out))

    def submit_push16(self, first_param, grad):
        """push16() that returns a ticket at once."""
        return self._submit("blkps_submit_push16", first_param, _uint16_in("submit_push16", grad), None)

    def submit_pull16_into(self, first_param, out):
        """pull16_into() that returns a ticket at once."""
        return self._submit("blkps_submit_pull16", first_param, None, _uint16_out("submit_pull16_into", out))

    def submit_exchange16(self, first_param, grad, out=None):
        """exchange16() that returns a ticket at once."""
        grad = _uint16_in("submit_exchange16", grad)
        return self._submit("blkps_submit_exchange16", first_param, grad,
                            _exchange_out("submit_exchange16", grad, out))

    def complete(self, timeout=None, max_completions=64):
        """Up to max_completions ended submissions as a list of Completion,
        in the order they ended. Waits up to `timeout` seconds (None: without
        limit) for the first when none has ended; returns [] on timeout or
        when nothing is outstanding. The GIL is released while it waits."""
        timeout_ms = -1 if timeout is None else max(0, int(timeout * 1000))
        ended = (_Completion * max_completions)()
        n = self._lib.blkps_complete(self._open_handle(), ended, max_completions, timeout_ms)
        if n < 0:
            self._check(n)
        completions = []
        for c in ended[:n]:
            _, out = self._submitted.pop(c.ticket, (None, None))
            error = OSError(-c.result, c.error.decode(errors="replace")) if c.result != 0 else None
            completions.append(Completion(c.ticket, out, error))
        return completions

    @property
    def outstanding(self):
        """Tickets submitted and not yet returned by complete()."""
        return self._lib.blkps_outstanding(self._open_handle())

    def wake(self):
        """Ends the wait of a complete() now waiting, or else of the next
        one, as if its timeout had passed. Any thread may call it, also while
        or after the model is closed (it then does nothing): a thread that
        waits both for completions and for work that other threads queue
        calls complete(timeout=None), and they call wake() after queueing."""
        with self._wake_lock:
            if self._handle is not None:
                self._lib.blkps_wake(self._handle)

    def close(self):
        """As for every handle; a wake() on another thread waits for it."""
        with getattr(self, "_wake_lock", contextlib.nullcontext()):
            super().close()

    def pull_rows(self, ids, width, out=None):
        """Rows `ids` of a table of rows of `width` float32 values
        (doc/embeddings.md) as a (len(ids), width) float32 array, in the order
        given (ids may repeat), into `out` if given (writable, C-contiguous,
        float32, that shape). Each row is read once; on a blkps table the
        rows go in batches through the server's row windows (a few commands
        per batch), elsewhere as few requests as their places allow, many in
        flight. On a hashed table (table_hashed) an id is any 64-bit value:
        an int64 array's negative ids are taken as their two's-complement
        pattern (-1 is 2**64 - 1)."""
        ids = np.ascontiguousarray(ids, dtype=np.uint64).reshape(-1)
        if out is None:
            out = np.empty((ids.size, width), dtype=np.float32)
        elif (not isinstance(out, np.ndarray) or out.dtype != np.float32 or not out.flags.c_contiguous
              or not out.flags.writeable or out.shape != (ids.size, width)):
            raise ValueError(f"blkps: pull_rows needs out to be a writable C-contiguous float32 array "
                             f"of shape ({ids.size}, {width})")
        self._check(self._lib.blkps_pull_rows(self._open_handle(), ids.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)),
                                              ids.size, width, out.ctypes.data_as(_FLOAT_P)))
        return out

    def push_rows(self, ids, grads):
        """Sends grads[k] (a (len(ids), width) array) as the gradient of table
        row ids[k]; the gradients of a repeated id are summed and sent once."""
        ids = np.ascontiguousarray(ids, dtype=np.uint64).reshape(-1)
        grads = np.ascontiguousarray(grads, dtype=np.float32)
        if grads.ndim != 2 or grads.shape[0] != ids.size:
            raise ValueError(f"blkps: push_rows needs grads of shape ({ids.size}, width), got {grads.shape}")
        self._check(self._lib.blkps_push_rows(self._open_handle(), ids.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)),
                                              ids.size, grads.shape[1], grads.ctypes.data_as(_FLOAT_P)))

    @property
    def table_width(self):
        """The table's values per row, read from its server at open: the
        only width pull_rows and push_rows take (another is refused before
        anything is sent); 0 for a dense model or a device that does not say
        (a file, a target without a blkps control LUN)."""
        return self._lib.blkps_table_width(self._open_handle())

    @property
    def table_hashed(self):
        """Whether the table is hashed (table=hash:CAPACITY:WIDTH, on one
        server or split over shards by a `kind = hashed` layout): pull_rows
        and push_rows then take any 64-bit id (doc/embeddings.md "Hashed
        ids")."""
        return bool(self._lib.blkps_table_hashed(self._open_handle()))

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

    @property
    def pushed_bytes_lost(self):
        """Bytes of pushes the server acknowledged and then lost with a
        restart from its checkpoint (doc/libblkps.md "Faults"); 0 if none."""
        return self._lib.blkps_pushed_bytes_lost(self._open_handle())

    @property
    def reconnects(self):
        """Lost iSCSI sessions re-established; read it on the thread that
        uses the Model, between calls."""
        return self._lib.blkps_reconnects(self._open_handle())

    @property
    def reconnect_seconds(self):
        """Seconds spent reconnecting (a failed attempt included)."""
        return self._lib.blkps_reconnect_seconds(self._open_handle())


class Engine(_Handle):
    """A training loop's double-buffered view of the model (blkps/engine.hpp).

    The engine pulls the weights into one buffer while the caller computes on
    the other, and pushes each gradient on its own thread::

        with blkps.Engine(url, control_target=control_url) as engine:
            for t in range(iterations):
                engine.gradient[:] = compute_gradient(engine.weights)
                engine.step()        # hand over the gradient, swap buffers
            engine.finish()          # push the last gradient

    ``weights`` (read-only) and ``gradient`` (writable) are numpy float32
    arrays that view the engine's own buffers (no copy); a view is valid
    until the next step(), finish() or close(), after which the names give
    new views. step() releases the GIL while it waits. ``metrics`` is the
    last step's IterationMetrics as a dict. Errors raise OSError(errno,
    message); after a failed step the engine stays failed. One thread drives
    an engine. close() (or leaving the with-block) stops the engine:
    gradients already handed to step() are still pushed; call finish() first
    to push the current one.
    """

    _CLOSE, _LAST_ERROR = "blkps_engine_close", "blkps_engine_last_error"

    def __init__(self, target, first_param=0, param_count=0,
                 double_buffering=True, adaptive_pull=True, smoothing=0.25,
                 control_target=None, request_bytes=0, queue_depth=0,
                 initiator_name=None, drop_ratio=0.0, drop_run_params=0,
                 drop_group_params=0, dtype=None):
        """Opens the engine on `target` (as Model) and pulls the first
        weights. param_count 0 serves up to the end of the device;
        double_buffering=False is the baseline (step pushes then pulls);
        control_target (the model's CONTROL_URL) enables staleness.
        drop_ratio in (0, 1) turns on gradient dropping (doc/libblkps.md "Gradient
        dropping"; run and group sizes in parameters, 0 = defaults)."""
        lib = _library()
        options = _EngineOptions()
        lib.blkps_engine_options_init(ctypes.byref(options))
        options.open = _open_options(request_bytes, queue_depth, initiator_name, dtype)
        options.first_param = first_param
        options.param_count = param_count
        options.double_buffering = 1 if double_buffering else 0
        options.adaptive_pull = 1 if adaptive_pull else 0
        options.smoothing = smoothing
        options.control_target = (os.fsencode(control_target)
                                  if control_target is not None else None)
        options.drop_ratio = drop_ratio
        options.drop_run_params = drop_run_params
        options.drop_group_params = drop_group_params
        self._open("blkps_engine_open", target, options)
        self._count = lib.blkps_engine_param_count(self._handle)

    @property
    def count(self):
        """Parameters served: the length of weights and gradient."""
        return self._count

    @property
    def weights(self):
        """This iteration's weights: a read-only view, valid until step()."""
        view = np.ctypeslib.as_array(
            self._lib.blkps_engine_weights(self._open_handle()), shape=(self._count,))
        view.flags.writeable = False
        return view

    @property
    def gradient(self):
        """This iteration's gradient buffer, to fill before step()."""
        return np.ctypeslib.as_array(
            self._lib.blkps_engine_gradient(self._open_handle()), shape=(self._count,))

    def step(self):
        """Hands the gradient over, waits for the next weights, swaps."""
        self._check(self._lib.blkps_engine_step(self._open_handle()))

    def finish(self):
        """Pushes the current gradient, waits for every push and syncs (the
        server checkpoints, if it keeps one): then pushed_bytes_lost is
        complete."""
        self._check(self._lib.blkps_engine_finish(self._open_handle()))

    @property
    def metrics(self):
        """The last step's metrics: iteration, compute_s, stall_s, push_s,
        pull_s, bubble_s, staleness (-1: unknown), concurrent."""
        m = _EngineMetrics()
        self._lib.blkps_engine_last_metrics(self._open_handle(), ctypes.byref(m))
        return {name: (bool(getattr(m, name)) if name == "concurrent" else getattr(m, name))
                for name, _ in _EngineMetrics._fields_}

    @property
    def params_pushed(self):
        """Parameters sent to the server so far (with dropping: the runs
        pushed)."""
        return self._lib.blkps_engine_params_pushed(self._open_handle())

    @property
    def residual(self):
        """With drop_ratio: a copy of the gradient dropped and not pushed yet
        (zeros after finish()); None without dropping. Read it after finish()
        or, with double_buffering=False, between steps."""
        pointer = self._lib.blkps_engine_residual(self._open_handle())
        if not pointer:
            return None
        return np.ctypeslib.as_array(pointer, shape=(self._count,)).copy()

    @property
    def stop_requested(self):
        """True when the job is asked to stop (control stop=1, doc/pytorch.md
        "Early stopping across learners"): a fresh read of the control
        LUN's counters; False without control_target."""
        return bool(self._lib.blkps_engine_stop_requested(self._open_handle()))

    @property
    def gradients_pushed(self):
        """Gradients that reached the server whole so far."""
        return self._lib.blkps_engine_gradients_pushed(self._open_handle())

    @property
    def pushed_bytes_lost(self):
        """Bytes of gradients the server acknowledged and then lost with a
        restart from its checkpoint; 0 if none. Complete after finish()."""
        return self._lib.blkps_engine_pushed_bytes_lost(self._open_handle())
