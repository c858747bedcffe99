"""Files that other processes read while they are written: a job's
target.env and start options, a published part, the layouts."""

import os
import socket


def write_atomically(path, text):
    """Writes `text` to `path` so that a reader sees the old file or the
    new one, never half of one. Its temporary file is this writer's own
    (host and pid in its name): two writers of the same file at once (two
    server tasks completing a job's set of parts, each writing the
    layouts) each replace it whole, the last one's staying."""
    tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except FileNotFoundError:
            pass
        raise
