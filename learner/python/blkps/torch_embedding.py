"""blkps.torch's embedding modules: Embedding and EmbeddingBag whose weights
live on a blkps table LUN (doc/embeddings.md), not on the learner.

    table = blkps.Model("iscsi://host:3260/iqn...:t1/1")   # table=ROWS:WIDTH
    emb = bps.EmbeddingBag(table, rows, width, mode="mean")
    model = torch.nn.Sequential(...)                        # the dense part
    opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters())
    loss_fn(model(emb(ids, offsets)), y).backward()         # pushes the rows' gradients
    opt.step()                                              # the dense part

Forward pulls the batch's distinct rows (libblkps pull_rows: each row once,
sorted, coalesced into few requests, many in flight) and looks the batch up
in them; the result is on the device of `ids`. Backward pushes the gradient
of exactly those rows (push_rows), once per forward, as autograd reaches the
module; the server's rule (sgd, adagrad, adam: per row) updates them. The
modules hold no parameters: the dense optimizer never sees the table.

A module is driven from one thread, like its Model.
"""

import numpy as np
import torch

__all__ = ["Embedding", "EmbeddingBag"]


class _ServerRows(torch.autograd.Function):
    """The rows `unique` of `table` as a (len(unique), width) tensor; its
    gradient is pushed to those rows. `anchor` is a tensor that requires a
    gradient, so that autograd calls backward."""

    @staticmethod
    def forward(ctx, anchor, module, unique):
        ctx.module, ctx.unique, ctx.device = module, unique, anchor.device
        rows = module.table.pull_rows(unique, module.embedding_dim)
        return torch.from_numpy(rows).to(anchor.device)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.detach().to("cpu", torch.float32).contiguous().numpy()
        ctx.module.table.push_rows(ctx.unique, grad)
        ctx.module.rows_pushed += len(ctx.unique)
        return torch.zeros(1, device=ctx.device), None, None


class _ServerTable(torch.nn.Module):
    def __init__(self, table, num_embeddings, embedding_dim):
        super().__init__()
        capacity = table.size_bytes // (4 * embedding_dim)
        if num_embeddings > capacity:
            raise ValueError(f"blkps: the table device holds {capacity} rows of {embedding_dim} values, "
                             f"not {num_embeddings}; start it with table={num_embeddings}:{embedding_dim}")
        self.table, self.num_embeddings, self.embedding_dim = table, num_embeddings, embedding_dim
        self.rows_pulled = self.rows_pushed = 0
        self._anchor = torch.zeros(1, requires_grad=True)  # not a Parameter

    def _rows(self, ids):
        """The distinct rows of `ids` (a tensor of any shape) pulled from the
        server, and each id's index into them."""
        flat = ids.reshape(-1).to("cpu", torch.int64)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError(f"blkps: row ids must be in [0, {self.num_embeddings})")
        unique, inverse = torch.unique(flat, return_inverse=True)
        unique = unique.numpy().astype(np.uint64)
        self.rows_pulled += len(unique)
        anchor = self._anchor.to(ids.device) if ids.device.type != "cpu" else self._anchor
        rows = _ServerRows.apply(anchor, self, unique)
        return rows, inverse.to(ids.device).reshape(ids.shape)


class Embedding(_ServerTable):
    """torch.nn.Embedding's lookup, rows on the server: forward(ids) gives
    a tensor of ids.shape + (embedding_dim,)."""

    def forward(self, ids):
        rows, inverse = self._rows(ids)
        return rows[inverse]


class EmbeddingBag(_ServerTable):
    """torch.nn.EmbeddingBag's reduction (mode "sum" or "mean"), rows on the
    server: forward(ids, offsets) with ids 1-D and offsets the start of each
    bag, or ids 2-D (one bag per row of equal length)."""

    def __init__(self, table, num_embeddings, embedding_dim, mode="mean"):
        if mode not in ("sum", "mean"):
            raise ValueError(f"blkps: EmbeddingBag mode must be 'sum' or 'mean', got {mode!r}")
        super().__init__(table, num_embeddings, embedding_dim)
        self.mode = mode

    def forward(self, ids, offsets=None):
        rows, inverse = self._rows(ids)
        return torch.nn.functional.embedding_bag(inverse, rows, offsets, mode=self.mode)
