"""The ceiling of learners sharing one GPU (doc/gpu.md "bench/gpu.sh",
issue 37 item 4): the same model trained by that many plain processes on
the GPU at once, each at batch / learners, without blkps, with CUDA's
Multi-Process Service (MPS) off and on. Learners through blkps are then
compared with what the GPU gives plain processes, not with one process
alone.

MPS: a control daemon of its own (nvidia-cuda-mps-control -d) with its
pipe and log in a private folder, which only this run's processes name
(CUDA_MPS_PIPE_DIRECTORY), asked during and after the run whether a
server served them (get_server_list: a server that ends with its last
client is seen while they run) and told to quit whatever happened."""
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading

MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_SETTINGS = ("off", "on")
CONTROL_TIMEOUT_S = 30  # a control command's answer
POLL_S = 1.0  # watching(): how often the daemon is asked for its servers


class Mps:
    """A private MPS control daemon while in a `with` block; env() is what
    its clients need. Raises RuntimeError, in one line, where it cannot
    start, or does not quit at the end (its folder is then left, named)."""

    def __init__(self):
        self.folder = None
        self._seen = False  # a server listed (watching, served)

    def env(self):
        return {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(self.folder, "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": os.path.join(self.folder, "log")}

    def _control(self, *argv, command=None):
        return subprocess.run([MPS_CONTROL, *argv], input=command, env=dict(os.environ, **self.env()),
                              capture_output=True, text=True, timeout=CONTROL_TIMEOUT_S)

    def __enter__(self):
        if shutil.which(MPS_CONTROL) is None:
            raise RuntimeError(f"MPS: {MPS_CONTROL} is not on PATH")
        self.folder = tempfile.mkdtemp(prefix="blkps-gpu-mps-")
        for part in self.env().values():
            os.mkdir(part)
        started = self._control("-d")
        if started.returncode != 0:
            self._remove()
            raise RuntimeError(f"MPS: {MPS_CONTROL} -d exited with {started.returncode}: "
                               f"{(started.stderr or started.stdout).strip()[:200]}")
        return self

    def _listed(self):
        """Whether get_server_list names a server now."""
        try:
            listed = self._control(command="get_server_list\n")
        except subprocess.TimeoutExpired:
            return False
        return listed.returncode == 0 and bool(listed.stdout.strip())

    @contextlib.contextmanager
    def watching(self):
        """Asks the daemon every POLL_S, while in the block, whether a
        server serves its clients: served() then holds the answer even
        where the server is gone by the block's end."""
        stop = threading.Event()

        def poll():
            while not self._seen and not stop.wait(POLL_S):
                self._seen = self._listed()
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            yield self
        finally:
            stop.set()
            poller.join()

    def served(self):
        """Whether an MPS server served this daemon's clients: seen while
        watching(), or listed now."""
        self._seen = self._seen or self._listed()
        return self._seen

    def __exit__(self, *_):
        try:
            quit_ = self._control(command="quit\n")
        except subprocess.TimeoutExpired:
            quit_ = None
        if quit_ is None or quit_.returncode != 0:
            raise RuntimeError(f"MPS: the control daemon of {self.folder} did not quit: stop it with "
                               f"CUDA_MPS_PIPE_DIRECTORY={self.env()['CUDA_MPS_PIPE_DIRECTORY']} {MPS_CONTROL} "
                               "and the command quit")
        self._remove()

    def _remove(self):
        shutil.rmtree(self.folder, ignore_errors=True)


def measure(cfg, learners, mps, run, timeout):
    """`learners` plain processes of the training `cfg` (gpu_bench.train,
    blkps off; cfg["batch"] is each one's) at once, with MPS `mps` ("off",
    "on"); run(cfg, envs, timeout) runs them (gpu_bench.run_learners).
    Returns their results. Raises RuntimeError where they fail, or MPS
    does (an MPS server that served none of them included)."""
    if mps == "off":
        return run(cfg, [None] * learners, timeout)
    if cfg.get("device", "cuda") != "cuda":
        raise RuntimeError("MPS: a CUDA service, not on --device cpu")
    with Mps() as daemon:
        with daemon.watching():
            outs = run(cfg, [dict(os.environ, **daemon.env())] * learners, timeout)
        if not daemon.served():
            raise RuntimeError("MPS: the daemon started, but no MPS server served the processes")
        return outs
