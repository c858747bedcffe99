"""Which runs bench/gpu.sh makes and in which order (doc/gpu.md
"bench/gpu.sh"): a run is one server mode, pipeline setting, model, wire
and learner count. A GPU host is lent for minutes, so the runs that answer
the most come first and a time budget ends the list: runs it leaves out are
records "not run (budget)", never estimated.

The order: one learner in async (pipeline on, then off), then one learner
in bsp, then two learners (async on, bsp, the ceiling: plain processes
with MPS off and on, then async off); within each, the models and wires in
the order asked. A ceiling (gpu_ceiling) is a Ceiling, not a Run.
"""
import time
from collections import namedtuple

MODES = ("async", "bsp")
PIPELINES = ("default", "on", "off")  # default: blkps.torch's own choice (nothing passed)
WIRES = ("float32", "bfloat16")
NOT_RUN = "not run (budget)"

Run = namedtuple("Run", "mode pipeline model wire learners")
Ceiling = namedtuple("Ceiling", "model learners mps")  # mps: gpu_ceiling.MPS_SETTINGS


def runs(models, modes, pipelines, wires, learners):
    """Every run of these lists, most telling first (the module's order).
    bsp takes no pipeline option (its next forward needs this round's
    weights): its runs are "default" whatever `pipelines` says."""
    out = []
    for mode in modes:
        for pipeline in (pipelines if mode != "bsp" else ["default"]):
            for m, model in enumerate(models):
                for w, wire in enumerate(wires):
                    for n in learners:
                        out.append(Run(mode, pipeline, model, wire, n))

    def priority(run):
        if run.learners == 1:
            tier = 0 if run.mode != "bsp" else 1
        else:
            tier = 2 + (1 if run.mode == "bsp" else 2 if run.pipeline == "off" else 0)
        return (tier, run.learners, models.index(run.model), wires.index(run.wire),
                PIPELINES.index(run.pipeline) if run.pipeline != "default" else 0)
    return sorted(out, key=priority)


def with_ceilings(planned, models, mps):
    """`planned` (Runs, in order) with the ceilings of each learner count
    above 1 among them, MPS settings `mps` each, put before the first run
    of several learners in async with the pipeline off (else at the end)."""
    counts = sorted({r.learners for r in planned if r.learners > 1})
    ceilings = [Ceiling(model, n, m) for n in counts for model in models for m in mps]
    at = next((k for k, r in enumerate(planned) if r.learners > 1 and r.mode == "async" and r.pipeline == "off"),
              len(planned))
    return planned[:at] + ceilings + planned[at:]


def all_runs(models, mps):
    """--all: both wires, 1 and 2 learners, async with the pipeline on and
    off, bsp (issue 36 item 8, issue 37 item 1), and two plain processes
    with MPS off and on (issue 37 item 4)."""
    return with_ceilings(runs(models, list(MODES), ["on", "off"], list(WIRES), [1, 2]), models, mps)


class Budget:
    """Seconds from construction within which runs may start (None: no
    end). A run that starts in time may end past it, bounded by the run's
    own timeout (capped())."""

    def __init__(self, seconds, clock=time.monotonic):
        self.seconds, self._clock, self._start = seconds, clock, clock()

    def left(self):
        return float("inf") if self.seconds is None else self.seconds - (self._clock() - self._start)

    def spent(self):
        return self.left() <= 0

    def capped(self, timeout, grace):
        """`timeout`, or less: the budget left plus `grace`, so that a
        run started near the end cannot hold the host much past it."""
        return min(timeout, max(self.left(), 0) + grace)
