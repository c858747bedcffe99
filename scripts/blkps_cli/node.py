"""The learner node's built programs: blkps mount runs blkps-mount (FUSE),
blkps layout runs blkps-layout (the stripe arithmetic). Their own options
pass through unchanged; --help shows them. (blkps login|logout|node-status,
the kernel initiator, is login.py.)"""

import argparse
import os

from . import publish, state, tools
from .errors import UserError


def run(argv):
    """Replaces this process with argv (its exit status is the command's)."""
    os.execv(argv[0], argv)


def command_layout(a):
    if a.args[:1] == ["wait"]:  # the one subcommand that is not blkps-layout's arithmetic
        return publish.command_wait(a.args[1:])
    run([tools.built("blkps-layout"), *a.args])


def command_mount(a):
    """blkps mount MOUNTPOINT --dir DIR [blkps-mount options]: DIR's learner
    slots become MOUNTPOINT/slot1..slotN and its control LUN MOUNTPOINT/control
    (shard 0's when several tgtds serve it);
    without --dir the arguments go to blkps-mount as they are."""
    args = list(a.args)
    files = []
    if "--dir" in args:
        i = args.index("--dir")
        if i + 1 >= len(args):
            raise UserError("mount", "--dir needs a value", "e.g. blkps mount /mnt/model --dir /tmp/ps")
        env = state.target(args[i + 1], "mount")
        del args[i:i + 2]
        files = [f"slot{k}={url}" for k, url in enumerate(env["URLS"].split(), 1)]
        # Served by several tgtds (target.env's CONTROL_URLS): the slots are
        # layout: targets and `control` is shard 0's control LUN (its status
        # covers shard 0's part; blkps set --dir reaches every shard).
        control = env["CONTROL_URLS"].split()[0] if env.get("CONTROL_URLS") else env["CONTROL_URL"]
        files += ["--control", f"control={control}"]
    run([tools.built("blkps-mount"), *args, *files])


def add_parsers(sub):
    p = sub.add_parser("mount", help="present a model's LUNs as files (FUSE): blkps mount MOUNTPOINT --dir DIR",
                       add_help=False, prefix_chars="\0")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(run=command_mount)
    p = sub.add_parser("layout", help="the stripe arithmetic of a sharded model (sizes, read, split, dm-table, bytes)",
                       add_help=False, prefix_chars="\0")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(run=command_layout)
