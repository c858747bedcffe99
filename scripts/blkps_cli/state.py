"""target.env and shards.env: what `blkps target start` and `blkps shards
start` leave in their --dir for everything else that needs the job's URLs.
This module is their one writer and one reader; a shell script asks
`blkps target show --dir DIR --get KEY` (or `blkps shards show`) instead of
sourcing the file.

Format: one KEY=VALUE per line; a VALUE that holds spaces (a list, one item
per word) is in double quotes. Values never hold quotes or newlines.

target.env:
  URL           learner slot 1's LUN            URLS     every learner slot's LUN
  CONTROL_URL   the status and control LUN      NULL_URL, RDWR_URL  benchmark LUNs, or empty
  OPERATOR_URL, OPERATOR_CHAP_FILE  --operator: the operator's control LUN and
                its CHAP credentials file (a BLKPS_CHAP_FILE); else empty
  PORT, IQN, TRANSPORT (iscsi|iser), PID (tgtd's), TGT_IPC_SOCKET, LOG (tgtd's log)
  METRICS, METRICS_PID  with --metrics: the exporter's ADDR:PORT and pid
                (blkps_cli/metrics.py); also in a --tgtd N target.env
shards.env:
  SHARDS, KIND (striped, or hashed: a hashed table split by id hash, whose
  STRIPE_UNIT is 0), STRIPE_UNIT (bytes), PARAMS (the whole model's), SHARD_PARAMS,
  SHARD_DIRS (each shard's --dir, holding its target.env), LAYOUT (slot 1's
  layout file), LAYOUTS (every slot's), CONTROL_URLS (each shard's)
"""

import os

from .errors import UserError
from .files import write_atomically

TARGET_ENV = "target.env"
SHARDS_ENV = "shards.env"


def write(path, values):
    """Writes `values` (an ordered dict of str, or lists of str) to `path`
    atomically (a reader never sees half a file)."""
    lines = []
    for key, value in values.items():
        text = " ".join(value) if isinstance(value, (list, tuple)) else str(value)
        if any(c in text for c in "\"\n'$`\\"):
            raise UserError(os.path.basename(path), f"{key}: cannot hold {text!r}", "use plain names and paths")
        lines.append(f'{key}="{text}"' if " " in text else f"{key}={text}")
    write_atomically(path, "\n".join(lines) + "\n")


def read(path):
    """The KEY=VALUE pairs of `path` as a dict of str, or None if there is
    no such file."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    values = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            values[key] = value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    return values


def target(folder, what="target"):
    """target.env of a `blkps target start --dir` folder; a UserError if no
    target runs there."""
    values = read(os.path.join(folder, TARGET_ENV))
    if values is None:
        raise UserError(what, f"no target running in {folder} (no {TARGET_ENV})",
                        f"start one: blkps target start --dir {folder} --bsopts ...")
    return values


def shards(folder):
    """shards.env of a `blkps shards start --dir` folder, or None."""
    return read(os.path.join(folder, SHARDS_ENV))


def print_values(values, keys, what):
    """Prints values[key] for each of `keys`, one line each (what `show --get`
    gives scripts); a UserError naming the first unknown key."""
    unknown = [k for k in keys if k not in values]
    if unknown:
        raise UserError(what, f"--get {unknown[0]}: no such key", f"use one of {', '.join(values)}")
    print("\n".join(values[k] for k in keys))
