#!/usr/bin/python3
"""blkps.torch's EmbeddingBag and Embedding (rows on a table LUN) in one model
with the dense DistributedOptimizer (gradient mode), against real tgtds, on
CPU: after a few steps the server's table rows and dense weights equal a
single-process PyTorch run of torch.nn.EmbeddingBag / Embedding + Linear with
SGD. Rows the batches never used keep their initial values.

Usage: torch_embedding_test.py <repo> <build dir>
"""
import numpy as np

import testbed
from testbed import check

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
            model = Click(bps.EmbeddingBag(bag_table, ROWS, WIDTH, mode="mean"), bps.Embedding(item_table, ROWS, WIDTH))
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
    print("torch_embedding_test: ok")


main()
