#!/usr/bin/python3
"""One CHAP credentials format (doc/server.md, "Authentication and access"),
two readers: the CLI's (scripts/blkps_cli/chap.py) and libblkps's
(ReadChapFile, through tests/chap_file_check). The same sample files, good
and bad, go to both; each must give the expected result, the same one-line
message included. Usage: chap_file_test.py <repo> <build dir>"""
import os
import subprocess
import sys
import tempfile

top, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(top, "scripts"))
from blkps_cli import chap  # noqa: E402  (stdlib only)

MIXED = ("# blkps CHAP credentials\r\nuser=learner\r\nsecret=learner#Secret1  # a '#' in a secret stays\r\n"
         "target_user=server\t# the target's\ntarget_secret=server-Secret22\t\n   \n  # indented comment\n")
ONE_WAY = "user=learner\nsecret=learner-Secret1\n"
MUTUAL = ONE_WAY + "target_user=server\ntarget_secret=server-Secret22\n"
SECRET_RULE = "must be 12 to 16 printable ASCII characters without space , % @ / \\ \" '"
NAME_RULE = "must be 1 to 64 of A-Z a-z 0-9 . _ : -"
NEEDS = "CHAP file FILE: needs user= with secret=, and for mutual CHAP target_user= with target_secret= as well"

# (name, bytes, mode, expected): "ok USER SECRET TARGET_USER TARGET_SECRET"
# or "error MESSAGE", FILE standing for the sample's path.
SAMPLES = [
    ("one-way", ONE_WAY, 0o600, "ok learner learner-Secret1 - -"),
    ("mutual", MUTUAL, 0o600, "ok learner learner-Secret1 server server-Secret22"),
    ("comments-crlf-tabs", MIXED, 0o600, "ok learner learner#Secret1 server server-Secret22"),
    ("owner-read-only", ONE_WAY, 0o400, "ok learner learner-Secret1 - -"),
    ("no-final-newline", "user=a.b_C:d-9\nsecret=123456789012", 0o600, "ok a.b_C:d-9 123456789012 - -"),
    ("longest", f"user={'u' * 64}\nsecret=!#$&()*+-.:;<=>?\n", 0o600, f"ok {'u' * 64} !#$&()*+-.:;<=>? - -"),
    ("group-readable", ONE_WAY, 0o640, "error CHAP file FILE is readable by group or others (mode 0640); "
                                      "chmod 600 FILE"),
    ("other-writable", ONE_WAY, 0o602, "error CHAP file FILE is readable by group or others (mode 0602); "
                                      "chmod 600 FILE"),
    ("missing", None, 0, "error CHAP file FILE: cannot read it: No such file or directory"),
    ("unknown-key", "user=learner\npassword=learner-Secret1\n", 0o600,
     "error CHAP file FILE:2: expected user=, secret=, target_user= or target_secret="),
    ("no-equals", "# x\nuser learner\n", 0o600,
     "error CHAP file FILE:2: expected user=, secret=, target_user= or target_secret="),
    ("indented-key", "  user=learner\nsecret=learner-Secret1\n", 0o600,
     "error CHAP file FILE:1: expected user=, secret=, target_user= or target_secret="),
    ("space-in-value", "user=learner\nsecret=two words-12345\n", 0o600,
     "error CHAP file FILE:2: a value holds a space (a comment starts with '#')"),
    ("twice", ONE_WAY + "user=other\n", 0o600, "error CHAP file FILE:3: user= is given twice"),
    ("short-secret", "user=learner\nsecret=12345678901\n", 0o600,
     f"error CHAP file FILE:2: secret= {SECRET_RULE} (it has 11)"),
    ("long-secret", "user=learner\nsecret=12345678901234567\n", 0o600,
     f"error CHAP file FILE:2: secret= {SECRET_RULE} (it has 17)"),
    ("comma-secret", "user=learner\nsecret=secret,with,14\n", 0o600,
     f"error CHAP file FILE:2: secret= {SECRET_RULE} (it has 14)"),
    ("non-ascii-secret", "user=learner\nsecret=learner-Secr\u00e9t\n", 0o600,
     f"error CHAP file FILE:2: secret= {SECRET_RULE} (it has 15)"),
    ("bad-target-secret", MUTUAL.replace("server-Secret22", "server/Secret22"), 0o600,
     f"error CHAP file FILE:4: target_secret= {SECRET_RULE} (it has 15)"),
    ("bad-name", "user=le@rner\nsecret=learner-Secret1\n", 0o600, f"error CHAP file FILE:1: user= {NAME_RULE}"),
    ("hash-in-name", "user=learner#1\nsecret=learner-Secret1\n", 0o600, f"error CHAP file FILE:1: user= {NAME_RULE}"),
    ("nul-in-name", "user=lear\0ner\nsecret=learner-Secret1\n", 0o600, f"error CHAP file FILE:1: user= {NAME_RULE}"),
    ("long-name", f"user={'u' * 65}\nsecret=learner-Secret1\n", 0o600, f"error CHAP file FILE:1: user= {NAME_RULE}"),
    ("empty-name", "user=\nsecret=learner-Secret1\n", 0o600, f"error CHAP file FILE:1: user= {NAME_RULE}"),
    ("empty", "", 0o600, "error " + NEEDS),
    ("user-only", "user=learner\n", 0o600, "error " + NEEDS),
    ("target-user-only", ONE_WAY + "target_user=server\n", 0o600, "error " + NEEDS),
    ("target-without-user", MUTUAL.replace("user=learner\n", "", 1), 0o600, "error " + NEEDS),
    ("same-target-user", MUTUAL.replace("target_user=server", "target_user=learner"), 0o600,
     "error CHAP file FILE: the target's account must differ from the initiator's in target_user= and "
     "target_secret="),
    ("same-target-secret", MUTUAL.replace("server-Secret22", "learner-Secret1"), 0o600,
     "error CHAP file FILE: the target's account must differ from the initiator's in target_user= and "
     "target_secret="),
]


def python_reads(path):
    try:
        c = chap.read_credentials(path)
    except chap.ChapFileError as e:
        return f"error {e}"
    return "ok " + " ".join(v or "-" for v in (c.user, c.secret, c.target_user, c.target_secret))


def main():
    failures = 0
    with tempfile.TemporaryDirectory(prefix="blkps-chap-test-") as work:
        paths = []
        for name, text, mode, _ in SAMPLES:
            path = os.path.join(work, name + ".chap")
            if text is not None:
                with open(path, "wb") as f:
                    f.write(text.encode())
                os.chmod(path, mode)
            paths.append(path)
        out = subprocess.run([os.path.join(build, "tests", "chap_file_check"), *paths], capture_output=True,
                             text=True, errors="replace", check=True).stdout.splitlines()
        if len(out) != len(SAMPLES):
            print(f"FAIL: chap_file_check printed {len(out)} lines for {len(SAMPLES)} files", file=sys.stderr)
            return 1
        for (name, _, _, expected), path, libblkps in zip(SAMPLES, paths, out):
            cli = python_reads(path)
            expected = expected.replace("FILE", path)
            for reader, got in (("scripts/blkps_cli/chap.py", cli), ("libblkps", libblkps)):
                if got != expected:
                    print(f"FAIL: {name}: {reader} says\n  {got}\nexpected\n  {expected}", file=sys.stderr)
                    failures += 1
    print(f"{len(SAMPLES)} samples, {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
