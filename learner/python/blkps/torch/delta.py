"""blkps.torch.delta: delta mode's steps (DistributedOptimizer given a
local optimizer). The local optimizer steps the parameters, which are
views into the flat weights (blkps.torch.staging); the change it made is
pushed whole, on a connection of its own, and the server's weights are
pulled back into the parameters, with the look-ahead step. The optimizer
core (blkps.torch.optimizer) keeps the mode, the shares and the counters."""

import torch


class DeltaSteps:
    """Delta mode's steps of `optimizer` (a torch optimizer over views of
    `flat`'s weights, a FlatModel with no buckets): pulls through `device`
    (the training thread's blkps.Model), pushes through a connection that
    `connect` opens at the first push. Driven from the training thread."""

    def __init__(self, optimizer, flat, device, connect):
        self.optimizer = optimizer
        self._flat, self._device, self._connect = flat, device, connect
        self.push_device = None  # opened by the first push

    def step(self, closure, skip_nonfinite, scale, push_skipped):
        """Steps the local optimizer (with `closure`, if any), pushes the
        change it made to the weights times `scale()` (called once the
        change is known) and pulls. `skip_nonfinite`: a change with a NaN
        or infinite value is pushed as zeros (not at all unless
        `push_skipped`). Returns (the closure's loss, whether the step was
        skipped, whether it was pushed)."""
        flat = self._flat
        delta = flat.gradient
        delta.copy_(flat.weights)  # the weights before the local step
        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        torch.sub(flat.weights, delta, out=delta)
        skipped = skip_nonfinite and not flat.gradient_finite()
        if skipped:
            delta.zero_()
        factor = scale()
        if factor != 1.0:
            delta.mul_(factor)
        pushed = push_skipped or not skipped
        if pushed:
            self._push()
        self.pull()  # a skipped step's local change is undone here
        return loss, skipped, pushed

    def skipped(self, push):
        """A step the local optimizer did not take (GradScaler skipped it):
        pushes zeros when `push` (what bsp and ssp count), pulls."""
        self._flat.gradient.zero_()
        if push:
            self._push()
        self.pull()

    def pull(self):
        """The server's weights into the parameters, then the look-ahead
        step (look_ahead times the move since the last pull)."""
        self._flat.pull_all(self._device)

    def _push(self):
        if self.push_device is None:  # pushes on their own connection, as in gradient mode
            self.push_device = self._connect()
        self._flat.push_all(self.push_device)

    def close(self):
        """Closes the push connection, if one was opened."""
        if self.push_device is not None:
            self.push_device.close()
            self.push_device = None
