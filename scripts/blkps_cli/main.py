"""The command line of `blkps`: one parser, one subcommand per thing a
person runs, one way of printing errors (errors.py)."""

import argparse
import os
import signal
import sys

from . import control, demo, login, metrics, node, serve, shards, target, top
from .errors import Parser, UserError, report

DESCRIPTION = """\
blkps: a parameter server that is a block device.

server:        blkps target start|stop|show    one model served by a private tgtd
               blkps target serve              the same in the foreground (Slurm, systemd)
               blkps shards start|stop|show    one model striped over several servers
               blkps status | blkps set        a running job's status and control LUN
               blkps control-layout            the control LUN's offsets, for scripts
               blkps top                       a live view of a job, refreshed every second
               blkps metrics                   a job's Prometheus exporter
learner node:  blkps login|logout|node-status  the model as a local disk (open-iscsi)
               blkps mount                     the model as files (FUSE)
               blkps layout                    the stripe arithmetic of a sharded model
everything:    blkps demo                      README's main job on this machine

`blkps COMMAND --help` describes each."""


def parser():
    p = Parser(prog="blkps", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.add_parser(target.add_parser(sub))
    shards.add_parser(sub)
    control.add_parsers(sub)
    metrics.add_parser(sub)
    top.add_parser(sub)
    login.add_parsers(sub)
    node.add_parsers(sub)
    demo.add_parser(sub)
    return p


class _Terminated(KeyboardInterrupt):
    """SIGTERM (kill PID, timeout(1), a process group's end): unwinds as
    Ctrl-C does, so that a start stopped half-way stops what it started,
    and exits 143 (128 + SIGTERM) where Ctrl-C exits 130."""


def _terminated(*_):
    raise _Terminated


def main(argv=None):
    command = None  # named in an unexpected OSError's line once known
    signal.signal(signal.SIGTERM, _terminated)
    try:
        args = parser().parse_args(argv)
        command = args.command
        return args.run(args)
    except UserError as e:
        return report(e)
    except BrokenPipeError:  # `blkps status | head`: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # libblkps's messages start with "blkps: " too
        why = (e.strerror or str(e)).removeprefix("blkps: ")
        return report(UserError(command, f"{e.filename}: {why}" if e.filename else why))
    except KeyboardInterrupt as e:
        return 128 + (signal.SIGTERM if isinstance(e, _Terminated) else signal.SIGINT)

if __name__ == "__main__":
    sys.exit(main())
