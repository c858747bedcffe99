#!/usr/bin/python3
"""libblkps's pull_rows / push_rows (Python binding) against a real tgtd
serving a table LUN (doc/embeddings.md): batches of Zipf-distributed row ids,
repeats included, pushed to an adagrad table; every row of the table then
matches a reference computed here from the rows' initial values, with each
batch's repeated ids summed into one gradient. Rows that share a 512-byte
sector with pushed rows but are not in the batch stay as they were
(case `reference`). Rows of another width than the table's are refused in
one line before anything is sent, by pull_rows, push_rows and
blkps.torch's Embedding (case `other-width`).

Usage: table_rows_test.py <repo> <build dir> reference|other-width
"""
import numpy as np

import testbed
from testbed import check, fail

top, build, _ = testbed.setup("table_rows_test")
import blkps  # noqa: E402

ROWS, WIDTH, LR, EPS = 4096, 32, 0.1, 1e-10
BATCHES, BATCH = 20, 256


def rows_match_a_numpy_reference():
    rng = np.random.default_rng(7)
    with testbed.Server(f"table={ROWS}:{WIDTH};rule=adagrad;lr={LR};init=uniform:0.05;seed=3") as server:
        with blkps.Model(server.url) as model:
            weights = model.pull_rows(np.arange(ROWS), WIDTH).astype(np.float64)
            check(np.all(np.abs(weights) <= 0.05) and np.std(weights) > 0.01, "initial rows are not uniform:0.05")
            check(np.array_equal(model.pull(0, ROWS * WIDTH).reshape(ROWS, WIDTH), weights),
                  "pull_rows and pull disagree")
            state_sum = np.zeros_like(weights)
            for _ in range(BATCHES):
                ids = (rng.zipf(1.05, BATCH) - 1) % ROWS
                check(len(np.unique(ids)) < BATCH, "the batch has no repeated id")
                grads = rng.integers(-3, 4, (BATCH, WIDTH)).astype(np.float32)
                model.push_rows(ids, grads)
                merged = np.zeros_like(weights)
                np.add.at(merged, ids, grads)
                for r in np.unique(ids):
                    g = merged[r]
                    if not np.any(g):
                        continue  # a zero row gradient is none
                    state_sum[r] += g * g
                    weights[r] -= LR * g / (np.sqrt(state_sum[r]) + EPS)
            got = model.pull_rows(np.arange(ROWS), WIDTH)
            worst = np.max(np.abs(got - weights))
            check(worst < 1e-5, f"rows differ from the reference by up to {worst}")
            again = model.pull_rows([5, 5, 0, ROWS - 1], WIDTH)
            check(np.array_equal(again, got[[5, 5, 0, ROWS - 1]]), "pull_rows of repeated ids")
            try:
                model.push_rows([ROWS], np.ones((1, WIDTH), np.float32))
                check(False, "a row past the end did not raise")
            except OSError as e:
                check("past the table's end" in e.strerror, f"unclear error: {e}")
    print("table_rows_test: ok")


def rows_of_another_width_are_refused_before_sending():
    # 128-wide rows are one 512-byte sector each: a 64-wide push would land
    # as the first half of row 0 (libblkps cut rows by the device's size).
    with testbed.Server("table=1000:128;rule=sgd;lr=1;init=normal:0.1;seed=3") as server:
        with blkps.Model(server.url) as model:
            check(model.table_width == 128, f"table_width is {model.table_width}, not the server's 128")
            before = model.pull(0, 2 * 128)
            for call in (lambda: model.push_rows([1], np.ones((1, 64), np.float32)),
                         lambda: model.pull_rows([1], 64)):
                try:
                    call()
                    fail("rows of 64 values on a table of 128 were taken")
                except OSError as e:
                    check("rows are 128 values wide" in e.strerror and "nothing was sent" in e.strerror,
                          f"unclear error: {e.strerror}")
            check(np.array_equal(model.pull(0, 2 * 128), before), "a refused push changed rows 0 and 1")
            import blkps.torch as bps
            try:
                bps.Embedding(model, 1000, 64)
                fail("an Embedding of 64 values on a table of 128 was made")
            except ValueError as e:
                check("pass embedding_dim=128" in str(e), f"unclear error: {e}")
    print("table_rows_test other-width: ok")


testbed.run({"reference": rows_match_a_numpy_reference,
             "other-width": rows_of_another_width_are_refused_before_sending}, None)
