"""blkps.torch.session: this process's place in the job. init() reads the
launcher's environment (torchrun, mpirun, Slurm) for the ranks and the
topology, and the model's target and control LUN; the job's control holds
the collectives' exchange (opened on first use) and this rank's heartbeat.
shutdown() closes them, and the DistributedOptimizer made in the session
(`active_optimizer`), which the collectives and early stopping drain."""

import os
import re

from blkps.collectives import Exchange as _Exchange, Heartbeat as _Heartbeat, session_of as _session_of
from blkps.collectives import heartbeat_period as _heartbeat_period
from blkps.control import describe_layout as _describe_layout, open_control as _open_control

_job = None
active_optimizer = None   # the DistributedOptimizer of this session (blkps.torch.horovod), or None
pending_broadcast = None  # (root_rank, timeout_s) of a broadcast_parameters made before DistributedOptimizer


class _Job:
    """What init() found: this process's place in the job and its targets;
    the collectives' exchange, opened on first use, and this rank's
    heartbeat (several ranks and a control LUN: from init() on)."""

    def __init__(self, target, control, rank, size, local_rank, topology=(1, 0, 1), session=b""):
        self.target, self.control = target, control
        self.rank, self.size, self.local_rank = rank, size, local_rank
        self.local_size, self.cross_rank, self.cross_size = topology
        self.session = session
        self.exchange = None
        self.heartbeat = None
        self.stop_reader = None  # a Control for stop_requested()


def _launcher_env(env):
    """(rank, size, local_rank) from a launcher's environment: torchrun,
    mpirun (Open MPI) or Slurm; else (0, 1, 0)."""
    for rank_key, size_key, local_key in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                                          ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK"),
                                          ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")):
        if rank_key not in env:
            continue
        values = []
        for key, default in ((rank_key, None), (size_key, "1"), (local_key, env[rank_key])):
            text = env.get(key, default)
            if not text.isdigit():
                raise ValueError(f"blkps.torch: {key}={text!r} is not a whole number")
            values.append(int(text))
        rank_, size_, local = values
        if rank_ >= size_:
            raise ValueError(f"blkps.torch: {rank_key}={rank_} is not below {size_key}={size_}")
        return rank_, size_, local
    return 0, 1, 0


def _whole(env, key, default=None):
    text = env.get(key, default)
    if text is None:
        return None
    if not text.isdigit():
        raise ValueError(f"blkps.torch: {key}={text!r} is not a whole number")
    return int(text)


def _slurm_tasks_on_node(text, node):
    """Tasks on node `node` from Slurm's SLURM_TASKS_PER_NODE ("2(x3),1"),
    or None when the text is not of that form."""
    counts = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if node < len(counts) else None


def _launcher_topology(env, rank_, size_, local):
    """(local_size, cross_rank, cross_size) as Horovod means them: the
    processes on this node, this node's index, the nodes. torchrun:
    LOCAL_WORLD_SIZE, GROUP_RANK (GROUP_WORLD_SIZE, else WORLD_SIZE /
    LOCAL_WORLD_SIZE); mpirun: OMPI_COMM_WORLD_LOCAL_SIZE, the node index
    taken as rank // local_size (ranks filled node by node, mpirun's
    default mapping); Slurm: SLURM_TASKS_PER_NODE (or
    SLURM_NTASKS_PER_NODE), SLURM_NODEID, SLURM_NNODES. Without them:
    (size, 0, 1), one node."""
    if "RANK" in env and "LOCAL_WORLD_SIZE" in env:
        local_size = max(1, _whole(env, "LOCAL_WORLD_SIZE"))
        cross = _whole(env, "GROUP_RANK", str(rank_ // local_size))
        nodes = _whole(env, "GROUP_WORLD_SIZE", str(-(-size_ // local_size)))
        return local_size, cross, nodes
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_LOCAL_SIZE" in env:
        local_size = max(1, _whole(env, "OMPI_COMM_WORLD_LOCAL_SIZE"))
        return local_size, rank_ // local_size, -(-size_ // local_size)
    if "SLURM_PROCID" in env and "SLURM_NODEID" in env:
        node = _whole(env, "SLURM_NODEID")
        nodes = _whole(env, "SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1"))
        local_size = _slurm_tasks_on_node(env.get("SLURM_TASKS_PER_NODE", ""), node)
        if local_size is None:
            local_size = _whole(env, "SLURM_NTASKS_PER_NODE", str(-(-size_ // max(1, nodes))))
        return local_size, node, nodes
    return size_, 0, 1


def _format_target(text, rank_):
    """`text` with {rank} (0-based) and {slot} (1-based LUN) filled in."""
    return None if text is None else text.replace("{rank}", str(rank_)).replace("{slot}", str(rank_ + 1))


def init(target=None, control=None, env=None):
    """Finds this learner's rank and size from the launcher's environment
    (RANK/WORLD_SIZE/LOCAL_RANK, OMPI_COMM_WORLD_*, SLURM_PROCID/SLURM_NTASKS;
    else rank 0 of 1) and its model target: `target` or $BLKPS_TARGET, and the
    model's control LUN: `control` or $BLKPS_CONTROL (optional, but needed for
    broadcast_parameters and the fingerprint check; a layout:PATH target
    whose file names its shards' control LUNs is its own control). In both, {rank} becomes
    the rank and {slot} the rank + 1, so one string serves every learner:
    iscsi://h:3260/iqn.../{slot}, /mnt/model/slot{slot},
    layout:/d/slot-{slot}.layout. Raises ValueError when no target is given."""
    global _job
    env = os.environ if env is None else env
    rank_, size_, local = _launcher_env(env)
    target = target if target is not None else env.get("BLKPS_TARGET")
    control = control if control is not None else env.get("BLKPS_CONTROL")
    if not target:
        raise ValueError("blkps.torch: no model target; pass init(target=...) or set BLKPS_TARGET")
    if not control and target.startswith("layout:"):
        # A layout that names its shards' control LUNs (blkps target start
        # --tgtd N) is the job's control too (doc/data-path.md "Scale-out").
        try:
            if _describe_layout(_format_target(target, rank_)[len("layout:"):])["controls"]:
                control = target
        except OSError:
            pass  # no layout there (yet): opening the target says so
    shutdown()
    _job = _Job(_format_target(target, rank_), _format_target(control or None, rank_), rank_, size_, local,
                _launcher_topology(env, rank_, size_, local), _session_of(env, size_))
    if size_ > 1 and _job.control:
        # From here on, however busy this rank is, the others waiting in a
        # collective see it alive (blkps.collectives "A dead rank and a slow one").
        job = _job
        job.heartbeat = _Heartbeat(lambda: _collectives_control(job), rank_, job.session,
                                   _heartbeat_period(collective_dead_after_s()))


def the_job():
    if _job is None:
        raise ValueError("blkps.torch: call blkps.torch.init() first")
    return _job


def rank():
    """This learner's rank, 0-based."""
    return the_job().rank


def size():
    """The number of learners."""
    return the_job().size


def local_rank():
    """This learner's rank on its node."""
    return the_job().local_rank


def local_size():
    """The number of learners on this node (_launcher_topology)."""
    return the_job().local_size


def cross_rank():
    """This learner's node, 0-based (_launcher_topology)."""
    return the_job().cross_rank


def cross_size():
    """The number of nodes (_launcher_topology)."""
    return the_job().cross_size


def is_initialized():
    """Whether init() has run (and shutdown() has not)."""
    return _job is not None


def shutdown():
    """Closes the collectives' connection and the DistributedOptimizer;
    is_initialized() is False afterwards."""
    global _job, active_optimizer, pending_broadcast
    if active_optimizer is not None:
        active_optimizer.close()
        active_optimizer = None
    pending_broadcast = None
    if _job is not None:
        for conn in (_job.exchange, _job.heartbeat, _job.stop_reader):
            if conn is not None:
                conn.close()
        _job = None


def target():
    """This learner's model target (formatted)."""
    return the_job().target


def control():
    """The model's control LUN (formatted), or None."""
    return the_job().control


# ---- the collectives' exchange through the server (blkps.collectives) ----

# A rank silent this long is dead; a live rank heartbeats (blkps.collectives).
_COLLECTIVE_DEAD_AFTER_S = 30.0


def collective_dead_after_s():
    text = os.environ.get("BLKPS_COLLECTIVE_DEAD_S", "")
    try:
        seconds = float(text) if text else _COLLECTIVE_DEAD_AFTER_S
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"blkps.torch: BLKPS_COLLECTIVE_DEAD_S={text}: expected seconds, a number > 0")
    return seconds


def _collectives_control(job):
    """A new Control of the job's control LUN for collectives and heartbeats:
    a sharded job's is shard 0's."""
    control = _open_control(job.control)
    if hasattr(control, "shards"):
        for other in control.shards[1:]:
            other.close()
        control = control.shards[0]
    return control


def exchange():
    """This process's Exchange on the model's control LUN, opened on first use."""
    job = the_job()
    if job.exchange is None:
        if job.size > 1 and not job.control:
            raise ValueError("blkps.torch: collectives need the model's control LUN (init(control=...) "
                             "or BLKPS_CONTROL)")
        if job.size == 1:
            job.exchange = _SoloExchange()
        else:
            dead_after = collective_dead_after_s()
            control = _collectives_control(job)
            try:
                job.exchange = _Exchange(control, job.rank, job.size, job.session, dead_after)
            except Exception:
                control.close()
                raise
    return job.exchange


class _SoloExchange:
    """One learner: every collective is its own data."""
    rounds = 0

    def exchange(self, label, data, timeout_s=None):
        return [bytes(data)]

    def close(self):
        pass
