"""Where a blkps.torch learner waits for weights, module by module
(bench/gpu.sh's rank 0; doc/gpu.md "bench/gpu.sh"). blkps.torch's
forward pre-hook makes each module wait for the buckets it reads; this
module times those waits from the outside, so the optimizer is not changed:

- on the CPU: what the optimizer's seconds["weights_wait"] (its wait for
  weights still arriving on the host) grows by from one module's forward
  pre-hooks to the next module's, or to the end of the forward (forward());
  a global pre-hook registered before the optimizer's hooks runs first
  for each module, so each wait is given to the module it was made for;
- on the GPU: the compute stream's stall on a bucket whose copy had not
  landed when the wait was queued, timed by a pair of CUDA events around
  it (a GPU wait, which no CPU clock sees), given to the module whose
  forward queued it.

The counts start at reset() (the end of warm-up) and are read once the
device has synchronized (summary()).
"""
TOP_MODULES = 5  # the modules the summary names, most waited first


class ModuleWaits:
    """The waits for weights of `model`'s modules. REQUIRES: built before
    the optimizer (its pre-hook runs before the optimizer's), watch(opt)
    after it, forward_done() after each forward; all on the training
    thread."""

    def __init__(self, torch, model):
        self._torch = torch
        self._names = {id(m): name or "(model)" for name, m in model.named_modules()}
        self._cpu, self._gpu_events = {}, []
        self._seconds, self._module, self._mark = {}, None, 0.0
        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._entered)

    def watch(self, opt):
        """Follows `opt`'s weights_wait; on a CUDA model (opt.flat, its
        FlatModel) times the stream's stalls too."""
        self._seconds = getattr(opt, "seconds", {})
        flat = getattr(opt, "flat", None)
        if flat is not None and getattr(flat, "device", None) is not None and flat.device.type == "cuda" \
                and hasattr(flat, "wait_weights") and hasattr(flat, "weights_landed"):
            self._time_stalls(flat)

    def _entered(self, module, _inputs):
        self.forward_done()
        self._module, self._mark = module, self._seconds.get("weights_wait", 0.0)

    def forward_done(self):
        """Gives the wait since the last module's pre-hooks to that module."""
        if self._module is not None:
            waited = self._seconds.get("weights_wait", 0.0) - self._mark
            if waited > 0:
                name = self._names.get(id(self._module), type(self._module).__name__)
                self._cpu[name] = self._cpu.get(name, 0.0) + waited
            self._module = None

    def _time_stalls(self, flat):
        torch, wait = self._torch, flat.wait_weights

        def timed(first, end):
            if flat.weights_landed(first, end):
                return wait(first, end)  # nothing to stall on: no events, no cost
            stream = torch.cuda.current_stream(flat.device)
            before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            before.record(stream)
            wait(first, end)
            after.record(stream)
            module = self._names.get(id(self._module), "(outside a forward)")
            self._gpu_events.append((module, before, after))
        flat.wait_weights = timed

    def reset(self):
        """Counts from here (the first timed step)."""
        self._cpu, self._gpu_events, self._module = {}, [], None

    def close(self):
        self._handle.remove()

    def summary(self, steps, embedding=None):
        """ms per step over `steps`: the CPU waits and (on a GPU) the
        stream's stalls, in total and for the TOP_MODULES most waited
        modules, and `embedding`'s (a module's name) share of each total.
        REQUIRES: the device synchronized since the last step."""
        gpu = {}
        for module, before, after in self._gpu_events:
            gpu[module] = gpu.get(module, 0.0) + before.elapsed_time(after) / 1000
        out = {}
        for clock, spent in (("cpu", self._cpu), ("gpu", gpu)):
            if clock == "gpu" and not self._gpu_events:
                continue
            total = sum(spent.values())
            top = sorted(spent.items(), key=lambda kv: -kv[1])[:TOP_MODULES]
            out[clock] = {"ms_per_step": round(1000 * total / steps, 2),
                          "top": [[name, round(1000 * s / steps, 2)] for name, s in top]}
            if embedding is not None:
                out[clock]["embedding"] = embedding
                out[clock]["embedding_share"] = round(spent.get(embedding, 0.0) / total, 3) if total else 0.0
        return out
