"""One way of printing errors: `blkps: <what>: <why>; <what to do>`, one line
on stderr, exit status 1 (2 for a bad command line)."""

import argparse
import sys


class UserError(Exception):
    """An error a user can act on. `what` names the command or the thing
    (e.g. "target start", "--bsopts"), `why` what went wrong, `remedy` what to
    do about it (optional)."""

    def __init__(self, what, why, remedy=None, status=1):
        self.what, self.detail = what, why + (f"; {remedy}" if remedy else "")
        super().__init__((f"{what}: " if what else "") + self.detail)
        self.status = status

    def line(self):
        return f"blkps: {self}"


def report(error):
    """Prints a UserError's line and returns its exit status."""
    print(error.line(), file=sys.stderr)
    return error.status


class Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is one `blkps: ...` line (naming the
    unknown command before anything else), not a usage block."""

    def error(self, message):
        what = self.prog[len("blkps "):] if self.prog.startswith("blkps ") else None
        if "invalid choice" in message:
            # "argument command: invalid choice: 'stat' (choose from 'start', 'stop')"
            got = message.split("invalid choice: ", 1)[1].split(" (choose", 1)[0]
            choices = ", ".join(c for c in message.split("(choose from ", 1)[1].rstrip(")").replace("'", "").split(", ")
                                if c != "watch")  # target watch: the --owner-pid watchdog, not for people
            raise UserError(what, f"unknown command {got}", f"use one of {choices} (see {self.prog} --help)", 2)
        raise UserError(what, message, f"see {self.prog} --help", 2)
