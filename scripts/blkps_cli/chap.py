"""CHAP credentials: the one credentials file of blkps (doc/server.md,
"Authentication and access"), read by `blkps target start`/`shards start`
(--chap-file), `blkps login` (--chap-file) and libblkps (BLKPS_CHAP_FILE,
ReadChapFile in learner/src/device.cc, which keeps the same grammar, rules and
messages: tests/chap_file_test.py feeds the same files to both).

  # '#' starts a comment at the start of a line or after a space or tab
  user=NAME              # the initiator's account (one-way CHAP)
  secret=SECRET
  target_user=NAME       # mutual CHAP: the target's account
  target_secret=SECRET

The file must not be readable by group or others (mode 0600 or 0400), as ssh
refuses a private key. user= and secret= are required; target_user= and
target_secret= go together. A name is 1 to 64 of [A-Za-z0-9._:-]; a secret 12
to 16 printable ASCII characters without space and without , % @ / \\ " '
(RFC 3720 asks for at least 12 bytes where a secret may be guessed;
Microsoft's initiator and many targets take at most 16; tgtd splits its
account request on ',', libiscsi's URLs use '%' and '@'). The target's
account must differ from the initiator's, in name and secret (RFC 3720,
8.2.1; tgtd keeps one account per name). Messages never quote a secret.
"""

import os
import re
import secrets
import stat
import string

from .errors import UserError

SECRET_MIN, SECRET_MAX = 12, 16
_SECRET_CHARS = frozenset(map(chr, range(0x21, 0x7F))) - frozenset(",%@/\\\"'")
_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")
KEYS = ("user", "secret", "target_user", "target_secret")


class ChapFileError(ValueError):
    """A credentials file that breaks the rules above; str() is the one-line
    reason, "CHAP file PATH[:LINE]: ...", as libblkps words it."""


class Credentials:
    """A credentials file's accounts: user and secret, and for mutual CHAP
    target_user and target_secret (None without)."""

    def __init__(self, user, secret, target_user=None, target_secret=None):
        self.user, self.secret = user, secret
        self.target_user, self.target_secret = target_user, target_secret


def read_credentials(path):
    """The Credentials of the file `path`, or a ChapFileError."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read()
    except OSError as e:
        raise ChapFileError(f"CHAP file {path}: cannot read it: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ChapFileError(f"CHAP file {path} is readable by group or others (mode {stat.S_IMODE(mode):04o}); "
                            f"chmod 600 {path}")
    values = {}
    for number, line in enumerate(raw.decode("latin-1").split("\n"), 1):
        line = line[:-1] if line.endswith("\r") else line
        # A '#' starts a comment at the start of a line or after a space or tab
        # (a secret may hold '#', never a space).
        blank = min([i for i in (line.find(" "), line.find("\t")) if i >= 0], default=len(line))
        comment = 0 if line.startswith("#") else line.find("#", blank)
        line = (line if comment < 0 else line[:comment]).rstrip(" \t")
        if not line:
            continue
        key, eq, value = line.partition("=")
        where = f"CHAP file {path}:{number}"
        if not eq or key not in KEYS:
            raise ChapFileError(f"{where}: expected user=, secret=, target_user= or target_secret=")
        if " " in value or "\t" in value:
            raise ChapFileError(f"{where}: a value holds a space (a comment starts with '#')")
        if key in values:
            raise ChapFileError(f"{where}: {key}= is given twice")
        if key.endswith("user") and not _NAME.fullmatch(value):
            raise ChapFileError(f"{where}: {key}= must be 1 to 64 of A-Z a-z 0-9 . _ : -")
        if key.endswith("secret") and not (SECRET_MIN <= len(value) <= SECRET_MAX and set(value) <= _SECRET_CHARS):
            raise ChapFileError(f"{where}: {key}= must be {SECRET_MIN} to {SECRET_MAX} printable ASCII characters "
                                f"without space , % @ / \\ \" ' (it has {len(value)})")
        values[key] = value
    if "user" not in values or "secret" not in values or ("target_user" in values) != ("target_secret" in values):
        raise ChapFileError(f"CHAP file {path}: needs user= with secret=, and for mutual CHAP target_user= with "
                            "target_secret= as well")
    if values.get("target_user") == values["user"] or values.get("target_secret") == values["secret"]:
        raise ChapFileError(f"CHAP file {path}: the target's account must differ from the initiator's in "
                            "target_user= and target_secret=")
    return Credentials(*(values.get(k) for k in KEYS))


def credentials(path, option="--chap-file"):
    """read_credentials(path), or None without a path; a bad file is a
    UserError naming `option`."""
    if path is None:
        return None
    try:
        return read_credentials(path)
    except ChapFileError as e:
        raise UserError(option, str(e)) from None


def generate_secret():
    """A new random secret that keeps the rules above (16 letters and digits)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(SECRET_MAX))


def write_credentials_file(path, user, secret, target_user=None, target_secret=None):
    """Writes a credentials file at `path`, mode 0600 from its creation on."""
    text = f"user={user}\nsecret={secret}\n"
    if target_user:
        text += f"target_user={target_user}\ntarget_secret={target_secret}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def add_argument(s, role):
    """The --chap-file option; `role` says what its accounts do for the command."""
    s.add_argument("--chap-file", metavar="FILE", help=f"CHAP credentials (user=, secret=, for mutual CHAP "
                   f"target_user=, target_secret=; mode 0600; doc/server.md, \"Authentication and access\"): {role}")
