"""blkps.control: a model's control LUN (status, commands, counters, weights).

The layout is the C header's (wire/include/blkps/control_lun.h, doc/server.md
"Status and control"); ``layout()`` takes it from libblkps, so this module
holds no copy of its numbers::

    from blkps.control import Control

    with Control(control_url) as control:      # CONTROL_URL, /dev/sdX, a file
        print(control.status()["global_step"])
        control.set(lr=0.001)                  # a learning-rate schedule step
        print(control.counters()["updates"])   # no JSON: one 4 KiB read

Errors raise OSError(errno, message) as blkps.Model's do; a command the
server refuses raises OSError (EIO); the status's control_error says why.

A model served by several tgtds (``blkps target start --tgtd N``, ``blkps
shards``) has one control LUN per shard; ``open_control(target)`` on its
``layout:PATH`` (a layout file with ``control =`` lines) gives a
ShardedControl, the whole job's control (doc/data-path.md "Scale-out").
"""

import ctypes
import errno
import json
import os

import numpy as np

from . import Model, _check_mirrors, _library

__all__ = ["Control", "ShardedControl", "open_control", "layout", "describe_layout"]


class _Layout(ctypes.Structure):  # blkps_control_layout, blkps.h
    _fields_ = [
        ("format_version", ctypes.c_uint32),
        ("status_offset", ctypes.c_uint64),
        ("status_bytes", ctypes.c_uint64),
        ("commands_offset", ctypes.c_uint64),
        ("commands_bytes", ctypes.c_uint64),
        ("counters_offset", ctypes.c_uint64),
        ("counters_bytes", ctypes.c_uint64),
        ("weights_offset", ctypes.c_uint64),
        ("status_keys", ctypes.c_char_p),
        ("status_checkpoint_keys", ctypes.c_char_p),
        ("status_learner_keys", ctypes.c_char_p),
        ("exchange_bytes", ctypes.c_uint64),
        ("receipt_unit", ctypes.c_uint64),
    ]


class _Counters(ctypes.Structure):  # blkps_control_counters, control_lun.h
    _fields_ = [
        ("magic", ctypes.c_char * 8),
        ("format_version", ctypes.c_uint32),
        ("record_bytes", ctypes.c_uint32),
        ("params", ctypes.c_uint64),
        ("blocks", ctypes.c_uint64),
        ("global_step", ctypes.c_uint64),
        ("updates", ctypes.c_uint64),
        ("rejected_writes", ctypes.c_uint64),
        ("failed", ctypes.c_uint64),
        ("stop", ctypes.c_uint64),
        ("table_width", ctypes.c_uint64),
        ("pushing_learners", ctypes.c_uint64),
        ("table_hashed", ctypes.c_uint64),
    ]


class _Receipt(ctypes.Structure):  # blkps_control_receipt, control_lun.h
    _fields_ = [
        ("magic", ctypes.c_char * 8),
        ("format_version", ctypes.c_uint32),
        ("record_bytes", ctypes.c_uint32),
        ("lun", ctypes.c_uint64),
        ("writes_applied", ctypes.c_uint64),
        ("writes_in_progress", ctypes.c_uint64),
    ]


class Layout:
    """The control LUN's layout: byte offsets and sizes of its regions, the
    format version, and the status keys (lists of str)."""

    def __init__(self, raw):
        for name, _ in _Layout._fields_:
            value = getattr(raw, name)
            setattr(self, name, value.decode().split() if isinstance(value, bytes) else value)


_layout = None


def layout():
    """The control LUN's Layout, from libblkps (loaded on first use)."""
    global _layout
    if _layout is None:
        lib = _library()
        _check_mirrors(lib, {"blkps_control_layout": _Layout, "blkps_control_counters": _Counters,
                             "blkps_control_receipt": _Receipt})
        lib.blkps_control_layout_get.argtypes = [ctypes.POINTER(_Layout)]
        lib.blkps_control_layout_get.restype = None
        lib.blkps_control_read_counters.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Counters)]
        lib.blkps_control_read_counters.restype = ctypes.c_int
        lib.blkps_control_read_receipt.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64,
                                                   ctypes.POINTER(_Receipt), ctypes.c_void_p]
        lib.blkps_control_read_receipt.restype = ctypes.c_int
        lib.blkps_control_receipt_units.argtypes = [ctypes.c_uint64]
        lib.blkps_control_receipt_units.restype = ctypes.c_uint64
        lib.blkps_layout_describe.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.blkps_layout_describe.restype = ctypes.c_int
        lib.blkps_stripe_scatter.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64,
                                             ctypes.POINTER(ctypes.c_void_p)]
        lib.blkps_stripe_scatter.restype = None
        raw = _Layout()
        lib.blkps_control_layout_get(ctypes.byref(raw))
        _layout = Layout(raw)
    return _layout


class Control:
    """An open control LUN. Open it as a Model (same arguments); close it
    with close() or a with-block. One thread at a time, as a Model."""

    def __init__(self, target, **model_options):
        self.layout = layout()
        self.device = Model(target, **model_options)

    def close(self):
        self.device.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def status(self):
        """The job's status: a fresh snapshot, as a dict."""
        raw = self.device.read_bytes(self.layout.status_offset, self.layout.status_bytes)
        return json.loads(raw.split(b"\0", 1)[0])

    def command(self, *lines):
        """Sends `key=value` lines (lr=0.01, resume=1) in one write."""
        text = "".join(line + "\n" for line in lines).encode()
        block = self.device.logical_block_size
        self.device.write_bytes(self.layout.commands_offset, text + b"\0" * (-len(text) % block))

    def set(self, **values):
        """command() with keyword values: set(lr=0.001, momentum=0.9)."""
        self.command(*(f"{key}={value:.9g}" if isinstance(value, float) else f"{key}={value}"
                       for key, value in values.items()))

    def counters(self):
        """The counters record as a dict (params, blocks, global_step,
        updates, rejected_writes, failed, stop, table_width,
        pushing_learners, table_hashed)."""
        record = _Counters()
        rc = self.device._lib.blkps_control_read_counters(self.device._open_handle(),
                                                          ctypes.byref(record))
        self.device._check(rc)
        return {name: getattr(record, name) for name, _ in _Counters._fields_[3:]}

    def receipt(self, lun, device_bytes):
        """The receipt the server keeps for this Control's initiator name
        (open it with initiator_name=) on learner LUN `lun`, a device of
        `device_bytes` (doc/libblkps.md "Faults"): (header, counts), header a dict
        (lun, writes_applied, writes_in_progress: 0 when the counts are
        final for now), counts a uint32 array, one per 512-byte unit of the
        learner LUN: its writes applied that start there."""
        header = _Receipt()
        counts = np.zeros(self.device._lib.blkps_control_receipt_units(device_bytes), dtype=np.uint32)
        rc = self.device._lib.blkps_control_read_receipt(self.device._open_handle(), lun, device_bytes,
                                                         ctypes.byref(header), counts.ctypes.data)
        self.device._check(rc)
        return {name: getattr(header, name) for name, _ in _Receipt._fields_[3:]}, counts

    def write_weights(self, weights):
        """Sets the whole model's weights to `weights` (float32, every
        parameter) through the control LUN's weights window, in one write."""
        data = np.ascontiguousarray(weights, dtype=np.float32).tobytes()
        data += b"\0" * (-len(data) % self.device.logical_block_size)  # the device's padding ignores it
        self.device.write_bytes(self.layout.weights_offset, data)

    def read_weights(self, first_param, count):
        """The weights of parameters [first_param, first_param + count) as a
        new float32 array, through the control LUN's weights window."""
        block = self.device.logical_block_size
        start = self.layout.weights_offset + 4 * first_param
        aligned = start - start % block
        length = start + 4 * count - aligned
        raw = self.device.read_bytes(aligned, length + (-length % block))
        return np.frombuffer(raw, dtype=np.float32, count=count, offset=start - aligned).copy()


def describe_layout(path):
    """Layout file `path` as libblkps reads it: a dict stripe_unit (bytes),
    dtype, shards and controls (lists of targets, shard order; controls may
    be empty). Raises OSError with the parser's one-line message."""
    layout()  # declares the functions
    lib = _library()
    out = ctypes.create_string_buffer(1 << 16)
    rc = lib.blkps_layout_describe(os.fsencode(path), out, len(out))
    if rc != 0:
        raise OSError(-rc, out.value.decode(errors="replace"))
    return json.loads(out.value)


def open_control(target, **model_options):
    """The job's control on `target`: a ShardedControl for a layout:PATH
    whose file names the shards' control LUNs, else a Control."""
    if target.startswith("layout:"):
        return ShardedControl(target, **model_options)
    return Control(target, **model_options)


class ShardedControl:
    """The control of a model striped over shards, one control LUN each
    (shard 0 first), with Control's interface where it makes sense for the
    whole job: status() is shard 0's with the whole model's params and
    device_bytes, failed/stop if any shard's is, and every shard's status
    under "shards"; command() and set() go to every shard in order (the
    first refusal raises: the shards before it took the command);
    counters() likewise; write_weights() writes each shard its part.
    shards: the per-shard Controls (collectives use shard 0's alone)."""

    def __init__(self, target, **model_options):
        self.layout = layout()
        path = target[len("layout:"):] if target.startswith("layout:") else target
        described = describe_layout(path)
        if not described["controls"]:
            raise OSError(errno.EINVAL, f"blkps: {path} names no control LUNs ('control = URL' lines, one per "
                          "shard): give the control LUN itself, or a layout written by blkps target start")
        self.stripe_unit = described["stripe_unit"]
        self.shards = []
        try:
            for url in described["controls"]:
                self.shards.append(Control(url, **model_options))
        except BaseException:
            self.close()
            raise
        self.device = self.shards[0].device

    def close(self):
        for control in self.shards:
            control.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def status(self):
        statuses = [control.status() for control in self.shards]
        whole = dict(statuses[0])
        whole["params"] = sum(s["params"] for s in statuses)
        whole["device_bytes"] = sum(s["device_bytes"] for s in statuses)
        whole["failed"] = any(s["failed"] for s in statuses)
        whole["failure"] = next((f"shard {k}: {s['failure']}" for k, s in enumerate(statuses) if s["failed"]),
                                whole.get("failure", ""))
        whole["stop"] = any(s.get("stop") for s in statuses)
        whole["shards"] = statuses
        return whole

    def command(self, *lines):
        for control in self.shards:
            control.command(*lines)

    set = Control.set

    def counters(self):
        counts = [control.counters() for control in self.shards]
        whole = dict(counts[0])
        whole["params"] = sum(c["params"] for c in counts)
        whole["failed"] = max(c["failed"] for c in counts)
        whole["stop"] = max(c["stop"] for c in counts)
        return whole

    def write_weights(self, weights):
        """Writes every shard its part of `weights` (float32, the whole
        model), cut by the layout's stripe (libblkps's StripeMap)."""
        weights = np.ascontiguousarray(weights, dtype=np.float32)
        parts = [np.zeros(control.status()["params"], dtype=np.float32) for control in self.shards]
        if sum(p.size for p in parts) != weights.size:
            raise ValueError(f"blkps: {weights.size} weights for shards holding {sum(p.size for p in parts)}")
        pointers = (ctypes.c_void_p * len(parts))(*[p.ctypes.data for p in parts])
        _library().blkps_stripe_scatter(self.stripe_unit, len(parts), weights.ctypes.data, weights.nbytes, pointers)
        for control, part in zip(self.shards, parts):
            control.write_weights(part)
