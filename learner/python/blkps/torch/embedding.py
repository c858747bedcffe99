"""blkps.torch's embedding modules: Embedding and EmbeddingBag whose weights
live on a blkps table LUN (doc/embeddings.md), not on the learner.

    table = blkps.Model("iscsi://host:3260/iqn...:t1/1")   # table=ROWS:WIDTH
    emb = bps.EmbeddingBag(table, rows, width, mode="mean")
    model = torch.nn.Sequential(...)                        # the dense part
    opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters())
    loss_fn(model(emb(ids, offsets)), y).backward()         # pushes (or, overlap=N, queues) the rows' gradients
    opt.step()                                              # the dense part
    emb.flush()                                             # before the table is read or closed

Forward pulls the batch's distinct rows (libblkps pull_rows: each row once,
sorted, coalesced into few requests, many in flight) and looks the batch up
in them; the result is on the device of `ids`. Backward pushes the gradient
of exactly those rows (push_rows): in backward itself by default, or, with
overlap=N, through the module's pusher thread (in order, at most N queued;
the table's Model then serves this module only), so that the push overlaps
the dense part's backward and step; the server's rule
(sgd, adagrad, adam: per row) updates them. Read-your-writes: a forward
that pulls waits for the module's queued pushes first, so it sees every
earlier push of this module. An error of a queued push is raised, in one
line, by the next forward, backward or flush(); flush() waits for the
queue. When the module is collected, or at exit, its queue is pushed and
its pusher thread ends (an error then goes to stderr).

cache_rows=K, max_staleness=S (S > 0): rows pulled at most S forwards ago
are served from a learner-side cache of at most K rows (least recently
used out) instead of the server; such a row misses the updates of the last
S steps at most (this learner's own too: the server's rule is not applied
locally). Off by default; S = 0 is no cache.

On a hashed table (table=hash:CAPACITY:WIDTH, one server or a `kind =
hashed` layout; doc/embeddings.md "Hashed ids") the ids are feature ids:
any int64, a negative one standing for its two's-complement 64-bit pattern
(-1 is id 2**64 - 1), and num_embeddings bounds nothing (the table's
CAPACITY does, on the server); the cache and overlapped pushes work as
above, keyed by the id.

A module is driven from one thread, like its Model; while pushes are
queued the pusher uses the Model, so other uses of it wait for flush().
"""

import collections
import queue
import sys
import threading
import weakref

import numpy as np
import torch

__all__ = ["Embedding", "EmbeddingBag"]


class _Pusher:
    """A thread that pushes (ids, grads) to `table` in the order queued, at
    most `depth` queued; keeps the first error for raise_error(). close()
    pushes what is queued and ends the thread."""

    def __init__(self, table, depth):
        self._table, self._queue = table, queue.Queue(maxsize=depth)
        self._error, self._failed = None, 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="blkps-push-rows", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:  # close()
                self._queue.task_done()
                return
            ids, grads = item
            try:
                self._table.push_rows(ids, grads)
            except Exception as e:  # kept for the caller, never dropped
                if self._error is None:
                    self._error = f"a queued push_rows of {len(ids)} rows failed: {str(e).removeprefix('blkps: ')}"
                self._failed += 1
            finally:
                self._queue.task_done()
            if self._stopping and self._queue.empty():
                return

    def put(self, ids, grads):
        self.raise_error()
        self._queue.put((ids, grads))

    def drain(self):
        """Waits for every queued push; raises the first error, once."""
        self._queue.join()
        self.raise_error()

    def raise_error(self):
        if self._error is not None:
            error, failed = self._error, self._failed
            self._error, self._failed = None, 0
            more = f" ({failed - 1} later push(es) failed too)" if failed > 1 else ""
            raise RuntimeError(f"blkps: {error}{more}")

    def close(self):
        """The module is gone (or the interpreter exits): pushes what is
        queued, ends the thread, and writes an error of a push to stderr,
        there being no caller left to raise it to."""
        if threading.current_thread() is self._thread:  # collected by the pusher thread itself
            self._stopping = True  # it ends once the queue is empty
            return
        self._queue.put(None)
        self._thread.join()
        try:
            self.raise_error()
        except RuntimeError as e:
            print(e, file=sys.stderr)


class _ServerRows(torch.autograd.Function):
    """The rows `unique` of the module's table as a (len(unique), width)
    tensor `rows` (numpy, already fetched); its gradient is pushed to those
    rows. `anchor` is a tensor that requires a gradient, so that autograd
    calls backward."""

    @staticmethod
    def forward(ctx, anchor, module, unique, rows):
        ctx.module, ctx.unique, ctx.device = module, unique, anchor.device
        return torch.from_numpy(rows).to(anchor.device)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.detach().to("cpu", torch.float32).contiguous().numpy()
        ctx.module._push(ctx.unique, grad)
        return torch.zeros(1, device=ctx.device), None, None, None


class _ServerTable(torch.nn.Module):
    def __init__(self, table, num_embeddings, embedding_dim, overlap=0, cache_rows=0, max_staleness=0):
        super().__init__()
        width = table.table_width  # 0: a device that does not say
        if width and embedding_dim != width:
            raise ValueError(f"blkps: the table's rows are {width} values wide (its server's table=ROWS:{width}), "
                             f"not embedding_dim={embedding_dim}: pass embedding_dim={width}")
        self.hashed = table.table_hashed  # any 64-bit id; num_embeddings bounds nothing
        capacity = table.size_bytes // (4 * embedding_dim)
        if not self.hashed and num_embeddings > capacity:
            raise ValueError(f"blkps: the table device holds {capacity} rows of {embedding_dim} values, "
                             f"not {num_embeddings}; start it with table={num_embeddings}:{embedding_dim}")
        if overlap < 0 or cache_rows < 0 or max_staleness < 0:
            raise ValueError("blkps: overlap, cache_rows and max_staleness must be >= 0")
        self.table, self.num_embeddings, self.embedding_dim = table, num_embeddings, embedding_dim
        self.rows_pulled = self.rows_pushed = self.rows_cached = 0  # rows_cached: served by the cache
        self.pulls = 0  # pull_rows calls (forwards that needed the server)
        self._anchor = torch.zeros(1, requires_grad=True)  # not a Parameter
        self._pusher = _Pusher(table, overlap) if overlap else None
        if self._pusher:  # when the module is collected, or at exit
            weakref.finalize(self, self._pusher.close)
        self._staleness = max_staleness if cache_rows else 0
        self._step = 0  # forwards so far
        self._cache = collections.OrderedDict()  # row id -> (step pulled, slot); least recent first
        self._slab = np.empty((cache_rows if self._staleness else 0, embedding_dim), dtype=np.float32)
        self._free = list(range(len(self._slab)))

    def flush(self):
        """Waits for the queued row pushes; raises the first error of one."""
        if self._pusher:
            self._pusher.drain()

    synchronize = flush

    def _push(self, unique, grad):
        if self._pusher:
            self._pusher.put(unique, grad)
        else:
            self.table.push_rows(unique, grad)
        self.rows_pushed += len(unique)

    def _fetch(self, unique):
        """Rows `unique` (sorted distinct ids): from the cache where pulled
        at most max_staleness forwards ago, the rest from the server."""
        step, self._step = self._step, self._step + 1
        if self._pusher:
            self._pusher.raise_error()
        rows = np.empty((len(unique), self.embedding_dim), dtype=np.float32)
        hit, slots = [], []
        for k, r in enumerate(unique.tolist()):
            entry = self._cache.get(r)
            if entry is not None and step - entry[0] <= self._staleness:
                hit.append(k)
                slots.append(entry[1])
                self._cache.move_to_end(r)
        if hit:
            rows[hit] = self._slab[slots]
            self.rows_cached += len(hit)
        miss = np.ones(len(unique), dtype=bool)
        miss[hit] = False
        missing = unique[miss]
        if len(missing):
            self.flush()  # read-your-writes
            pulled = self.table.pull_rows(missing, self.embedding_dim)
            rows[miss] = pulled
            self.rows_pulled += len(missing)
            self.pulls += 1
            if len(self._slab):
                self._keep(missing, pulled, step)
        return rows

    def _keep(self, ids, pulled, step):
        for r, row in zip(ids.tolist(), pulled):
            entry = self._cache.pop(r, None)
            if entry is not None:
                slot = entry[1]
            elif self._free:
                slot = self._free.pop()
            else:
                slot = self._cache.popitem(last=False)[1][1]  # the least recently used
            self._slab[slot] = row
            self._cache[r] = (step, slot)

    def _rows(self, ids):
        """The distinct rows of `ids` (a tensor of any shape), and each id's
        index into them."""
        flat = ids.reshape(-1).to("cpu", torch.int64)
        if flat.numel() and not self.hashed and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError(f"blkps: row ids must be in [0, {self.num_embeddings})")
        unique, inverse = torch.unique(flat, return_inverse=True)
        unique = unique.numpy().astype(np.uint64)  # a negative id: its two's-complement pattern
        anchor = self._anchor.to(ids.device) if ids.device.type != "cpu" else self._anchor
        rows = _ServerRows.apply(anchor, self, unique, self._fetch(unique))
        return rows, inverse.to(ids.device).reshape(ids.shape)


class Embedding(_ServerTable):
    """torch.nn.Embedding's lookup, rows on the server: forward(ids) gives
    a tensor of ids.shape + (embedding_dim,). Options: see the module."""

    def forward(self, ids):
        rows, inverse = self._rows(ids)
        return rows[inverse]


class EmbeddingBag(_ServerTable):
    """torch.nn.EmbeddingBag's reduction (mode "sum" or "mean"), rows on the
    server: forward(ids, offsets) with ids 1-D and offsets the start of each
    bag, or ids 2-D (one bag per row of equal length)."""

    def __init__(self, table, num_embeddings, embedding_dim, mode="mean", **options):
        if mode not in ("sum", "mean"):
            raise ValueError(f"blkps: EmbeddingBag mode must be 'sum' or 'mean', got {mode!r}")
        super().__init__(table, num_embeddings, embedding_dim, **options)
        self.mode = mode

    def forward(self, ids, offsets=None):
        rows, inverse = self._rows(ids)
        return torch.nn.functional.embedding_bag(inverse, rows, offsets, mode=self.mode)
