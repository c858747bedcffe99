"""The testbed of the Python tests that run against a real server
(doc/development.md "Writing a test"): this checkout and its build, a
private server, learner processes, one-line failures and the case
dispatch. A test that needs no server takes setup() alone.

ctest runs such a test as `NAME.py <repo> <build dir> [case ...]`
(tests/CMakeLists.txt); it begins

    import testbed
    top, build, args = testbed.setup("NAME")
    import blkps  # noqa: E402  (this checkout's package, this build's library)

Contract:
- setup(name): reads the repo and build dir from sys.argv[1:3]; sets
  $BLKPS_LIB to the build's libblkps.so and puts the checkout's
  learner/python and learner/examples first on sys.path, so that this
  process and every learner it starts use this checkout's package on this
  build's library. Returns (top, build, the arguments after those two).
  `name` and the case (the first argument after them) start
  every failure line.
- fail(message) ends the test (exit status 1) with the one line
  "NAME: message"; check(condition, message) fails unless condition.
- Server(bsopts, luns=1, tgtds=1): a private server (`blkps target start`, through
  torch_fashion_job.start_server: its own tgtd, control socket, free
  loopback port and state folder; learners declared dead after 60 s, not
  10, as a loaded machine needs), over `tgtds` tgtds if given (blkps target
  start --tgtd: its URLs are then layout: files), up when the constructor returns; it stops
  when the test process ends, whatever the end. Use it as `with
  testbed.Server(...) as server:` to stop it and remove its folder on
  leaving the block, also on failure. A failed start fails the test.
- Server.run_learners(config, count, env=None, kind=None, env_of=None)
  runs `count` learners at once: this test file again as `... learner
  [KIND] CONFIG` (config as JSON), rank R's environment env_of(R), by
  default this one with RANK/WORLD_SIZE/BLKPS_TARGET/BLKPS_CONTROL set as a
  launcher would, and `env` added; returns the last stdout line of each,
  parsed as JSON, by rank. A learner that exits non-zero fails the test.
  start_learners() (same arguments) and finish(procs) are its two halves,
  for a test that acts while the learners run; finish() kills (by pid) the
  learners still running when it is left by an exception.
- with_server(bsopts, luns, body): body(server) on a Server, stopped after.
- push_zipf_batch(model, pool, rng, size, width): pushes a batch of `size`
  ids drawn from `pool` by Zipf(1.05) (repeats likely) with small integer
  gradients through model.push_rows; returns the ids pushed and a dict of
  each distinct id's summed gradient (float64) whose row the push changed,
  a zero sum being none.
- run(cases, learner): the test's entry point: with first argument
  "learner", learner([KIND,] config) in a learner process; else the case
  of that name, cases[NAME]().
"""
import json
import os
import subprocess
import sys
import tempfile

NAME = "test"
TOP = BUILD = None
ARGS = []


def setup(name):
    global NAME, TOP, BUILD, ARGS
    TOP, BUILD, ARGS = sys.argv[1], sys.argv[2], sys.argv[3:]
    NAME = " ".join([name, *ARGS[:1]])
    os.environ["BLKPS_LIB"] = os.path.join(BUILD, "learner", "libblkps.so")
    sys.path.insert(0, os.path.join(TOP, "learner", "python"))
    sys.path.insert(0, os.path.join(TOP, "learner", "examples"))
    return TOP, BUILD, ARGS


def fail(message):
    sys.exit(f"{NAME}: {message}")


def check(condition, message):
    if not condition:
        fail(message)


class Server:
    """A private server with `luns` learner LUNs (1..luns) and the control LUN.
    state: its folder; env: `blkps target show --json` (URL, URLS,
    CONTROL_URL, ...); url, urls, control; target: the learner LUNs' URL
    with {slot} for the LUN (blkps.torch.init)."""

    def __init__(self, bsopts, luns=1, tgtds=None):
        import torch_fashion_job as job  # learner/examples: the one Python starter of a private server
        self._job = job
        self.state = tempfile.mkdtemp(prefix=f"blkps-{NAME.split()[0]}-")
        try:
            self.env = job.start_server(self.state, bsopts, luns, BUILD, tgtds)
        except subprocess.CalledProcessError as e:
            job.stop_server(self.state)
            fail(f"the server did not start ({e}); bsopts {bsopts}")
        self.url, self.urls, self.control = self.env["URL"], self.env["URLS"].split(), self.env["CONTROL_URL"]
        self.target = job.slot_target(self.env)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self._job.stop_server(self.state)

    def status(self):
        from blkps.control import Control
        with Control(self.control) as c:
            return c.status()

    def weights(self, count):
        from blkps.control import Control
        with Control(self.control) as c:
            return c.read_weights(0, count)

    def start_learners(self, config, count, env=None, kind=None, env_of=None):
        """Starts the learners (the module's contract); returns the processes."""
        def launched(rank):
            return dict(os.environ, RANK=str(rank), WORLD_SIZE=str(count), BLKPS_TARGET=self.target,
                        BLKPS_CONTROL=self.control, **(env or {}))
        main = os.path.abspath(sys.argv[0])
        kind = [kind] if kind else []
        return [subprocess.Popen([sys.executable, main, TOP, BUILD, "learner", *kind, json.dumps(config)],
                                 env=(env_of or launched)(rank), stdout=subprocess.PIPE, text=True)
                for rank in range(count)]

    def run_learners(self, config, count, env=None, kind=None, env_of=None):
        return finish(self.start_learners(config, count, env, kind, env_of))


def with_server(bsopts, luns, body):
    with Server(bsopts, luns) as server:
        body(server)


def push_zipf_batch(model, pool, rng, size, width):
    import numpy as np
    ids = pool[(rng.zipf(1.05, size) - 1) % pool.size]
    grads = rng.integers(-3, 4, (ids.size, width)).astype(np.float32)
    model.push_rows(ids, grads)
    summed = {}
    for i, g in zip(ids.tolist(), grads.astype(np.float64)):
        summed[i] = summed.get(i, 0) + g
    return ids, {i: g for i, g in summed.items() if np.any(g)}


def finish(procs):
    """Waits for the learners; returns their JSON reports by rank."""
    try:
        outs = [p.communicate()[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, p in enumerate(procs):
        check(p.returncode == 0, f"learner {rank} exited with {p.returncode}")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def run(cases, learner):
    what = ARGS[0] if ARGS else ""
    if what == "learner":
        learner(*ARGS[1:-1], json.loads(ARGS[-1]))
    elif what in cases:
        cases[what]()
    else:
        fail(f"unknown case {what!r} (known: {', '.join(cases)})")
