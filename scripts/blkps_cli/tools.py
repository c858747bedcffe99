"""Where the programs the command runs are: in the build tree of this
checkout (build/cmake) when it has them, else installed (PATH, tgt's plugin
folder)."""

import os
import shutil

from .errors import UserError

SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = os.path.dirname(SCRIPTS)
BUILD = os.path.join(TOP, "build", "cmake")
try:  # installed (any prefix): _installed.py, written at install, says where the package went
    from . import _installed
    PYTHON_PACKAGE = os.path.normpath(os.path.join(os.path.dirname(__file__), _installed.PYTHON_PACKAGE))
except ImportError:  # a checkout
    PYTHON_PACKAGE = os.path.join(TOP, "learner", "python")  # the learner's `blkps` package

# The built programs: name -> path in the build tree.
_BUILT = {
    "blkps-layout": "learner/tools/blkps-layout",
    "blkps-bsopts": "target-plugin/blkps-bsopts",
    "blkps-checkpoint": "aggregator/blkps-checkpoint",
    "blkps-mount": "learner/mount/blkps-mount",
    "blkps-train-digits": "learner/examples/blkps-train-digits",
    "bs_blkps.so": "target-plugin/bs_blkps.so",
    "libblkps.so": "learner/libblkps.so",
}


def built(name):
    """The path of a program blkps builds, or raises a UserError that says
    how to build it."""
    path = os.path.join(BUILD, _BUILT[name])
    if os.path.exists(path):
        return path
    found = shutil.which(name)
    if found:
        return found
    raise UserError(name, "not found in build/cmake nor on PATH", "build first: sudo scripts/build.sh")


def script(name):
    """A script shipped beside this command (scripts/NAME)."""
    return os.path.join(SCRIPTS, name)


def rdma_class():
    """Where the kernel lists RDMA devices: class/infiniband under
    BLKPS_SYSFS (tests point it at a fake tree), default /sys."""
    return os.path.join(os.environ.get("BLKPS_SYSFS", "/sys"), "class", "infiniband")


def has_rdma():
    """Whether this host has an RDMA device (iSER needs one)."""
    try:
        return bool(os.listdir(rdma_class()))
    except OSError:
        return False
