"""blkps.pushing_learners: the N of an async step, as the server counts it.

In async and ssp the server takes a push as 1/N of a round, N the learners
taking part: the learner slots that pushed within ``dead_after``, read-only
and spare LUNs never (the control LUN's counters' ``pushing_learners``;
doc/async.md "One N: the learners that push"). blkps.torch takes the same N
for its delta-mode push scale (1/N) and its default look-ahead ((N-1)/N),
read here once per step.

At a job's start the server has counted only the learners whose first push
has landed, so learners starting together would each read a different
count for their first steps. Until the server's count has reached the
launcher's size, N is the launcher's size; likewise while the count is 0
(no learner pushed within ``dead_after``: the job is new, or every learner
paused, for an evaluation say), and from then on until it has reached the
launcher's size again. Once reached, N follows the server's count: a learner
that stops pushing leaves the others a larger share; one more than the
launcher started (a second job on the model) a smaller one.
"""

__all__ = ["PushingLearners"]


class PushingLearners:
    """The N of this learner's async steps. `launched`: the launcher's size
    (blkps.torch.size()); `control`: the model's blkps.control Control or
    ShardedControl (shard 0's is read: every shard counts the same slots),
    or None (no control LUN, or bsp: N is `launched` always). One thread at
    a time, the control's."""

    def __init__(self, launched, control):
        self.launched = launched
        self._control = getattr(control, "shards", [control])[0]
        self._reached = False  # the server's count reached `launched` since it was last 0

    def count(self):
        """N now: one read of the counters record (4 KiB), none without a
        control LUN."""
        if self._control is None:
            return self.launched
        counted = self._control.counters()["pushing_learners"]
        if counted == 0:
            self._reached = False
        elif counted >= self.launched:
            self._reached = True
        return counted if self._reached else self.launched
