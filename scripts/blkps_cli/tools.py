"""Where the programs the command runs are. Installed (`cmake --install`,
any prefix, or the .debs): beside the command, in the folders the install
recorded (_installed.py). In a checkout: in one build, the first of the
folder BLKPS_BUILD names, the build configured last (its configure step
writes _build.py here, naming it; sanitizer and fuzz builds do not) while
it exists, and build/cmake (scripts/build.sh's). Then PATH."""

import os
import shutil

from .errors import UserError

SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = os.path.dirname(SCRIPTS)
HERE = os.path.dirname(os.path.abspath(__file__))
# tgtd loads every backing store in this folder itself (no LD_PRELOAD).
TGT_PLUGINS = "/usr/lib/tgt/backing-store"

# The programs blkps builds: name -> (path in a build folder, the install
# folder's key in _installed.py and the name there). blkps-train-digits is
# an example, not installed.
_BUILT = {
    "blkps-layout": ("learner/tools/blkps-layout", "BIN", "blkps-layout"),
    "blkps-bsopts": ("target-plugin/blkps-bsopts", "BIN", "blkps-bsopts"),
    "blkps-checkpoint": ("aggregator/blkps-checkpoint", "BIN", "blkps-checkpoint"),
    "blkps-mount": ("learner/mount/blkps-mount", "BIN", "blkps-mount"),
    "blkps-train-digits": ("learner/examples/blkps-train-digits", None, None),
    "bs_blkps.so": ("target-plugin/bs_blkps.so", "PLUGINS", "bs_blkps.so"),
    "libblkps.so": ("learner/libblkps.so", "LIB", "libblkps.so.0"),
}

try:  # installed: _installed.py, written at install, gives folders relative to this one
    from . import _installed
    INSTALLED = {key: os.path.normpath(os.path.join(HERE, getattr(_installed, key)))
                 for key in ("PYTHON_PACKAGE", "BIN", "LIB", "PLUGINS")}
    PYTHON_PACKAGE = INSTALLED["PYTHON_PACKAGE"]
except ImportError:  # a checkout
    INSTALLED = None
    PYTHON_PACKAGE = os.path.join(TOP, "learner", "python")  # the learner's `blkps` package


def build_folder():
    """A checkout's build: the one folder its programs come from, so that
    they never mix builds (None when installed)."""
    if INSTALLED is not None:
        return None
    if os.environ.get("BLKPS_BUILD"):
        return os.environ["BLKPS_BUILD"]
    try:
        from . import _build  # written by the configure step (CMakeLists.txt)
        if os.path.isdir(_build.BUILD):
            return _build.BUILD
    except ImportError:
        pass
    return os.path.join(TOP, "build", "cmake")


def built(name):
    """The path of a program blkps builds, or raises a UserError that says
    where it was looked for and how to build it."""
    in_build, key, installed_name = _BUILT[name]
    if INSTALLED is None:
        place = os.path.join(build_folder(), in_build)
    else:
        place = os.path.join(INSTALLED[key], installed_name) if key else None
    if place and os.path.exists(place):
        return place
    found = shutil.which(name)
    if found:
        return found
    raise UserError(name, f"not found in {os.path.dirname(place)} nor on PATH" if place else "not found on PATH",
                    "build first: sudo scripts/build.sh (or BLKPS_BUILD=FOLDER for another build)"
                    if INSTALLED is None else "reinstall blkps")


def loaded_by_tgtd(plugin):
    """Whether tgtd loads `plugin` by itself (it lies in tgt's folder)."""
    return os.path.realpath(os.path.dirname(plugin)) == os.path.realpath(TGT_PLUGINS)


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
