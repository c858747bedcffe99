"""blkps.torch.forward_waits: with overlap_pull, each module's forward
waits for the buckets that hold the weights it reads, and for nothing else
(doc/gpu.md "GPU learners": the rules), so that the first layers compute
while the last ones' weights still arrive.

A global module pre-hook (torch.nn.modules.module's) sees every forward,
so no model is needed. Which forwards run is recorded until the first
step(); until then each forward waits for the whole model (no pull is in
flight yet). After it, a module waits for the buckets of the parameters it
reads: its own, and those of its descendants whose forward did not run (it
reads them itself, as nn.MultiheadAttention reads its out_proj's); the
first forward after each step() waits first for the parameters that no
module that ran reads."""

import weakref

import torch


def params_read(module, ran):
    """The parameters `module`'s forward reads, as far as modules tell: its
    own, and those of its descendants whose forward is not in `ran` (the
    modules whose forward ran): a module may read a child's parameters
    without calling it, as nn.MultiheadAttention reads its out_proj's."""
    params = list(module.parameters(recurse=False))
    for child in module.children():
        if child not in ran:
            params += params_read(child, ran)
    return params


class ForwardWaits:
    """The waits of one optimizer's forwards over `layout`'s parameters,
    cut into `buckets` (buckets_of[k]: those of parameter k). The optimizer
    hands over how to wait: wait_all() for every weight of the last step,
    wait(buckets) for those buckets' weights. Driven from the training
    thread; close() removes the hook."""

    def __init__(self, layout, buckets, buckets_of, wait_all, wait):
        self._layout, self._buckets, self._buckets_of = layout, buckets, buckets_of
        self._wait_all, self._wait = wait_all, wait
        self._index = {id(p): k for k, (_, p) in enumerate(layout.named)}
        self._of_module = weakref.WeakKeyDictionary()  # module -> the buckets it waits for
        self.ran = weakref.WeakSet()  # the modules whose forward ran before the first step()
        self.learning = True
        self._unread = []  # the buckets of parameters no module that ran reads
        self._unread_due = False
        self.skip = None  # skip(module, inputs): True for a forward that needs no wait (RowsFirst)
        self.log = False  # tests: record which buckets each module's forward waited for
        self.waited = []  # with log: (module, [bucket indices]) in forward order
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._before_forward)

    def _before_forward(self, module, inputs):
        if self.learning:
            self.ran.add(module)
            self._wait_all()
            return
        if self._unread_due:
            self._unread_due = False
            self._wait(self._unread)
        if self.skip is not None and self.skip(module, inputs):
            return
        buckets = self._of_module.get(module)
        if buckets is None:
            buckets = self._of_module[module] = self.buckets_of_params(params_read(module, self.ran))
        if self.log and buckets:
            self.waited.append((module, [self._buckets.index(b) for b in buckets]))
        self._wait(buckets)

    def buckets_of_params(self, params):
        """The buckets that the layout's parameters among `params` lie in, in layout order."""
        ks = [self._index[id(p)] for p in params if id(p) in self._index]
        return sorted({id(b): b for k in ks for b in self._buckets_of[k]}.values(), key=lambda b: b.first)

    def stepped(self):
        """step() ended: the first one ends the learning (which forwards
        run is known, and so the parameters none of them reads); the next
        forward waits first for those. Returns whether it learnt now."""
        learnt = self.learning
        if learnt:
            self.learning = False
            read = {id(p) for m in self.ran for p in params_read(m, self.ran)}
            self._unread = self.buckets_of_params(p for _, p in self._layout.named if id(p) not in read)
        self._unread_due = True
        return learnt

    def close(self):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
