#!/usr/bin/python3
"""blkps.torch's EmbeddingBag and Embedding (rows on a table LUN) in one model
with the dense DistributedOptimizer (gradient mode), against real tgtds, on
CPU: after a few steps the server's table rows and dense weights equal a
single-process PyTorch run of torch.nn.EmbeddingBag / Embedding + Linear with
SGD. Rows the batches never used keep their initial values. Then the
module's options (doc/embeddings.md "PyTorch"): pushes overlapped (queued
to a thread) give exactly the synchronous path's table; a failing queued
push is raised by the next call; a deleted module's queued push is made and
its pusher thread ends; a row cache with max_staleness=0 equals no
cache exactly, and with max_staleness=2 serves rows without pulling them.

Usage: torch_embedding_test.py <repo> <build dir>
"""
import gc
import threading

import numpy as np

import testbed
from testbed import check, fail

top, build, _ = testbed.setup("torch_embedding_test")
import torch  # noqa: E402

import blkps  # noqa: E402
import blkps.torch as bps  # noqa: E402

torch.set_num_threads(1)
ROWS, WIDTH, LR, STEPS, BAGS, BAG = 1000, 16, 0.5, 6, 8, 5


class Click(torch.nn.Module):
    """A bag of ids and one id per example, each looked up in its own table,
    then a linear layer: the shape of a recommendation model in small."""

    def __init__(self, bag, single):
        super().__init__()
        self.bag, self.single = bag, single
        torch.manual_seed(0)
        self.dense = torch.nn.Linear(2 * WIDTH, 1)

    def forward(self, ids, offsets, item):
        return self.dense(torch.cat([self.bag(ids, offsets), self.single(item)], dim=1)).squeeze(1)


def batch(step):
    rng = np.random.default_rng(step)
    ids = torch.from_numpy((rng.zipf(1.3, BAGS * BAG) - 1) % ROWS)
    offsets = torch.arange(0, BAGS * BAG, BAG)
    item = torch.from_numpy(rng.integers(0, ROWS, BAGS))
    y = torch.from_numpy(rng.integers(0, 2, BAGS).astype(np.float32))
    return ids, offsets, item, y


def main():
    loss_fn = torch.nn.BCEWithLogitsLoss()
    table_bsopts = f"table={ROWS}:{WIDTH};rule=sgd;lr={LR};init=normal:0.1;seed="
    with testbed.Server(table_bsopts + "1") as bag_server, testbed.Server(table_bsopts + "2") as item_server, \
            testbed.Server(f"params={2 * WIDTH + 1};rule=sgd;lr={LR}") as dense_server:
        bps.init(target=dense_server.url, control=dense_server.control, env={"RANK": "0", "WORLD_SIZE": "1"})
        with blkps.Model(bag_server.url) as bag_table, blkps.Model(item_server.url) as item_table:
            model = Click(bps.EmbeddingBag(bag_table, ROWS, WIDTH, mode="mean", overlap=2), bps.Embedding(item_table, ROWS, WIDTH))
            check(len(list(model.parameters())) == 2, "the embedding modules hold parameters")
            # The reference: local tables with the server's initial rows.
            local = Click(torch.nn.EmbeddingBag(ROWS, WIDTH, mode="mean"), torch.nn.Embedding(ROWS, WIDTH))
            with torch.no_grad():
                local.bag.weight.copy_(torch.from_numpy(bag_table.pull_rows(np.arange(ROWS), WIDTH)))
                local.single.weight.copy_(torch.from_numpy(item_table.pull_rows(np.arange(ROWS), WIDTH)))
            initial_bag = local.bag.weight.detach().clone()
            local_opt = torch.optim.SGD(local.parameters(), lr=LR)
            opt = bps.DistributedOptimizer(None, named_parameters=model.named_parameters())
            bps.broadcast_parameters(model.state_dict(), root_rank=0)
            used = set()
            for t in range(STEPS):
                ids, offsets, item, y = batch(t)
                used.update(ids.tolist())
                opt.zero_grad()
                loss_fn(model(ids, offsets, item), y).backward()
                opt.step()
                local_opt.zero_grad()
                loss_fn(local(ids, offsets, item), y).backward()
                local_opt.step()
            model.bag.flush()
            model.single.flush()
            check(model.bag.rows_pushed == model.bag.rows_pulled > 0, "bag rows pulled and pushed differ")
            for name, table, weight in (("bag", bag_table, local.bag.weight),
                                        ("item", item_table, local.single.weight)):
                got = table.pull_rows(np.arange(ROWS), WIDTH)
                worst = float(np.max(np.abs(got - weight.detach().numpy())))
                check(worst < 1e-5, f"{name} table differs from the local run by {worst}")
            unused = [r for r in range(ROWS) if r not in used]
            check(torch.equal(local.bag.weight[unused], initial_bag[unused]), "reference moved unused rows")
            dense = torch.cat([p.detach().reshape(-1) for p in model.dense.parameters()])
            want = torch.cat([p.detach().reshape(-1) for p in local.dense.parameters()])
            check(torch.allclose(dense, want, atol=1e-5), f"dense part differs: {dense - want}")
            opt.close()


def table_run(steps, **options):
    """`steps` batches through an EmbeddingBag(**options) alone on a fresh
    sgd table (seed 1) and a fixed linear head; returns (the table's rows,
    the module)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(WIDTH, 1)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    with testbed.Server(f"table={ROWS}:{WIDTH};rule=sgd;lr={LR};init=normal:0.1;seed=1") as server, \
            blkps.Model(server.url) as table:
        emb = bps.EmbeddingBag(table, ROWS, WIDTH, mode="sum", **options)
        for t in range(steps):
            ids, offsets, _, y = batch(t)
            loss_fn(head(emb(ids, offsets)).squeeze(1), y).backward()
        emb.flush()
        return table.pull_rows(np.arange(ROWS), WIDTH), emb


def options():
    steps = 8
    sync, sync_emb = table_run(steps, overlap=0)
    overlapped, emb = table_run(steps, overlap=2)
    check(np.array_equal(sync, overlapped), "overlapped pushes give another table than synchronous ones "
          f"(worst {np.max(np.abs(sync - overlapped))})")
    check(emb.rows_pushed == sync_emb.rows_pushed == sync_emb.rows_pulled, "rows pushed differ")
    uncached, emb = table_run(steps, cache_rows=ROWS, max_staleness=0)
    check(np.array_equal(sync, uncached), "a cache with max_staleness=0 changes the table")
    check(emb.rows_cached == 0 and emb.rows_pulled == sync_emb.rows_pulled,
          f"max_staleness=0 served {emb.rows_cached} rows from the cache")
    cached, emb = table_run(steps, cache_rows=64, max_staleness=2)
    check(emb.rows_cached > 0, "max_staleness=2 served no row from the cache")
    check(emb.rows_pulled + emb.rows_cached == sync_emb.rows_pulled and emb.pulls <= steps,
          f"cache: {emb.rows_pulled} pulled + {emb.rows_cached} cached, not {sync_emb.rows_pulled}")
    check(len(emb._cache) <= 64, f"the cache holds {len(emb._cache)} rows, more than 64")
    check(not np.array_equal(sync, cached), "stale rows gave the same table (the cache served nothing?)")


def queued_push_error():
    """A NaN gradient, refused by push_rows in the pusher thread, is raised
    by the next forward, in one line; the flush after it is clean."""
    with testbed.Server(f"table={ROWS}:{WIDTH};rule=sgd;lr={LR}") as server, blkps.Model(server.url) as table:
        emb = bps.Embedding(table, ROWS, WIDTH, overlap=2)
        ids = torch.tensor([3, 5])
        (emb(ids) * float("nan")).sum().backward()  # returns before the push
        try:
            emb(ids)
        except RuntimeError as e:
            message = str(e)
        else:
            fail("a failing queued push was not reported by the next forward")
        check("NaN" in message and "\n" not in message and message.startswith("blkps: "),
              f"the queued push's error is not one blkps line: {message!r}")
        emb.flush()
        check(np.array_equal(table.pull_rows(ids.numpy(), WIDTH), np.zeros((2, WIDTH), np.float32)),
              "the refused NaN push changed rows")


def pusher_ends_with_its_module():
    """A module with overlap=N deleted with a push still queued: the push
    reaches the table and the module's pusher thread ends."""
    def pushers():
        return [t for t in threading.enumerate() if t.name == "blkps-push-rows"]
    before = len(pushers())
    with testbed.Server(f"table={ROWS}:{WIDTH};rule=sgd;lr=1") as server, blkps.Model(server.url) as table:
        emb = bps.Embedding(table, ROWS, WIDTH, overlap=2)
        emb(torch.tensor([7])).sum().backward()  # queues a gradient of ones for row 7
        check(len(pushers()) == before + 1, "no pusher thread for overlap=2")
        del emb
        gc.collect()
        check(len(pushers()) == before, "the pusher thread outlives its module")
        check(np.array_equal(table.pull_rows(np.array([7]), WIDTH), -np.ones((1, WIDTH), np.float32)),
              "the push queued when the module was deleted did not reach the table")


main()
options()
queued_push_error()
pusher_ends_with_its_module()
print("torch_embedding_test: ok")
