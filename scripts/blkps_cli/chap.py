"""CHAP credentials: a user name and a secret read from a file, with the
rules every iSCSI peer blkps works with accepts.

A secret file holds the secret on its first line (a trailing newline is
ignored). It must not be readable by group or others (mode 0600 or 0400):
anything else is refused, as ssh refuses a private key.

Secrets: 12 to 16 bytes (RFC 3720 asks for at least 12 when a secret may be
guessed; Microsoft's initiator and many targets take at most 16), printable
ASCII without space and without , % @ / \\ " ' (tgtd splits its account
request on ',', and libiscsi's URLs use '%' and '@' around it). A mutual
(outgoing) secret must differ from the incoming one (RFC 3720, 8.2.1).
"""

import os
import re
import secrets
import stat
import string

from .errors import UserError

SECRET_MIN, SECRET_MAX = 12, 16
_SECRET_CHARS = frozenset(map(chr, range(0x21, 0x7F))) - frozenset(",%@/\\\"'")
_USER = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def user_name(name, option):
    """`name` if it is a usable CHAP user name, else a UserError naming `option`."""
    if not _USER.fullmatch(name or ""):
        raise UserError(option, f"expected 1 to 64 of [A-Za-z0-9._:-], got {name!r}")
    return name


def read_secret(path, option):
    """The secret in file `path` (given with `option`); a UserError that never
    quotes the secret if the file is missing, readable by group or others, or
    the secret breaks the rules above."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read(4096)
    except OSError as e:
        raise UserError(option, f"cannot read {path}: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(option, f"{path} is readable by group or others (mode {stat.S_IMODE(mode):04o})",
                        f"chmod 600 {path}")
    lines = raw.split(b"\n")
    secret = lines[0].rstrip(b"\r")
    if any(line.strip() for line in lines[1:]):
        raise UserError(option, f"{path} holds more than one line", "put the secret alone on the first line")
    try:
        text = secret.decode("ascii")
    except UnicodeDecodeError:
        text = None
    if text is None or not set(text) <= _SECRET_CHARS or not SECRET_MIN <= len(text) <= SECRET_MAX:
        raise UserError(option, f"the secret in {path} must be {SECRET_MIN} to {SECRET_MAX} printable ASCII "
                        f"characters without space , % @ / \\ \" ' (it has {len(secret)} bytes)")
    return text


def generate_secret():
    """A new random secret that keeps the rules above (16 letters and digits)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(SECRET_MAX))


def write_credentials_file(path, user, secret, target_user=None, target_secret=None):
    """Writes a BLKPS_CHAP_FILE (doc/server.md, "Authentication and access") at
    `path`, mode 0600 from its creation on."""
    text = f"user={user}\nsecret={secret}\n"
    if target_user:
        text += f"target_user={target_user}\ntarget_secret={target_secret}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Credentials:
    """The CHAP settings of `blkps target start` (or shards start): incoming
    (the initiator proves itself) and optionally mutual (the target proves
    itself too); None where not asked for."""

    def __init__(self, a):
        self.user = self.secret = self.mutual_user = self.mutual_secret = None
        if bool(a.chap_user) != bool(a.chap_secret_file):
            raise UserError("--chap-user", "needs --chap-secret-file, and the other way round")
        if bool(a.mutual_user) != bool(a.mutual_secret_file):
            raise UserError("--mutual-user", "needs --mutual-secret-file, and the other way round")
        if a.mutual_user and not a.chap_user:
            raise UserError("--mutual-user", "mutual CHAP needs one-way CHAP too", "add --chap-user and "
                            "--chap-secret-file")
        if a.chap_user:
            self.user = user_name(a.chap_user, "--chap-user")
            self.secret = read_secret(a.chap_secret_file, "--chap-secret-file")
        if a.mutual_user:
            self.mutual_user = user_name(a.mutual_user, "--mutual-user")
            self.mutual_secret = read_secret(a.mutual_secret_file, "--mutual-secret-file")
            if self.mutual_secret == self.secret:
                raise UserError("--mutual-secret-file", "the mutual secret must differ from the incoming one "
                                "(RFC 3720)")
            if self.mutual_user == self.user:
                raise UserError("--mutual-user", "must differ from --chap-user (tgtd keeps one account per name)")


def add_arguments(s):
    """The CHAP options of `blkps target start` and `blkps shards start`."""
    s.add_argument("--chap-user", metavar="NAME", help="CHAP: initiators must log in as NAME with the secret "
                   "of --chap-secret-file (one-way CHAP)")
    s.add_argument("--chap-secret-file", metavar="FILE", help="the CHAP secret, alone on the first line of FILE "
                   f"(mode 0600; {SECRET_MIN} to {SECRET_MAX} characters)")
    s.add_argument("--mutual-user", metavar="NAME", help="mutual CHAP: the target proves itself to initiators as "
                   "NAME with the secret of --mutual-secret-file (needs --chap-user)")
    s.add_argument("--mutual-secret-file", metavar="FILE", help="the mutual CHAP secret (rules as "
                   "--chap-secret-file; must differ from it)")
