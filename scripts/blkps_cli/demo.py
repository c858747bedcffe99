"""blkps demo: README's main job on this machine. Builds what the demo needs
(with progress), starts a parameter server on loopback, trains an MLP on the
digits data set with several learner processes through the model device,
prints the job's status and the held-out test accuracy, and shuts
everything down (also on Ctrl-C or a failure).

--via says how the learners reach the model: lib (default) Python learners
through libblkps over iSCSI; mount: the model mounted as files (blkps mount)
and Python learners with plain os.pread/os.pwrite, no library; engine: C++
learners on libblkps's double-buffered engine. Each learner has its own LUN
(learner slot). At the end the model is checkpointed (fsync) into
build/demo/.

--workload fashion-cnn trains a PyTorch CNN on Fashion-MNIST with blkps.torch
instead (learner/examples/torch_fashion_job.py; 2 epochs unless --epochs,
server rule adam lr 0.002, --via lib or mount)."""

import os
import subprocess
import sys
import threading

from . import control, tgtd, tools
from .arguments import positive_int
from .errors import UserError

PYTHON = "/usr/bin/python3"
TRAIN = os.path.join(tools.TOP, "learner", "examples", "train_digits.py")
PLAIN = os.path.join(tools.TOP, "learner", "examples", "plain_digits.py")
FASHION_JOB = os.path.join(tools.TOP, "learner", "examples", "torch_fashion_job.py")
# The build targets each --via needs (the plugin and its option checker always).
BUILD_TARGETS = {"lib": ["blkps"], "mount": ["blkps", "blkps-mount"], "engine": ["blkps", "blkps-train-digits"]}


def say(text):
    print(f"demo: {text}", flush=True)


def relay(stream, lock, ready):
    """Copies a learner's output to ours line by line: two learners' lines
    never run together. Sets `ready` at the learner's "learner K: ready"."""
    for line in iter(stream.readline, ""):
        if line.rstrip().endswith(": ready"):
            ready.set()
        with lock:
            sys.stdout.write(line if line.endswith("\n") else line + "\n")
            sys.stdout.flush()
    stream.close()
    ready.set()  # ended before the gate: its exit status tells


def run_learners(commands):
    """Runs the learners (each command takes --start-gate) and starts them
    together: they import, load their data and open the model each at its
    own pace, then all train at once, so that every learner's first epoch
    meets an untrained model and their progress lines interleave."""
    lock = threading.Lock()
    procs, relays, ready = [], [], []
    for cmd in commands:
        proc = subprocess.Popen([*cmd, "--start-gate"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        ready.append(threading.Event())
        relay_thread = threading.Thread(target=relay, args=(proc.stdout, lock, ready[-1]))
        relay_thread.start()
        procs.append(proc)
        relays.append(relay_thread)
    try:
        for event in ready:
            event.wait()
        with lock:
            say(f"{len(procs)} learners ready: starting them together")
        for p in procs:  # the start line; a learner that already exited has no reader
            try:
                p.stdin.write("start\n")
                p.stdin.close()
            except BrokenPipeError:
                pass
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for t in relays:
            t.join()
    failed = [k for k, code in enumerate(codes) if code != 0]
    if failed:
        raise UserError("demo", f"learner {failed[0]} failed (exit {codes[failed[0]]})", "its lines above say why")


def command_demo(a):
    if a.workload == "fashion-cnn" and a.via == "engine":
        raise UserError("demo", "--workload fashion-cnn runs --via lib or mount", "drop --via engine")
    if os.geteuid() != 0:
        raise UserError("demo", "needs root: it installs Debian packages and starts tgtd", "sudo scripts/blkps demo")
    targets = ["bs_blkps", "blkps-bsopts", *BUILD_TARGETS[a.via]]
    say(f"building {', '.join(targets)} (the first run installs packages and takes a few minutes)")
    if subprocess.run([tools.script("build.sh"), *targets]).returncode != 0:
        raise UserError("demo", "the build failed", "see build/build.log")
    if a.workload == "fashion-cnn":
        epochs = a.epochs or 2
        say(f"Fashion-MNIST CNN (PyTorch, blkps.torch), {a.learners} learners, mode {a.mode}, via {a.via}")
        return subprocess.run([PYTHON, FASHION_JOB, "--learners", str(a.learners), "--mode", a.mode,
                               "--via", a.via, "--epochs", str(epochs)]).returncode
    a.epochs = a.epochs or 20
    state = os.path.join(tools.TOP, "build", "demo")
    mnt = os.path.join(state, "mnt")
    params = subprocess.run([PYTHON, TRAIN, "--params"], capture_output=True, text=True, check=True).stdout.strip()
    server = tgtd.Target(state)
    server.stop()
    checkpoint = os.path.join(state, "digits-mlp.ckpt")
    if os.path.exists(checkpoint):
        os.remove(checkpoint)  # a fresh model each run
    say(f"starting the parameter server (MLP on digits, {params} parameters, sgd lr={a.lr}, mode {a.mode}, "
        f"{a.transport} on loopback)")
    mounted = False
    try:
        values = server.start(tgtd.Options(
            name="digits-mlp", transport=a.transport, luns=a.learners,
            bsopts=f"params={params};rule=sgd;lr={a.lr};init=normal:0.1;seed=1;mode={a.mode};"
                   f"checkpoint={checkpoint}"))
        urls = values["URLS"].split()
        say("learner devices " + " ".join(urls) + "; control device " + values["CONTROL_URL"])
        if a.via == "lib":
            learner = [PYTHON, TRAIN]
        elif a.via == "engine":
            learner = [tools.built("blkps-train-digits")]
        else:
            learner = [PYTHON, PLAIN]
            os.makedirs(mnt, exist_ok=True)
            files = [f"slot{k}={url}" for k, url in enumerate(urls, 1)]
            subprocess.run([tools.built("blkps-mount"), mnt, *files, "--control", f"control={values['CONTROL_URL']}"],
                           check=True)
            mounted = True
            urls = [os.path.join(mnt, f"slot{k}") for k in range(1, a.learners + 1)]
            say(f"mounted the model at {mnt}: {' '.join(sorted(os.listdir(mnt)))}")
        say(f"training with {a.learners} learner processes ({a.via}), {a.epochs} epochs each")
        run_learners([[*learner, "--target", urls[k], "--learner", str(k), "--learners", str(a.learners),
                       "--epochs", str(a.epochs), "--sync"] for k in range(a.learners)])
        with control.open_control(values["CONTROL_URL"], None, None) as device:
            control.print_status(device.status())
        sys.stdout.flush()
        return subprocess.run([PYTHON, TRAIN, "--target", values["URL"], "--evaluate"]).returncode
    finally:
        if mounted:
            subprocess.run(["fusermount3", "-u", mnt])
        server.stop()


def positive_float(text):
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


positive_float.__name__ = "positive number"


def add_parser(sub):
    p = sub.add_parser("demo", help="README's main job: train digits with several learners through a server here",
                       description=__doc__.replace("blkps demo: ", "", 1))
    p.add_argument("--learners", type=positive_int, default=2, help="learner processes (default 2)")
    p.add_argument("--epochs", type=positive_int, help="epochs per learner (default 20; fashion-cnn 2)")
    p.add_argument("--lr", type=positive_float, default=0.2, help="the server's sgd learning rate (default 0.2)")
    p.add_argument("--mode", default="async", help="async, bsp or ssp:S (default async)")
    p.add_argument("--transport", choices=("iscsi", "iser"), default="iscsi")
    p.add_argument("--via", choices=tuple(BUILD_TARGETS), default="lib", help="how learners reach the model")
    p.add_argument("--workload", choices=("digits", "fashion-cnn"), default="digits",
                   help="digits (an MLP, seconds; default) or fashion-cnn (PyTorch CNN on Fashion-MNIST)")
    p.set_defaults(run=command_demo)
