"""The cluster bench's readers of its processes' raw result files (DIR/raw/),
one per kind of writer, apart from the runs so that a test can feed them
every peer's output (tests/cluster_results_test.py):

  exchanges   one JSON file per rank, each with "times" (seconds of the
              timed exchanges) and "cpu" (seconds over them):
              bench/peers/blkps_exchange.py, which adds "push_times",
              "pull_times", "starts" and "late_s", and
              bench/peers/gloo_allreduce.py (all_reduce or DDP), which
              does not
  mpi         the one JSON line rank 0 of bench/peers/mpi_allreduce.c
              prints: "times" and "cpu" as lists, one item per rank
  training    one bench/train_synthetic.py result per learner: "start"
              (wall clock), "seconds", and "times" beside "losses"
  rows        one bench/peers/blkps_rows.py result per learner: "ids",
              "distinct", "pull_s", "push_s"

A key a writer may leave out is read with a default; a key every writer
of that kind writes is required (a KeyError names it).
"""
import json
import statistics


def load(path):
    with open(path) as f:
        return json.load(f)


def exchanges(results, iterations):
    """(every timed exchange's seconds, figures) from the ranks' result
    dicts: the mean CPU ms per timed exchange; for blkps's ranks the median
    push and pull ms, the phase alignment of their spans and how late the
    latest was ready (when it was)."""
    times, cpu, phases, late, spans = [], [], {"push": [], "pull": []}, [], []
    for k, result in enumerate(results):
        times += result["times"]
        cpu.append(result["cpu"])
        late.append(result.get("late_s", 0.0))
        for phase, seconds in phases.items():
            seconds += result.get(f"{phase}_times", [])
        for start, push, pull in zip(result.get("starts", []), result.get("push_times", []),
                                     result.get("pull_times", [])):
            spans += [(k, "push", start, start + push), (k, "pull", start + push, start + push + pull)]
    out = {"cpu_ms_per_exchange": 1e3 * statistics.mean(cpu) / iterations}
    if max(late) > 0:  # a blkps learner opened after the common start: its opening is in the counters
        out["late_start_s"] = max(late)
    for phase, seconds in phases.items():  # blkps's exchanges: a push, then a pull
        if seconds:
            out[f"ms_per_{phase}"] = 1e3 * statistics.median(seconds)
    if spans:
        out["phase_alignment"] = phase_alignment(spans)
    return times, out


def mpi(result, iterations):
    """(every rank's timed exchanges' seconds, figures) from rank 0's line."""
    return ([t for rank in result["times"] for t in rank],
            {"cpu_ms_per_exchange": 1e3 * statistics.mean(result["cpu"]) / iterations})


def training(results):
    """(the learners' (seconds since the first start, loss) samples in time
    order, the seconds from the first start to the last learner's end)."""
    base = min(r["start"] for r in results)
    samples = sorted((r["start"] - base + t, loss) for r in results for t, loss in zip(r["times"], r["losses"]))
    return samples, max(r["start"] - base + r["seconds"] for r in results)


def rows(results):
    """The row learners' rates, summed (they ran at once): ids and distinct
    rows per second, pulled and pushed."""
    return {"pull_ids_per_s": sum(r["ids"] / r["pull_s"] for r in results),
            "push_ids_per_s": sum(r["ids"] / r["push_s"] for r in results),
            "pull_rows_per_s": sum(r["distinct"] / r["pull_s"] for r in results),
            "push_rows_per_s": sum(r["distinct"] / r["push_s"] for r in results)}


def rows_lines(r):
    """The table cases' report lines of a record with a row check
    (blkps_rows.py --check) and rows()'s rates."""
    return [f"- Rows checked against the learners' summed gradients: {r['rows_checked']:,} touched rows and "
            f"{r['untouched_checked']:,} untouched, all equal",
            f"- All learners together: pull {r['pull_ids_per_s']:,.0f} ids/s ({r['pull_rows_per_s']:,.0f} "
            f"distinct rows/s), push {r['push_ids_per_s']:,.0f} ids/s ({r['push_rows_per_s']:,.0f} rows/s)"]


def phase_alignment(spans):
    """Of the time the learners spent in their phases while another learner
    was in one too, the share in which both were in the same phase (both
    pushing or both pulling). spans: (learner, "push"|"pull", start, end) in
    wall-clock seconds. 1.0: the learners moved in step, so a push had every
    link's both directions to itself (each host's uplink sends its learner's
    push, its downlink takes its shard's pushes); lower: a learner pushed while
    another pulled, and a host's link carried both in one direction while
    the other direction idled (doc/data-path.md "Phases at link rate")."""
    same = other = 0.0
    for k, phase, start, end in spans:
        for k2, phase2, start2, end2 in spans:
            overlap = min(end, end2) - max(start, start2)
            if k2 != k and overlap > 0:
                if phase2 == phase:
                    same += overlap
                else:
                    other += overlap
    return same / (same + other) if same + other > 0 else 1.0
