"""The iSCSI session settings blkps asks for (DESIGN.md, "Facts measured"):
one table for both ends of a session. `blkps target start` offers them on the
target (tgtadm --op update --mode target -n KEY -v VALUE) and `blkps login`
writes them into the initiator's node record (iscsiadm -o update), so the
two always agree."""

# Negotiated keys (RFC 7143 names) and what blkps asks for over TCP: writes
# went from ~0.7 to ~3 GB/s on loopback with these.
ISCSI = (
    ("InitialR2T", "No"),
    ("ImmediateData", "Yes"),
    ("FirstBurstLength", "262144"),
    ("MaxBurstLength", "16776192"),
    ("MaxRecvDataSegmentLength", "262144"),
    ("MaxOutstandingR2T", "16"),
)

# What the target offers, per transport (`blkps target start --transport`).
TARGET = {
    "iscsi": ISCSI,
    # tgt's iSER moves all data by RDMA: it creates the target with
    # InitialR2T=Yes and ImmediateData=No, which must stay (unsolicited data
    # would need two buffers per task); a command carries at most one buffer
    # of its pool, 512 KiB (RDMA_TRANSFER_SIZE), so no burst goes beyond that.
    "iser": (
        ("MaxBurstLength", "524288"),
        ("MaxOutstandingR2T", "16"),
    ),
}

# tgt 1.0.85 queues at most this many commands per session (MaxQueueCmd).
TARGET_QUEUE_COMMANDS = 128

# open-iscsi's node-record key for each negotiated key it takes (it keeps
# one R2T outstanding whatever it is told, so MaxOutstandingR2T is not one).
# The target lowers what it cannot do (iSER: InitialR2T, bursts).
_INITIATOR_KEYS = {
    "InitialR2T": "node.session.iscsi.InitialR2T",
    "ImmediateData": "node.session.iscsi.ImmediateData",
    "FirstBurstLength": "node.session.iscsi.FirstBurstLength",
    "MaxBurstLength": "node.session.iscsi.MaxBurstLength",
    "MaxRecvDataSegmentLength": "node.conn[0].iscsi.MaxRecvDataSegmentLength",
}


def initiator(queue_depth, replacement_timeout):
    """The (key, value) pairs `blkps login` writes into a node record before
    it logs in, in order: no login at boot, the negotiated keys, the
    session's command window (the target's queue), the LUN queue depth, and
    how long the kernel queues I/O while the session is down."""
    return (("node.startup", "manual"),
            *((_INITIATOR_KEYS[key], value) for key, value in ISCSI if key in _INITIATOR_KEYS),
            ("node.session.cmds_max", str(TARGET_QUEUE_COMMANDS)),
            ("node.session.queue_depth", str(queue_depth)),
            ("node.session.timeo.replacement_timeout", str(replacement_timeout)))
