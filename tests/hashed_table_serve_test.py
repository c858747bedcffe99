#!/usr/bin/python3
"""A hashed table (--bsopts table=hash:CAPACITY:WIDTH, doc/embeddings.md
"Hashed ids") served by a real tgtd, through libblkps's pull_rows /
push_rows (Python binding), which send batches through the row windows.

Cases:
  reference  rows keyed by random 64-bit ids, in Zipf batches with repeats,
             pushed to an adagrad table, equal a dict reference of the rule
             kept here; a pull of ids without rows makes none.
  full       a push that needs more rows than a full table has is refused
             whole, in one line that names evict=, without evict=; with
             evict=lru-push it is served and the least recently pushed rows
             are evicted (status counts them).
  plain-io   plain READ and WRITE of a hashed table's learner LUN are
             refused in one line that says to use pull_rows / push_rows.
  memory     issue 38's bar at a tenth of its size: 10^5 rows made of ids
             drawn from 10^8 (adagrad, 64 values) hold at most 1.5 times
             their weights and rule state (status table.memory_bytes), and
             tgtd's resident size grows by that, not more. An optional ROWS
             argument changes the rows made (bench/hashed-table-memory.sh
             passes 10^6, issue 38's figure).

Usage: hashed_table_serve_test.py <repo> <build dir> reference|full|plain-io|memory [ROWS]
"""
import numpy as np

import testbed
from testbed import check, fail

top, build, _ = testbed.setup("hashed_table_serve_test")
import blkps  # noqa: E402
from blkps.control import Control  # noqa: E402

WIDTH, LR, EPS = 16, 0.1, 1e-10


def table_status(server):
    table = server.status()["table"]
    check(table is not None and table["hashed"] is True, f"status table is not hashed: {table}")
    return table


def refused(call, *phrases):
    """Runs call, which must raise OSError with one line holding every phrase."""
    try:
        call()
    except OSError as e:
        check("\n" not in e.strerror and all(p in e.strerror for p in phrases), f"unclear error: {e.strerror}")
        return
    fail(f"not refused (expected an error saying {phrases})")


def rows_match_a_dict_reference():
    rng = np.random.default_rng(11)
    pool = rng.integers(0, 2**64, 1500, dtype=np.uint64)  # ids anywhere in 64 bits
    with testbed.Server(f"table=hash:4096:{WIDTH};rule=adagrad;lr={LR};init=uniform:0.05;seed=3") as server:
        with blkps.Model(server.url) as model:
            with Control(server.control) as control:
                check(control.counters()["table_hashed"] == 1, "the counters do not say the table is hashed")
            initial = model.pull_rows(pool, WIDTH).astype(np.float64)
            check(np.all(np.abs(initial) <= 0.05) and np.std(initial) > 0.01, "initial rows are not uniform:0.05")
            check(table_status(server)["rows_made"] == 0, "a pull of ids without rows made rows")
            weights = {int(i): initial[k].copy() for k, i in enumerate(pool)}
            state_sum = {}
            for _ in range(20):
                ids, summed = testbed.push_zipf_batch(model, pool, rng, 256, WIDTH)
                check(len(np.unique(ids)) < ids.size, "the batch has no repeated id")
                for i, g in summed.items():
                    state_sum[i] = state_sum.get(i, 0) + g * g
                    weights[i] -= LR * g / (np.sqrt(state_sum[i]) + EPS)
            got = model.pull_rows(pool, WIDTH)
            want = np.array([weights[int(i)] for i in pool])
            worst = np.max(np.abs(got - want))
            check(worst < 1e-5, f"rows differ from the dict reference by up to {worst}")
            table = table_status(server)
            check(table["rows_made"] == len(state_sum), f"rows_made {table['rows_made']}, not {len(state_sum)}")
            check(table["evictions"] == 0, f"evictions {table['evictions']} in a table not full")
    print("hashed_table_serve_test reference: ok")


def a_full_table_refuses_whole_or_evicts():
    ones = np.ones((1, 4), np.float32)
    with testbed.Server("table=hash:8:4;rule=sgd;lr=1") as server:
        with blkps.Model(server.url) as model:
            model.push_rows(np.arange(8) << 40, np.ones((8, 4), np.float32))
            batch = np.array([0, 99 << 40, 98 << 40], np.uint64)  # one row made, two that need rows
            refused(lambda: model.push_rows(batch, np.ones((3, 4), np.float32)), "hashed table is full", "evict=")
            check(np.array_equal(model.pull_rows([0], 4), -ones), "the refused push changed a row")
            check(table_status(server)["rows_made"] == 8, "the refused push made rows")
    with testbed.Server("table=hash:8:4;rule=sgd;lr=1;evict=lru-push") as server:
        with blkps.Model(server.url) as model:
            for k in range(8):
                model.push_rows([k << 40], ones)
            model.push_rows([99 << 40, 98 << 40], np.ones((2, 4), np.float32))
            check(np.array_equal(model.pull_rows([0, 1 << 40, 2 << 40, 99 << 40], 4),
                                 np.array([[0] * 4, [0] * 4, [-1] * 4, [-1] * 4], np.float32)),
                  "the two least recently pushed rows were not the ones evicted")
            table = table_status(server)
            check(table["evictions"] == 2 and table["rows_made"] == 8 and table["evict"] == "lru-push",
                  f"status after two evictions: {table}")
    print("hashed_table_serve_test full: ok")


def plain_io_is_refused():
    with testbed.Server(f"table=hash:64:{WIDTH}") as server:
        with blkps.Model(server.url) as model:
            refused(lambda: model.pull(0, WIDTH), "INVALID COMMAND OPERATION CODE", "pull_rows")
            refused(lambda: model.push(0, np.ones(WIDTH, np.float32)), "INVALID COMMAND OPERATION CODE", "push_rows")
            check(table_status(server)["rows_made"] == 0, "a refused write made rows")
    print("hashed_table_serve_test plain-io: ok")


def resident_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    fail(f"no VmRSS for tgtd pid {pid}")


def rows_made_cost_at_most_one_and_a_half_their_payload():
    rows = int(testbed.ARGS[1]) if len(testbed.ARGS) > 1 else 100000
    width, batch = 64, 1024
    capacity = 1 << (rows - 1).bit_length()  # room for the rows, a power of two
    rng = np.random.default_rng(5)
    ids = np.unique(rng.integers(0, 10**8, rows + rows // 8, dtype=np.uint64))
    check(ids.size >= rows, "too few distinct ids drawn")
    ids = rng.permutation(ids)[:rows]
    payload = rows * width * (4 + 4)  # float32 weights and adagrad's sum of squares
    # Command buffers that malloc keeps (a few batches' worth), tgtd's own growth.
    slack = 16 << 20
    with testbed.Server(f"table=hash:{capacity}:{width};rule=adagrad;lr=0.05;init=normal:0.01") as server:
        pid = int(server.env["PID"])
        with blkps.Model(server.url) as model:
            before = resident_bytes(pid)
            grads = np.full((batch, width), 0.5, np.float32)
            for at in range(0, rows, batch):
                chunk = ids[at:at + batch]
                model.push_rows(chunk, grads[:chunk.size])
            grew = resident_bytes(pid) - before
        table = table_status(server)
    check(table["rows_made"] == rows, f"rows_made {table['rows_made']}, not {rows}")
    held = table["memory_bytes"]
    check(held <= payload * 3 // 2, f"memory_bytes {held} is over 1.5 x the rows' {payload} bytes")
    check(grew >= payload * 9 // 10, f"tgtd grew by {grew} bytes, less than the rows' {payload}: "
          "the test does not measure the table")
    check(grew <= held + slack, f"tgtd grew by {grew} bytes, more than memory_bytes {held} + {slack}")
    print(f"hashed_table_serve_test memory: ok ({rows} rows of {width} values, ids from 10^8, capacity "
          f"{capacity}: memory_bytes {held} = {held / payload:.3f} x the rows' weights and state; "
          f"tgtd resident grew {grew} = {grew / payload:.3f} x)")


testbed.run({"reference": rows_match_a_dict_reference,
             "full": a_full_table_refuses_whole_or_evicts,
             "plain-io": plain_io_is_refused,
             "memory": rows_made_cost_at_most_one_and_a_half_their_payload}, None)
