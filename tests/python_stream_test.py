#!/usr/bin/python3
"""The Python binding's submissions (blkps.Model.submit_*, complete;
doc/libblkps.md "Streaming") against a real tgtd, one case each:

  tickets-complete-once: streamed exchanges, pushes and pulls of uneven
    buckets each complete exactly once, their arrays holding what the
    synchronous calls give (float32 and bfloat16 LUNs, 16-bit values too);
  refused-before-sending: a wrong array raises ValueError and a range past
    the end OSError, as the synchronous calls do; no ticket, nothing sent;
  target-refusal-is-the-completion's-error: a NaN gradient the target
    refuses comes back as the Completion's OSError (EINVAL) and result()
    raises it;
  wakes-lose-nothing: another thread's wake() calls, made while the
    submissions run and complete(timeout=None) waits, end waits early but
    lose or repeat no completion; wake() on a closed model does nothing.

Usage: python_stream_test.py <repo> <build dir> <case>
"""
import errno
import threading

import numpy as np

import testbed
from testbed import check

top, build, _ = testbed.setup("python_stream_test")
import blkps  # noqa: E402

PARAMS = 30_000


def buckets():
    """Uneven buckets that start and end inside logical blocks."""
    first, k = 0, 0
    while first < PARAMS:
        count = min(PARAMS - first, 900 + 517 * (k % 4))
        yield first, count
        first, k = first + count, k + 1


def complete_all(model):
    """Every outstanding Completion by ticket; a ticket seen twice fails."""
    done = {}
    while model.outstanding:
        for c in model.complete(timeout=None, max_completions=3):
            check(c.ticket not in done, f"ticket {c.ticket} completed twice")
            done[c.ticket] = c
    return done


def tickets_complete_once():
    with testbed.Server(f"params={PARAMS};rule=sum;block=1K") as f32, \
            testbed.Server(f"params={PARAMS};rule=sum;block=1K;dtype=bfloat16") as bf16:
        for what, url, dtype, values16 in (("float32", f32.url, None, False),
                                           ("bfloat16", bf16.url, "bfloat16", False),
                                           ("bfloat16 values", bf16.url, "bfloat16", True)):
            with blkps.Model(url, request_bytes=1024, dtype=dtype) as model:
                model_now = model.pull(0, PARAMS)
                grad = (np.arange(PARAMS) % 9 - 4).astype(np.float32)
                tickets, outs = set(), {}
                for first, count in buckets():
                    part = grad[first:first + count]
                    if values16:
                        t = model.submit_exchange16(first, (part.view(np.uint32) >> 16).astype(np.uint16))
                    else:
                        t = model.submit_exchange(first, part)
                    check(t not in tickets, f"{what}: ticket {t} given twice")
                    tickets.add(t)
                    outs[t] = first
                done = complete_all(model)
                check(set(done) == tickets, f"{what}: completed {sorted(done)}, submitted {sorted(tickets)}")
                model_now += grad
                for t, c in done.items():
                    got = c.result()
                    if values16:
                        got = (got.astype(np.uint32) << 16).view(np.float32)
                    first = outs[t]
                    check(np.array_equal(got, model_now[first:first + got.size]),
                          f"{what}: exchange at {first} returned {got[:4]}..., "
                          f"expected {model_now[first:first + 4]}...")
                pulled = np.full(PARAMS, -7.5, dtype=np.float32)
                for first, count in buckets():
                    model.submit_push(first, np.ones(count, dtype=np.float32))
                for first, count in buckets():
                    model.submit_pull_into(first, pulled[first:first + count])
                for c in complete_all(model).values():
                    c.result()
                check(np.array_equal(pulled, model_now + 1), f"{what}: streamed pulls after pushes differ")
                check(np.array_equal(model.pull(0, PARAMS), pulled), f"{what}: the synchronous pull differs")
                model.push(0, -(model_now + 1))  # back to zeros for the next case
    print("python stream: tickets complete once with the synchronous results")


def refused_before_sending():
    with testbed.Server(f"params={PARAMS};rule=sum;block=1K") as server, blkps.Model(server.url) as model:
        for call, error in ((lambda: model.submit_pull_into(0, np.zeros(4, np.float64)), ValueError),
                            (lambda: model.submit_push16(0, np.zeros(4, np.float32)), ValueError),
                            (lambda: model.submit_exchange(model.param_capacity - 2, np.ones(4)), OSError),
                            (lambda: model.submit_push16(0, np.zeros(4, np.uint16)), OSError)):
            try:
                call()
                check(False, f"a wrong submission did not raise {error.__name__}")
            except error as e:
                check("blkps" in str(e), f"unclear error: {e}")
        check(model.outstanding == 0, f"{model.outstanding} tickets after refused submissions")
        check(model.complete(timeout=0) == [], "complete() with nothing outstanding returned something")
        check(np.all(model.pull(0, PARAMS) == 0), "a refused submission changed the model")
    print("python stream: refused submissions raise and send nothing")


def target_refusal_is_the_completions_error():
    with testbed.Server(f"params={PARAMS};rule=sum;block=1K") as server, blkps.Model(server.url) as model:
        grad = np.ones(PARAMS, dtype=np.float32)
        grad[PARAMS // 2] = np.nan
        ticket = model.submit_push(0, grad)
        (c,) = complete_all(model).values()
        check(c.ticket == ticket and isinstance(c.error, OSError) and c.error.errno == errno.EINVAL,
              f"expected EINVAL for ticket {ticket}, got {c!r}")
        check("ILLEGAL" in str(c.error), f"unclear error: {c.error}")
        try:
            c.result()
            check(False, "result() of a failed completion did not raise")
        except OSError as e:
            check(e is c.error, f"result() raised another error: {e}")
    print("python stream: a target's refusal is the completion's error")


def wakes_lose_nothing():
    with testbed.Server(f"params={PARAMS};rule=sum;block=1K") as server:
        model = blkps.Model(server.url)
        grad = np.ones(PARAMS, dtype=np.float32)
        tickets = {model.submit_exchange(first, grad[first:first + count]) for first, count in list(buckets()) * 20}
        done = threading.Event()

        def waker():
            for _ in range(100_000):
                if done.is_set():
                    return
                model.wake()
        thread = threading.Thread(target=waker)
        thread.start()
        try:
            ended = complete_all(model)
        finally:
            done.set()
            thread.join()
        check(set(ended) == tickets, f"{len(tickets - set(ended))} tickets never completed")
        check(all(c.error is None for c in ended.values()), "an exchange failed")
        model.close()
        model.wake()  # closed: does nothing, raises nothing
    print(f"python stream: {len(tickets)} exchanges completed once each among another thread's wakes")


testbed.run({"tickets-complete-once": tickets_complete_once,
             "wakes-lose-nothing": wakes_lose_nothing,
             "refused-before-sending": refused_before_sending,
             "target-refusal-is-the-completions-error": target_refusal_is_the_completions_error},
            learner=None)
