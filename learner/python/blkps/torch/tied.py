"""blkps.torch.tied: a weight used at both ends of the forward (a tied
input/output embedding, GPT-2's ``wte``), pushed in the two parts a bsp
server with ``parts=FIRST:COUNT:2`` takes in one round (doc/server.md "A
gradient in parts"; doc/pytorch.md "A tied weight in two parts").

- Part 1, the output head's: a hook on the autograd node that hands the
  head's gradient to the weight (the node whose inputs include the
  weight's gradient accumulator, found from the head module's output after
  each forward: TBackward0 behind nn.Linear's matmul, ToCopyBackward0 under
  autocast) fires as soon as that use's backward is done. The gradient is
  added into this part's buffer and taken out of the flow to the weight
  (the hook hands autograd None for it), so the flat gradient receives the
  rest only. The buffer covers the whole range [FIRST, FIRST+COUNT), zeros
  around the weight, and is pushed as one call of its own.
- Part 2, the rest (the embedding rows' part, and the whole gradient of
  every other parameter in the range): the flat gradient, pushed by the
  ordinary buckets at the end of backward.

- The pull order (RowsFirst, with overlap_pull): after step() the
  embedding's forward pre-hook reads only its input's token rows of the
  weight; the whole matrix's pull is queued once that forward is done and
  waited for by the output head's pre-hook.

Exactness: autograd would add the head's and the rows' gradients once
(two addends: the order does not matter) into the weight's gradient; the
learner's two parts are exactly those two addends. The server adds the
parts of all learners in their arrival order, which is where float
rounding may differ from a one-process run (tests/torch_test.py
`tied-parts` compares within the bsp cases' tolerance).

A module forward hook is not used: it sees the head's input and output,
not the weight's gradient, which it would have to compute again (a second
matmul over the vocabulary). A tensor hook on the weight fires once, with
both uses' gradients already added.

Threads: the node hook runs where autograd runs the head's backward (the
training thread on the CPU, autograd's device thread on a GPU); host() on
the communication thread; everything else on the training thread, between
steps or while the part is not queued.
"""

import collections

import torch

from blkps.torch.staging import WIRE_TORCH_DTYPES, as_numpy, host_tensor

PARTS = 2  # what blkps.torch pushes: the head's part and the rest


def server_parts(status):
    """(FIRST, COUNT, K) of the server's parts= as its status shows it
    (doc/server.md "Status and control": `parts` is "FIRST:COUNT:K" or
    ""), or None."""
    text = (status or {}).get("parts", "")
    if not text:
        return None
    first, count, k = (int(v) for v in text.split(":"))
    return first, count, k


def _parts_for(status, offset, numel):
    """The parts= that covers [offset, offset + numel) in whole model blocks."""
    block = status["block_bytes"] // 4
    first = offset // block * block
    end = min(status["params"], -(-(offset + numel) // block) * block)
    return f"parts={first}:{end - first}:{PARTS}"


def check_parts(status, layout, tied_head, gradient_mode, pull_during_backward):
    """(FIRST, COUNT, index): the server's range and the layout index of
    `tied_head`'s weight (a module whose `weight` is a parameter of
    `layout`), or None when there is none to push in parts.
    Refuses, in one line saying what to give, a server and an optimizer that
    disagree: the server takes parts but nothing here pushes them (its rounds
    would wait for the missing part until hold_limit), or tied_head is given
    to a server without parts=, with other K, a range that does not cover
    the weight, or in delta mode or with pull_during_backward=True."""
    parts = server_parts(status)
    if tied_head is None:
        if parts is not None:
            first, count, k = parts
            what = ("give gradient mode (DistributedOptimizer(None, ...)) with tied_head=" if not gradient_mode
                    else "give tied_head=")
            raise ValueError(f"blkps.torch: the server takes the gradient of parameters [{first}, {first + count}) "
                             f"in {k} parts a round (parts={first}:{count}:{k}); {what}<the output head module "
                             "whose weight is tied> (doc/pytorch.md \"A tied weight in two parts\"), or serve the "
                             "model without parts=")
        return None
    weight = getattr(tied_head, "weight", None)
    index = {id(p): k for k, (_, p) in enumerate(layout.named)}
    if not isinstance(weight, torch.nn.Parameter) or id(weight) not in index:
        raise ValueError(f"blkps.torch: tied_head={type(tied_head).__name__}: its weight is not one of the model's "
                         "parameters; give the output head module whose weight is the tied embedding's")
    at = index[id(weight)]
    name, offset, numel = layout.named[at][0], layout.offsets[at], weight.numel()
    if not gradient_mode:
        raise ValueError("blkps.torch: tied_head needs gradient mode (DistributedOptimizer(None, ...)): delta mode "
                         "pushes the change of the weights in one push")
    if status is None:
        raise ValueError("blkps.torch: tied_head needs the model's control LUN (init(control=...) or "
                         "BLKPS_CONTROL) to read the server's parts=")
    want = _parts_for(status, offset, numel)
    if parts is None:
        raise ValueError(f"blkps.torch: tied_head: the server takes no gradient in parts; serve the model with "
                         f"--bsopts \"mode=bsp;{want}\" (the blocks of {name})")
    first, count, have_k = parts
    if have_k != PARTS or not first <= offset < offset + numel <= first + count:
        raise ValueError(f"blkps.torch: tied_head: the server's parts={first}:{count}:{have_k} does not cover "
                         f"{name} [{offset}, {offset + numel}) in {PARTS} parts; serve it with {want}")
    if pull_during_backward:
        raise ValueError("blkps.torch: tied_head with pull_during_backward=True: a pull between the two parts "
                         "would read the weights before the round; leave pull_during_backward unset in bsp")
    return first, count, at


class TiedWeight:
    """The head's part of parameter `index` of `layout` (the weight of module
    `head`), over the server's range [first, first + count): its buffer on
    the model's device, its host staging for the wire of `flat`
    (blkps.torch.staging.FlatModel, whose copy-out stream it shares), and
    the hook that fills it. on_gradient(added) is called on the hook's
    thread after each of the head's gradients: the optimizer queues the
    part's push once the step's passes are in."""

    def __init__(self, layout, flat, head, first, count, index, on_gradient):
        self.first, self.count = first, count
        self.end = first + count
        self.name = layout.named[index][0]
        self.weight = self._weight = layout.named[index][1]
        self.offset = layout.offsets[index]  # of the weight in the flat model
        self.width = self._weight[0].numel() if self._weight.dim() else 1  # values in a row
        self._flat, self._on_gradient = flat, on_gradient
        self._accumulator = None  # the weight's AccumulateGrad node: found at the first forward
        at = layout.offsets[index] - first
        if flat.cuda:
            self.gradient = torch.zeros(count, dtype=torch.float32, device=flat.device)
            self._host = host_tensor(count, WIRE_TORCH_DTYPES[flat.wire], True)
            self._ready, self._copied = torch.cuda.Event(), torch.cuda.Event()
        else:
            self.gradient = host_tensor(count, torch.float32, False)
            self._host = host_tensor(count, WIRE_TORCH_DTYPES[flat.wire], False) if flat.sixteen else self.gradient
        self._np = as_numpy(self._host)
        self._view = self.gradient[at:at + self._weight.numel()].view(self._weight.shape)
        self.queued = False  # its push of this step is queued
        self.passes = 0      # head backwards this step
        self.pushes = 0      # parts pushed (counted by the communication thread)
        self._handle = head.register_forward_hook(self._after_head)

    def close(self):
        self._handle.remove()

    def readers(self, ran):
        """The modules among `ran` (those whose forward ran) that read the
        weight's rows first: nn.Embedding modules whose weight it is.
        Refuses, in one line, one that renormalises rows in its forward."""
        found = [m for m in ran if isinstance(m, torch.nn.Embedding) and m.weight is self._weight]
        for m in found:
            if m.max_norm is not None:
                raise ValueError(f"blkps.torch: tied_head with an nn.Embedding of max_norm={m.max_norm}: its "
                                 f"forward rescales rows of {self.name} in place, which the next pull "
                                 "overwrites; give max_norm=None")
        return found

    def _after_head(self, _module, _inputs, output):
        """After each forward of the head: hooks the node that hands the
        head's gradient to the weight (none when no gradient is taken)."""
        if not isinstance(output, torch.Tensor) or output.grad_fn is None:
            return
        if self._accumulator is None:
            with torch.enable_grad():
                self._accumulator = self._weight.expand_as(self._weight).grad_fn.next_functions[0][0]
        found = self._node_to_weight(output.grad_fn)
        if found is None:
            raise RuntimeError(f"blkps.torch: tied_head: its output's graph does not reach {self.name}; give the "
                               "module that reads the tied weight as the output head")
        node, edge = found
        node.register_hook(self._make_hook(edge))

    def _node_to_weight(self, start):
        """(node, edge): the node nearest `start` whose input `edge` is the
        weight's accumulator (the head's own use, before any earlier use
        further back in the graph), or None."""
        frontier, seen = [start], {id(start)}
        while frontier:
            below = []
            for node in frontier:
                for edge, (fn, _) in enumerate(node.next_functions):
                    if fn is self._accumulator:
                        return node, edge
                    if fn is not None and id(fn) not in seen:
                        seen.add(id(fn))
                        below.append(fn)
            frontier = below
        return None

    def _make_hook(self, edge):
        def hook(grad_inputs, _grad_outputs):
            gradient = grad_inputs[edge]
            if gradient is None:
                return None
            self.add(gradient)
            return tuple(None if e == edge else g for e, g in enumerate(grad_inputs))
        return hook

    def add(self, gradient):
        """Adds the head's gradient of one backward into the part (it
        leaves the flow to the weight), then on_gradient(True); a gradient
        after the part was queued is dropped: on_gradient(False)."""
        if self.queued:
            self._on_gradient(False)
            return
        with torch.no_grad():
            self._view.add_(gradient)
        self.passes += 1
        self._on_gradient(True)

    # ---- staging: the training thread, then the communication thread ----

    def ready(self, scale, zero=False):
        """The part is complete (`zero`: zeros go instead, a skipped
        step): on a GPU, queue its scaling, narrowing and copy to the host
        on the copy-out stream behind the compute stream's work so far (the
        hook's stream)."""
        self.queued = True
        self._scale = scale
        if zero or not self._flat.cuda:
            return
        copy_out = self._flat.copy_out
        self._ready.record(torch.cuda.current_stream(self._flat.device))
        with torch.cuda.device(self._flat.device), torch.cuda.stream(copy_out):
            copy_out.wait_event(self._ready)
            if scale != 1.0:
                self.gradient.mul_(scale)
            wire = self.gradient if not self._flat.sixteen else self.gradient.to(self._host.dtype)
            self._host.copy_(wire, non_blocking=True)
            self._copied.record(copy_out)

    def host(self, zero=False):
        """The host array to push at `first` (communication thread): the
        part, or zeros."""
        if zero:
            self._host.zero_()
        elif self._flat.cuda:
            self._copied.synchronize()
        else:
            if self._scale != 1.0:
                self.gradient.mul_(self._scale)
            if self._flat.sixteen:
                self._host.copy_(self.gradient)
        return self._np

    def finite(self):
        """Whether the part holds only finite values (skip_nonfinite)."""
        return bool(torch.isfinite(self.gradient).all())

    def reset(self):
        """The next step's part: zeros (REQUIRES: its push has ended; on a
        GPU after FlatModel.release_gradient())."""
        self.gradient.zero_()
        self.queued, self.passes = False, 0


def row_ranges(ids, offset, width, rows):
    """[(first, end)] parameter ranges that hold the rows `ids` (a tensor
    of row indices) of a weight of `rows` rows `width` values wide at
    `offset`: each distinct row once, in row order, adjacent rows in one
    range; None when an id is not a row (the embedding's forward says so)."""
    ranges = []
    distinct = torch.unique(ids.detach().reshape(-1).cpu()).tolist()
    if distinct and not 0 <= distinct[0] <= distinct[-1] < rows:
        return None
    for r in distinct:
        first, end = offset + r * width, offset + (r + 1) * width
        if ranges and ranges[-1][1] == first:
            ranges[-1][1] = end
        else:
            ranges.append([first, end])
    return [tuple(r) for r in ranges]


class RowsFirst:
    """bsp with overlap_pull (doc/pytorch.md "A tied weight in two parts"):
    the pull order of the tied weight `tied` (a TiedWeight). After step()
    the buckets that hold the weight (`buckets`) are not pulled with the
    others: the forward pre-hook of each nn.Embedding whose weight it is
    (the readers, found among the modules that ran at the first step)
    reads only the rows of its input's token ids, on the training thread's
    connection, into the parameters; once that forward is done the
    buckets' pull is queued (`queue_pull`, the optimizer's), and the
    output head's pre-hook waits for them as for any bucket. A wait for
    one of the buckets before that (another module reads them, drain())
    queues them at once.

    Exactness: a bsp read of a block waits until the block's round is
    complete on the server (doc/server.md), both parts in; the rows read
    are that round's, and the whole matrix's pull brings the same values."""

    def __init__(self, tied, flat, device, buckets, readers, queue_pull):
        self.tied, self._flat, self._device = tied, flat, device
        self.buckets = buckets
        self._ids = {id(b) for b in buckets}
        self._queue_pull = queue_pull
        self.due = False  # this step's pull of the buckets is not queued yet
        self.rows = 0     # rows read first, all steps
        # The last events, oldest first: "rows" (read) and "matrix" (its pull queued).
        self.order = collections.deque(maxlen=16)
        self._handles = [m.register_forward_hook(self._after_reader) for m in readers]
        self._readers = set(id(m) for m in readers)

    def close(self):
        for h in self._handles:
            h.remove()

    def defers(self, bucket):
        """Whether the step's pull of `bucket` waits for the readers (its
        weights are marked not arrived: the due pull)."""
        if id(bucket) not in self._ids:
            return False
        bucket.arrived.clear()
        self.due = True
        return True

    def reads_rows(self, module, inputs):
        """A forward pre-hook: when `module` is a reader and the buckets'
        pull is still due, reads the rows of its input ids into the
        parameters and returns True (the module waits for nothing more)."""
        if not self.due or id(module) not in self._readers or not inputs:
            return False
        ranges = row_ranges(inputs[0], self.tied.offset, self.tied.width, self.tied.weight.shape[0])
        if ranges is None:
            return False
        self._flat.pull_ranges(self._device, ranges)
        self.rows += sum(end - first for first, end in ranges) // self.tied.width
        self.order.append("rows")
        return True

    def _after_reader(self, module, _inputs, _output):
        self.queue_due()

    def queue_due(self, buckets=None):
        """Queues the buckets' pull if it is due (`buckets`: only when one
        of those is the weight's)."""
        if not self.due or (buckets is not None and not any(id(b) in self._ids for b in buckets)):
            return
        self.due = False
        self.order.append("matrix")
        self._flat.after_compute()
        for b in reversed(self.buckets):
            self._queue_pull(b)
