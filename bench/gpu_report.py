"""bench/gpu.sh's records as files (doc/gpu.md "bench/gpu.sh"): gpu.json
(every record, as is) and gpu.md (its tables), both rewritten after every
run into each folder asked, so what finished is on disk whatever stops the
bench. A record is a finished run, or one with "failed" (the reason) or
"not_run" (gpu_plan.NOT_RUN): those are a row of the first table only. A
ceiling's record (gpu_ceiling: "system": "plain", with "mps") is a row of
the ceiling's table, never of the others.
"""
import json
import os


def write(folders, rows):
    """Writes gpu.json and gpu.md of `rows` into each of `folders` (made if need be)."""
    text = markdown(rows)
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
        for name, content in (("gpu.json", json.dumps(rows, indent=1)), ("gpu.md", text)):
            with open(os.path.join(folder, name + ".tmp"), "w") as f:
                f.write(content)
            os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


def pipeline_cell(r):
    """on / off as the run went, else blkps.torch's default, unsaid."""
    return {True: "on", False: "off"}.get(r.get("pipeline"), "default")


def _ms(t, key):
    return t.get(key, "–")


def _runs(rows):
    out = ["| model | params | batch | mode | wire | shards | learners | pipeline | pulls | step ms | alone ms | "
           "ratio | learner CPU s/step | tgtd CPU s/step | rank 0 ms/step: copy out, exchange, push, pull, "
           "step wait, weights wait (on the GPU) | rank 0 pipeline wait ms/step | rank 0 transfers/step |",
           "|" + "---|" * 17]
    for r in rows:
        head = (f"| {r['model']} | {r.get('params', 0):,} | {r.get('batch', '')} | {r.get('mode', 'async')} | "
                f"{r.get('wire_dtype', '')} | {r.get('shards', '')} | {r.get('learners', '')} | ")
        if "failed" in r or "not_run" in r:
            why = f"failed: {r['failed']}" if "failed" in r else r["not_run"]
            out.append(head + f"{r.get('pipeline_asked', '')} | | {why} |" + " |" * 7)
            continue
        t = r["rank0_ms_per_step"]
        pulls = "during backward" if r.get("pull_during_backward", True) else "after step"
        if r.get("switch_interval"):
            pulls += f" (switch interval {r['switch_interval'] * 1000:g} ms)"
        out.append(head + f"{pipeline_cell(r)} | {pulls} | {r['step_ms']} | {r['standalone_step_ms']} | "
                   f"{r['ratio']} | {r['learner_cpu_s_per_step']} | {r['tgtd_cpu_s_per_step']} | "
                   f"{t['copy_out']}, {t['exchange']}, {t['push']}, {t['pull']}, {t['step_wait']}, "
                   f"{t['weights_wait']} ({_ms(t, 'gpu_weights_wait')}) | {_ms(t, 'pipeline_wait')} | "
                   f"{r['rank0_transfers_per_step']} |")
    return out


def _ceilings(rows):
    out = ["| model | batch each | learners | MPS | step ms | alone ms | ratio | learner CPU s/step | "
           "GPU peak MB, all |", "|" + "---|" * 9]
    for r in rows:
        head = f"| {r['model']} | {r.get('batch', 0) // r['learners']} | {r['learners']} | {r['mps']} | "
        if "failed" in r or "not_run" in r:
            out.append(head + (f"failed: {r['failed']}" if "failed" in r else r["not_run"]) + " |" * 5)
            continue
        out.append(head + f"{r['step_ms']} | {r['standalone_step_ms']} | {r['ratio']} | "
                   f"{r['learner_cpu_s_per_step']} | {r['memory'].get('gpu_peak_mb', '–')} |")
    return out


def _of_ceiling(rows, ceilings):
    """Each run of several learners against the ceiling of its model and
    learner count: the plain processes' step time over the run's (both
    move a whole batch a step), per MPS setting measured."""
    mps = sorted({c["mps"] for c in ceilings})
    out = ["| model | mode | wire | learners | pipeline | " + " | ".join(f"of plain, MPS {m}" for m in mps) + " |",
           "|" + "---|" * (5 + len(mps))]
    for r in rows:
        cells = []
        for m in mps:
            c = next((c for c in ceilings if (c["model"], c["learners"], c["mps"]) == (r["model"], r["learners"], m)),
                     None)
            cells.append(f"{c['step_ms'] / r['step_ms']:.3f}" if c else "–")
        out.append(_key(r) + " | ".join(cells) + " |")
    return out


def _key(r):
    return f"| {r['model']} | {r.get('mode', 'async')} | {r['wire_dtype']} | {r['learners']} | {pipeline_cell(r)} | "


def _memory(rows):
    out = ["| model | mode | wire | learners | pipeline | GPU peak MB, all learners | GPU peak MB, alone | "
           "beyond alone MB | blkps's GPU MB | host staging MB |", "|" + "---|" * 10]
    for r in rows:
        m = r.get("memory", {})
        out.append(_key(r) + f"{m.get('gpu_peak_mb', '–')} | {r['rank0_memory'].get('alone_gpu_peak_mb') or '–'} | "
                   f"{m.get('beyond_alone_mb', '–')} | {m.get('blkps_gpu_mb', '–')} | "
                   f"{m.get('host_staging_mb', '–')} |")
    return out


def _waits(rows):
    out = ["| model | mode | wire | learners | pipeline | on | ms/step | most waited modules, ms/step | "
           "embedding's share |", "|" + "---|" * 9]
    for r in rows:
        for clock, w in sorted(r.get("rank0_module_waits", {}).items()):
            top = ", ".join(f"{name} {ms}" for name, ms in w["top"]) or "–"
            share = f"{w['embedding_share']:.1%} ({w['embedding']})" if "embedding" in w else "–"
            out.append(_key(r) + f"{'the CPU' if clock == 'cpu' else 'the GPU'} | {w['ms_per_step']} | {top} | "
                       f"{share} |")
    return out


def _transfers(rows):
    out = ["| model | wire | push | pull | exchange | push by bucket | pull by bucket | exchange by bucket |",
           "|" + "---|" * 8]
    for r in rows:
        a = r["transfers_alone_ms"]
        out.append(f"| {r['model']} | {r['wire_dtype']} | {a['push']} | {a['pull']} | {a['exchange']} | "
                   f"{a['bucket_push']} | {a['bucket_pull']} | {a.get('bucket_exchange', '–')} |")
    return out


def markdown(rows):
    """gpu.md: the runs, then for the finished ones the memory, rank 0's
    waits for weights by module and the transfers alone."""
    gpu = next((r["gpu"] for r in rows if "gpu" in r), "no run finished")
    ceilings = [r for r in rows if "mps" in r]
    rows = [r for r in rows if "mps" not in r]
    done = [r for r in rows if "failed" not in r and "not_run" not in r]
    parts = [f"# GPU learners through blkps ({gpu})",
             "Written by `bench/gpu.sh`; a step's time, with the GPU's own step time alone beside it (ratio = "
             "alone / through blkps); the server's mode; the pipeline (step t+1 computes on the weights pulled "
             "during step t): on, off, or blkps.torch's default where the run did not say. Pulls: each bucket's "
             "right after its push (during backward) or all after step(). Rank 0's time per step, timed steps "
             "only: the optimizer's `seconds` (doc/gpu.md \"bench/gpu.sh\").", "\n".join(_runs(rows))]
    if ceilings:
        parts += ["## The ceiling: plain processes sharing the GPU",
                  "The same model trained by that many processes on the GPU at once, without blkps, each at the "
                  "batch / learners, with CUDA's MPS off and on (a daemon of the run's own); ratio = alone / "
                  "step, as above (bench/gpu_ceiling.py).", "\n".join(_ceilings(ceilings))]
        measured = [c for c in ceilings if "failed" not in c and "not_run" not in c]
        several = [r for r in done if r["learners"] > 1]
        if measured and several:
            parts += ["### Learners through blkps against the ceiling",
                      "Samples per second of the run over those of the plain processes (their step time over the "
                      "run's; issue 37's bar for two bsp learners: 0.90).", "\n".join(_of_ceiling(several, measured))]
    if done:
        parts += ["## Memory", "All learners together; alone: one process, the whole batch (two learners run "
                  "half a batch each, so their excess includes the second model and its CUDA state). Host "
                  "staging is page-locked with a CUDA model.", "\n".join(_memory(done))]
    waited = [r for r in done if r.get("rank0_module_waits")]
    if waited:
        parts += ["## Rank 0's waits for weights, by module",
                  "Per timed step: on the CPU, the optimizer's forward pre-hook waiting for the module's weights "
                  "to reach the host; on the GPU, the compute stream stalled on weights whose copy had not landed. "
                  "The embedding's share: GPT-2's tied `wte` (read first by the forward, last by the output head).",
                  "\n".join(_waits(waited))]
    alone = [r for r in done if "transfers_alone_ms" in r]
    if alone:
        parts += ["## The transfers alone",
                  "No GPU, one learner, the same shards, ms: the whole model as one call, then one of "
                  "blkps.torch's default buckets (1,048,576 parameters) per call.", "\n".join(_transfers(alone))]
    return "\n\n".join(parts) + "\n"
