#!/usr/bin/python3
"""A hashed table (table=hash:CAPACITY:WIDTH, doc/embeddings.md "Hashed
ids") split over 2 real tgtds (blkps target start --tgtd 2: a `kind =
hashed` layout), reached through libblkps's pull_rows / push_rows, which
send each shard its ids by blkps_feature_id_shard, and through
blkps.torch.Embedding.

Cases:
  reference  rows keyed by random 64-bit ids, on both shards, pushed in
             batches with repeats to an sgd table, equal a dict reference
             of the rule; each shard made exactly the rows of its ids.
  full       a push that one shard cannot hold (its CAPACITY / 2 rows
             full) is refused in one line naming the shards that applied
             their part: they did, whole, and the full shard applied
             nothing.
  torch      blkps.torch.Embedding (pushes overlapped), then EmbeddingBag,
             on the 2-shard table, fed int64 ids (negative ones too: their
             two's-complement pattern), train to the rows of a local
             torch.nn.Embedding over a few steps.
  checkpoint with checkpoint=, the shards' files make one checkpoint set:
             rows pushed on both shards, `target stop` (its final
             generation), a new start from the set: every shard serves
             the same rows and has made the same rows, at one generation.
  mount      blkps-mount of the hashed layout is refused in one line that
             says a hashed table is reached through the row windows.
  plain-io   a plain pull and push of the hashed layout are refused in one
             line naming pull_rows and push_rows, before any shard sees them.

Usage: hashed_table_shards_test.py <repo> <build dir> reference|full|torch|checkpoint|mount|plain-io
"""
import os
import subprocess
import tempfile

import numpy as np

import testbed
from testbed import check, fail

top, build, _ = testbed.setup("hashed_table_shards_test")
import blkps  # noqa: E402
import blkps.feature_ids  # noqa: E402
from blkps.control import open_control  # noqa: E402

WIDTH, LR = 8, 0.1


def shard_tables(server):
    """Each shard's status "table", shard 0 first."""
    with open_control(server.control) as control:
        return [s["table"] for s in control.status()["shards"]]


def ids_by_shard(rng, count, wanted):
    """`wanted[s]` random 64-bit ids of shard s, for each s of `count`."""
    pool = rng.integers(0, 2**64, 64 * sum(wanted), dtype=np.uint64)
    shard = blkps.feature_ids.shards(pool, count)
    return [pool[shard == s][:n] for s, n in enumerate(wanted)]


def rows_match_a_dict_reference():
    rng = np.random.default_rng(5)
    pool = rng.integers(0, 2**64, 600, dtype=np.uint64)
    on = blkps.feature_ids.shards(pool, 2)
    check(0 < np.count_nonzero(on) < pool.size, "the ids do not land on both shards")
    with testbed.Server(f"table=hash:1024:{WIDTH};rule=sgd;lr={LR};init=uniform:0.05;seed=3", tgtds=2) as server:
        with blkps.Model(server.url) as model:
            check(model.table_hashed and model.table_width == WIDTH, "the layout does not open as a hashed table")
            weights = dict(zip(pool.tolist(), model.pull_rows(pool, WIDTH).astype(np.float64)))
            check([t["rows_made"] for t in shard_tables(server)] == [0, 0], "a pull of ids without rows made rows")
            pushed = set()
            for _ in range(12):
                for i, g in testbed.push_zipf_batch(model, pool, rng, 200, WIDTH)[1].items():
                    weights[i] = weights[i] - LR * g
                    pushed.add(i)
            got = model.pull_rows(pool, WIDTH)
            worst = np.max(np.abs(got - np.array([weights[i] for i in pool.tolist()])))
            check(worst < 1e-5, f"rows differ from the dict reference by up to {worst}")
            made = np.bincount(blkps.feature_ids.shards(np.array(sorted(pushed), dtype=np.uint64), 2), minlength=2)
            tables = shard_tables(server)
            check([t["rows_made"] for t in tables] == made.tolist(),
                  f"shards made {[t['rows_made'] for t in tables]} rows, not {made.tolist()} (their pushed ids)")
            check([t["row_limit"] for t in tables] == [512, 512], f"shard row limits {tables}, not 1024 / 2 each")
    print("hashed_table_shards_test reference: ok")


def full_shard_refuses_its_part_and_the_others_apply_theirs():
    rng = np.random.default_rng(7)
    # CAPACITY 8 over 2 shards: 4 rows each; shard 1 is asked for 5.
    ids0, ids1 = ids_by_shard(rng, 2, [3, 5])
    ids = np.concatenate([ids0, ids1])
    with testbed.Server(f"table=hash:8:{WIDTH};rule=sgd;lr={LR};init=uniform:0.05;seed=3", tgtds=2) as server:
        with blkps.Model(server.url) as model:
            before = model.pull_rows(ids, WIDTH)
            grads = np.ones((ids.size, WIDTH), dtype=np.float32)
            try:
                model.push_rows(ids, grads)
                fail("a push that overfills shard 1 was not refused")
            except OSError as e:
                check("\n" not in e.strerror and "full" in e.strerror and "shard(s) 0 applied" in e.strerror,
                      f"unclear error: {e.strerror}")
            after = model.pull_rows(ids, WIDTH)
            check(np.allclose(after[:3], before[:3] - LR), "shard 0 did not apply its part of the push whole")
            check(np.array_equal(after[3:], before[3:]), "the full shard applied part of its rows")
            made = [t["rows_made"] for t in shard_tables(server)]
            check(made == [3, 0], f"rows made per shard {made}, not [3, 0]")
    print("hashed_table_shards_test full: ok")


def torch_embedding_trains_as_a_local_table():
    import torch
    import blkps.torch as bps
    rng = np.random.default_rng(9)
    pool = rng.integers(-2**63, 2**63, 40, dtype=np.int64)  # feature ids as int64, half of them negative
    check(np.any(pool < 0) and 0 < np.count_nonzero(blkps.feature_ids.shards(pool.view(np.uint64), 2)) < pool.size,
          "the ids are not negative in part, or do not land on both shards")
    with testbed.Server(f"table=hash:256:{WIDTH};rule=sgd;lr={LR};init=uniform:0.05;seed=3", tgtds=2) as server:
        with blkps.Model(server.url) as table:
            initial = table.pull_rows(pool.view(np.uint64), WIDTH)
            emb = bps.Embedding(table, 0, WIDTH, overlap=2)  # pushes queued, read-your-writes
            local = torch.nn.Embedding(pool.size, WIDTH)
            with torch.no_grad():
                local.weight.copy_(torch.from_numpy(initial))
            opt = torch.optim.SGD(local.parameters(), lr=LR)
            target = torch.from_numpy(rng.standard_normal((16, WIDTH)).astype(np.float32))
            for _ in range(4):
                at = rng.integers(0, pool.size, 16)
                loss = ((emb(torch.from_numpy(pool[at])) - target) ** 2).sum()
                loss.backward()
                opt.zero_grad()
                ((local(torch.from_numpy(at)) - target) ** 2).sum().backward()
                opt.step()
            emb.flush()
            bag = bps.EmbeddingBag(table, 0, WIDTH, mode="sum")
            for _ in range(2):
                at = rng.integers(0, pool.size, (4, 4))  # 4 bags of 4 ids
                ((bag(torch.from_numpy(pool[at])) - target[:4]) ** 2).sum().backward()
                opt.zero_grad()
                bags = torch.nn.functional.embedding_bag(torch.from_numpy(at), local.weight, mode="sum")
                ((bags - target[:4]) ** 2).sum().backward()
                opt.step()
            got = table.pull_rows(pool.view(np.uint64), WIDTH)
            worst = np.max(np.abs(got - local.weight.detach().numpy()))
            check(worst < 1e-5, f"the server's rows differ from the local table's by up to {worst}")
            check(not np.allclose(got, initial), "training changed no row")
    print("hashed_table_shards_test torch: ok")


def a_checkpoint_set_restores_every_shards_rows():
    rng = np.random.default_rng(11)
    pool = rng.integers(0, 2**64, 300, dtype=np.uint64)
    with tempfile.TemporaryDirectory() as folder:
        bsopts = (f"table=hash:1024:{WIDTH};rule=adagrad;lr={LR};init=uniform:0.05;seed=3;"
                  f"checkpoint={folder}/table.ckpt")
        with testbed.Server(bsopts, tgtds=2) as server:
            with blkps.Model(server.url) as model:
                for _ in range(6):
                    testbed.push_zipf_batch(model, pool, rng, 100, WIDTH)
                before = model.pull_rows(pool, WIDTH)
            made = [t["rows_made"] for t in shard_tables(server)]
            check(all(made), f"the pushes did not make rows on both shards: {made}")
        # Leaving the block stopped the server: `target stop` wrote a final
        # generation on both shards.
        with testbed.Server(bsopts, tgtds=2) as server:
            with open_control(server.control) as control:
                shards = control.status()["shards"]
            generations = {s["checkpoint"]["generation"] for s in shards}
            check(len(generations) == 1 and 0 not in generations,
                  f"the shards did not start from one generation: {generations}")
            again = [s["table"]["rows_made"] for s in shards]
            check(again == made, f"the shards made {again} rows after the restart, not {made}")
            with blkps.Model(server.url) as model:
                check(np.array_equal(model.pull_rows(pool, WIDTH), before), "the restarted shards serve other rows")
    print("hashed_table_shards_test checkpoint: ok")


def mount_is_refused_in_one_line():
    with testbed.Server(f"table=hash:64:{WIDTH}", tgtds=2) as server, tempfile.TemporaryDirectory() as mountpoint:
        try:
            out = subprocess.run([os.path.join(build, "learner", "mount", "blkps-mount"), "-f", mountpoint,
                                  f"slot1={server.url}"], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            subprocess.run(["fusermount3", "-u", mountpoint])
            fail("blkps-mount mounted a hashed table")
        lines = out.stderr.strip().splitlines()
        check(out.returncode != 0 and len(lines) == 1 and "reached through the row windows only" in lines[0],
              f"not refused in one line (exit {out.returncode}): {out.stderr.strip()}")
    print("hashed_table_shards_test mount: ok")


def plain_io_is_refused_in_one_line():
    with testbed.Server(f"table=hash:64:{WIDTH}", tgtds=2) as server:
        with blkps.Model(server.url) as model:
            for what, call in (("pull", lambda: model.pull(0, WIDTH)),
                               ("push", lambda: model.push(0, np.ones(WIDTH, np.float32)))):
                try:
                    call()
                    fail(f"a plain {what} of the hashed layout was not refused")
                except OSError as e:
                    check("\n" not in e.strerror and "(kind = hashed)" in e.strerror
                          and "pull_rows and push_rows" in e.strerror, f"unclear error: {e.strerror}")
        made = [t["rows_made"] for t in shard_tables(server)]
        check(made == [0, 0], f"a refused push made rows: {made}")
    print("hashed_table_shards_test plain-io: ok")


testbed.run({"reference": rows_match_a_dict_reference, "full": full_shard_refuses_its_part_and_the_others_apply_theirs,
             "torch": torch_embedding_trains_as_a_local_table, "checkpoint": a_checkpoint_set_restores_every_shards_rows,
             "mount": mount_is_refused_in_one_line,
             "plain-io": plain_io_is_refused_in_one_line}, None)
