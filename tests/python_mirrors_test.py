#!/usr/bin/python3
"""The Python package's ctypes mirrors of libblkps's C structs match the
library's sizes (blkps_struct_size), and a mirror that does not is refused
in one line when the library loads. No server.

Usage: python_mirrors_test.py TOP BUILD"""
import ctypes
import sys

import testbed

top, build, _ = testbed.setup("python_mirrors_test")
import blkps  # noqa: E402
import blkps.control  # noqa: E402


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


lib = blkps._library()  # checks blkps's own mirrors
layout = blkps.control.layout()  # and blkps.control's
if layout.receipt_unit <= 0 or layout.weights_offset <= layout.status_offset:
    fail(f"an implausible layout from libblkps: {vars(layout)}")
mirrors = dict(blkps._MIRRORS, blkps_control_layout=blkps.control._Layout,
               blkps_control_counters=blkps.control._Counters, blkps_control_receipt=blkps.control._Receipt)
if len(mirrors) != 7:
    fail(f"expected the seven mirrored structs, got {sorted(mirrors)}")
for name, mirror in mirrors.items():
    if lib.blkps_struct_size(name.encode()) != ctypes.sizeof(mirror):
        fail(f"{name}: libblkps {lib.blkps_struct_size(name.encode())} bytes, mirror {ctypes.sizeof(mirror)}")
if lib.blkps_struct_size(b"no_such_struct") != 0:
    fail("an unknown struct name must give 0")


class Longer(ctypes.Structure):  # a mirror with a field the library lacks
    _fields_ = blkps.control._Receipt._fields_ + [("extra", ctypes.c_uint64)]


try:
    blkps._check_mirrors(lib, {"blkps_control_receipt": Longer})
    fail("a mirror of the wrong size was taken")
except OSError as e:
    msg = str(e)
    if "blkps_control_receipt is 40 bytes in libblkps" not in msg or "48 in the Python package" not in msg \
            or "\n" in msg:
        fail(f"not the one-line error expected: {msg!r}")
print("ok: 6 mirrors match libblkps; a wrong one is refused in one line")
