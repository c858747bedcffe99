#!/usr/bin/python3
"""One Fashion-MNIST training job through blkps on this host: starts a private
server (`blkps target`, one LUN per learner), optionally mounts it
(blkps-mount), runs N torch_fashion.py learners with RANK/WORLD_SIZE/
BLKPS_TARGET/BLKPS_CONTROL set as a launcher would, and stops everything,
also on failure. The learners' lines pass through; the exit status is the
first failing learner's.

  torch_fashion_job.py [--learners 2] [--mode bsp] [--via lib|mount]
      [--optimizer gradient|delta] [--rule adam] [--server-lr 0.002]
  torch_fashion_job.py --ddp [--learners 2] [torch_fashion.py options]   the peer, no server
      [torch_fashion.py options: --epochs, --train-subset, --min-accuracy, ...]

Gradient mode uses the server's --rule and --server-lr; delta mode runs a
local SGD in each learner and the server's rule sum.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
LEARNER = os.path.join(HERE, "torch_fashion.py")
BLKPS = os.path.join(TOP, "scripts", "blkps")


def start_server(state, bsopts, luns, build, tgtds=None, replicas=1):
    """Starts a private server in folder `state` (`blkps target start`; it
    stops when this process exits) with `luns` learner LUNs, over `tgtds`
    tgtds if given (--tgtd; its URLs are then layout: files), with a backup
    if `replicas` is 2 (--replicas; its URLs are the primary's); returns its
    state as a dict (URL, URLS, CONTROL_URL, ...: `blkps target show --json`). Learners are
    declared dead after 60 s without I/O, not 10, unless `bsopts` gives
    dead_after: a learner's slot counts from the server's start, and
    importing torch on a busy machine has taken over 10 s, after which bsp
    rounds would go on without it."""
    if "dead_after=" not in bsopts:
        bsopts += ";dead_after=60"
    subprocess.run([BLKPS, "target", "start", "--dir", state,
                    "--luns", str(luns), *(["--tgtd", str(tgtds)] if tgtds else []),
                    *(["--replicas", str(replicas)] if replicas > 1 else []), "--owner-pid", str(os.getpid()),
                    "--plugin", os.path.join(build, "target-plugin", "bs_blkps.so"),
                    "--bsopts", bsopts], check=True, stdout=subprocess.DEVNULL)
    shown = subprocess.run([BLKPS, "target", "show", "--dir", state, "--json"], check=True,
                           capture_output=True, text=True).stdout
    return json.loads(shown)


def slot_target(env):
    """The learner LUNs' URL with {slot} for the LUN (blkps.torch.init)."""
    return env["URL"].rsplit("/", 1)[0] + "/{slot}"


def stop_server(state):
    """Stops the server started in `state` and removes the folder."""
    subprocess.run([BLKPS, "target", "stop", "--dir", state],
                   stdout=subprocess.DEVNULL)
    subprocess.run(["rm", "-rf", state])


def mount(args, env, state, mountpoint):
    """blkps-mount -f of the server `env` (slot1..N, control) at mountpoint;
    returns the process once the control file is there."""
    log = open(os.path.join(state, "mount.log"), "w")
    files = [f"slot{k}={url}" for k, url in enumerate(env["URLS"].split(), 1)]
    proc = subprocess.Popen([os.path.join(args.build, "learner", "mount", "blkps-mount"), "-f",
                             mountpoint, *files, "--control", f"control={env['CONTROL_URL']}"],
                            stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        if os.path.exists(os.path.join(mountpoint, "control")):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise SystemExit(f"torch_fashion_job: blkps-mount did not mount (log: {log.name})")


def print_push_staleness(state):
    """One line "server: {json}": each learner's push staleness (updates
    between its pull and its push) as the server measured it."""
    shown = subprocess.run([BLKPS, "status", "--dir", state, "--json"], capture_output=True, text=True)
    if shown.returncode != 0:
        return
    learners = json.loads(shown.stdout)["learners"]
    keys = ("push_staleness_max", "push_staleness_mean", "stale_pushes")
    print("server: " + json.dumps({"learners": [{k: s[k] for k in keys} for s in learners]}), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_learners(args, learner_env, learner_args):
    """Runs the learners with the launcher's variables and learner_env;
    returns the first non-zero exit status, else 0."""
    procs = []
    for rank in range(args.learners):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.learners), LOCAL_RANK=str(rank),
                   **learner_env)
        if args.build:
            env["BLKPS_LIB"] = os.path.join(args.build, "learner", "libblkps.so")
        procs.append(subprocess.Popen([sys.executable, LEARNER] + learner_args, env=env))
    try:
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return next((c for c in codes if c != 0), 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--mode", default="bsp", help="async, bsp or ssp:S")
    ap.add_argument("--via", choices=["lib", "mount"], default="lib",
                    help="libblkps URLs, or files on a blkps-mount of the server")
    ap.add_argument("--optimizer", choices=["gradient", "delta"], default="gradient")
    ap.add_argument("--rule", default="adam", help="gradient mode: the server's update rule")
    ap.add_argument("--server-lr", type=float, default=0.002,
                    help="the server rule's lr (delta mode: ignored by rule sum)")
    ap.add_argument("--server-options", default="",
                    help="more --bsopts for the server, ';'-separated (e.g. staleness_aware=0)")
    ap.add_argument("--ddp", action="store_true",
                    help="no server: the learners use DistributedDataParallel (gloo) instead")
    ap.add_argument("--build", default=os.path.join(TOP, "build", "cmake"), help="the cmake build folder")
    args, learner_args = ap.parse_known_args()
    if args.learners < 1:
        ap.error("--learners must be at least 1")
    if args.ddp:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        print(f"torch_fashion_job: {args.learners} learners, DistributedDataParallel (gloo)", flush=True)
        sys.exit(run_learners(args, env, learner_args + ["--ddp"]))
    learner_args += ["--optimizer", args.optimizer]
    params = int(subprocess.run([sys.executable, LEARNER, "--params"], check=True,
                                capture_output=True, text=True).stdout)
    state = tempfile.mkdtemp(prefix="blkps-torch-job-")
    mount_proc = None
    try:
        rule = "sum" if args.optimizer == "delta" else args.rule
        bsopts = f"params={params};rule={rule};lr={args.server_lr};mode={args.mode}"
        env = start_server(state, bsopts + (";" + args.server_options if args.server_options else ""),
                           args.learners, args.build)
        if args.via == "mount":
            mountpoint = os.path.join(state, "mnt")
            os.mkdir(mountpoint)
            mount_proc = mount(args, env, state, mountpoint)
            target, control = os.path.join(mountpoint, "slot{slot}"), os.path.join(mountpoint, "control")
        else:
            target, control = slot_target(env), env["CONTROL_URL"]
        print(f"torch_fashion_job: {args.learners} learners, {args.mode}, {args.optimizer} mode, "
              f"via {args.via}, {params} parameters", flush=True)
        code = run_learners(args, {"BLKPS_TARGET": target, "BLKPS_CONTROL": control}, learner_args)
        print_push_staleness(state)
    finally:
        if mount_proc is not None:
            mount_proc.send_signal(signal.SIGTERM)
            mount_proc.wait()
        stop_server(state)
    sys.exit(code)


if __name__ == "__main__":
    main()
