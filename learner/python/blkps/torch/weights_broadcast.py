"""blkps.torch.weights_broadcast: broadcast_parameters() once the optimizer
core holds the model: root writes the model's parameters to the server
through the control LUN and marks the model's tag; then every learner
pulls them. Three collective rounds order it (none with one learner):
every learner has stamped the tag before root marks it, root has written
before anyone reads, and everyone has pulled before anyone steps."""

import torch

from blkps.torch.layout import TAG_PREFIX
from blkps.torch.session import exchange

_BROADCAST_MARK = ":broadcast"


def broadcast_weights(job, control, layout, flat, device, values, root_rank, timeout_s=None):
    """Makes root_rank's `values` (tensors in the order of `layout`'s
    parameters) the server's weights and every learner's parameters (`flat`,
    pulled through `device`, the training thread's blkps.Model), the model
    target's control LUN `control` carrying them. `timeout_s` (None: no
    bound): the longest each round waits for the other learners
    (blkps.collectives.CollectiveTimeout). REQUIRES: no transfer in flight."""
    tag = TAG_PREFIX + layout.fingerprint

    def join(step):
        if job.size > 1:
            exchange().exchange(f"broadcast_parameters:{tag}:{step}", b"", timeout_s)

    # Every learner has stamped the model's tag (layout.check_device, when
    # it found none) before root marks it: a stamp read before root's and
    # written after its mark would clear the mark. The fingerprint is in
    # the label, so learners of different models fail here naming both.
    join(f"root{root_rank}")
    if job.rank == root_rank:
        weights = flat.weights.detach().to("cpu", copy=True)
        with torch.no_grad():
            for view, v in zip(layout.views(weights), values):
                view.copy_(v.detach())  # in the parameter's own memory order
        control.command(f"tag={tag}")  # clear the mark while the weights change
        control.write_weights(weights.numpy())
        control.command(f"tag={tag}{_BROADCAST_MARK}")
    join("written")  # root has written the weights before it joins: every learner reads them now
    if job.size > 1:
        seen = control.status().get("tag", "")
        if seen != tag + _BROADCAST_MARK:
            raise ValueError(f"blkps.torch: rank {root_rank} broadcast no weights of this model "
                             f"(model tag {seen!r}, expected {tag + _BROADCAST_MARK!r})")
    flat.forget_pulls()  # the broadcast is no move of the model (look_ahead)
    flat.pull_all(device)
    # Nobody steps before everyone has pulled: in async a quick learner's
    # first push would otherwise reach a slower learner's pull, and that
    # learner would not start from root's weights.
    join("pulled")
