"""DIR/cluster.md and DIR/cluster.png from the records of bench/cluster/run.py.

Ratios are taken between systems measured in the same run on the same
cluster shape: "vs MPI" = blkps time / MPI float32 time (< 1: blkps is
faster); "wire / ideal" = bytes a host sent per exchange / (2(N-1)/N x the
float32 model), the bytes of a ring all-reduce and of a co-located parameter
server per host and direction.
"""
import json
import os
import sys


def ideal_bytes(hosts, params):
    return 2 * (hosts - 1) / hosts * 4 * params


def _system(r):
    """The system's name, with its drop ratio where it drops gradients."""
    return r["system"] + (f", drop {r['drop_ratio']:g}" if r.get("drop_ratio") else "")


def _label(r):
    return f"{_system(r)} {r['dtype']}" + ("" if r["placement"] == "co-located" or r["system"] in ("mpi", "ddp")
                                           else f" ({r['placement']})")


def measured(records):
    """The records of cases that ran (a failed case's record has "failed")."""
    return [r for r in records if "failed" not in r]


def _peer_ms(records, r, system):
    for p in records:
        if (p["system"], p["dtype"], p["hosts"], p["params"]) == (system, "float32", r["hosts"], r["params"]):
            return p["ms_per_exchange"]
    return None


def write(out, records, trainings, run):
    records = measured(records)
    for r in records + trainings:
        r.setdefault("drop_ratio", 0.0)  # runs before gradient dropping was measured
    lines = ["# blkps on a cluster: time per model exchange", ""]
    if run["quick"]:
        lines += ["**A quick run (`--quick`): fewer exchanges and systems; functional figures, not the "
                  "headline.**", ""]
    shaping = records[0]["shaping"] if records else "none"
    feed = run["feed_gbit_s"]
    feed_text = (f"One unshaped TCP stream between two hosts moves {feed:.1f} Gbit/s on this machine (iperf3), "
                 "the most the CPU feeds" if feed else "No iperf3: what the CPU feeds was not measured")
    lines += [f"Hosts are network namespaces on one bridge; links: {shaping}. {feed_text}; load average "
              f"{run['load']:.1f} at the end of the run (other work on the machine disturbs the figures).",
              "", "An exchange: blkps = one push of a gradient for the whole model + one pull of the "
              "whole model per learner (blkps-async-engine: the push and the pull of the next weights at once, "
              "blkps.Engine's double buffering; it pulls ahead of its steps, so its wire bytes per exchange may be "
              "off by one pull in the warm-up and timed exchanges; drop: the engine pushes only the largest runs of the gradient, "
              "keeping the rest as its residual; -torch: one step of blkps.torch's DistributedOptimizer, which pushes and "
              "pulls its own buckets, -torch-pipelined with its one-step pipeline); mpi = one MPI_Allreduce (ring); ddp = one DDP backward (gloo all-reduce). "
              "Median over hosts and timed exchanges. Wire bytes: the kernel's counters of each host's link, "
              "per exchange, mean over learner hosts (sent). CPU: user + system seconds of one learner process "
              "(rank) per timed exchange, and of one host's tgtd per learner exchange (warm-up included); where "
              "they approach the time per exchange, the CPU, not the link, is the limit.", ""]
    for params in sorted({r["params"] for r in records}):
        for hosts in sorted({r["hosts"] for r in records}):
            rows = [r for r in records if r["params"] == params and r["hosts"] == hosts]
            if not rows:
                continue
            ideal = ideal_bytes(hosts, params)
            lines += [f"## {params / 1e6:.0f}M parameters, {hosts} hosts, {run['link']} links", "",
                      *_shape_table(records, rows, ideal), "",
                      *[f"{_label(r)}: a learner opened {r['late_start_s']:.1f} s after the common start, so its "
                        "opening's traffic is in the wire bytes." for r in rows if r.get("late_start_s")],
                      f"Ideal (2(N-1)/N x the float32 model): {ideal / 1e6:.1f} MB per host and direction; "
                      f"at {run['link']} that is {ideal * 8 / _bits(run['link']) * 1e3:.0f} ms.", ""]
    lines += _goals(records, trainings)
    if trainings:
        t0 = trainings[0]
        lines += [f"## Training: time to loss {t0['target_loss']}, {t0['hosts']} hosts, {run['link']} links", "",
                  f"bench/train_synthetic.py (softmax regression, {t0['params'] / 1e6:g}M parameters, batch 32 per "
                  f"learner, SGD step 50), {t0['iterations']} iterations per learner, one learner per host. "
                  "allreduce-gloo: the learners sum their gradients with gloo all_reduce (DDP's per-step exchange) "
                  "and each applies them to its own copy. -engine: the learner uses blkps.Engine (pull and push overlap "
                  "compute); -bf16: the shards' LUNs are bfloat16 (16-bit wire); -drop: blkps.Engine with gradient "
                  f"dropping{_drop_ratio(trainings)}. Straggler: the last host's learner sleeps as long as each "
                  "iteration took (half speed). Time to target: when the mean loss of the learners' last "
                  f"{5 * t0['hosts']} iterations first reaches the target.", "",
                  "| system | straggler | s to target | vs allreduce | s in all | final loss |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in trainings:
            peer = next((p["seconds_to_target"] for p in trainings
                         if p["system"] == "allreduce-gloo" and p["straggler"] == r["straggler"]), None)
            t = r["seconds_to_target"]
            lines.append(f"| {r['system']} | {'yes' if r['straggler'] else 'no'} | "
                         f"{'not reached' if t is None else f'{t:.1f}'} | "
                         f"{f'{t / peer:.2f}' if t and peer else ''} | {r['seconds']:.1f} | {r['final_loss']:.2f} |")
        lines.append("")
    if run["failures"]:
        lines += ["## Failed cases", ""] + [f"- {f}" for f in run["failures"]] + [""]
    lines += [f"Run time: {run['seconds']:.0f} s. Raw per-process results: raw/.", ""]
    with open(os.path.join(out, "cluster.md"), "w") as f:
        f.write("\n".join(lines))
    _plot(out, records, run)


def _shape_table(records, rows, ideal):
    """The markdown table of `rows` (one cluster shape), each against the
    peers' float32 times among `records`."""
    lines = ["| system | placement | wire dtype | ms / exchange | vs MPI f32 | vs DDP f32 | "
             "MB sent / host | wire / ideal | CPU ms / exchange: learner · tgtd |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mpi, ddp = _peer_ms(records, r, "mpi"), _peer_ms(records, r, "ddp")
        ms = r["ms_per_exchange"]
        cpu = r.get("tgtd_cpu_ms_per_exchange")
        sent = r["wire_bytes_per_host"]
        # The engine pulls ahead of its steps: its bytes per exchange are off by up to a pull.
        wire = f"~{sent / 1e6:.0f} | " if r["system"].endswith("-engine") else f"{sent / 1e6:.1f} | {sent / ideal:.2f}"
        lines.append(f"| {_system(r)} | {r['placement']} | {r['dtype']} | {ms:.0f} | "
                     f"{f'{ms / mpi:.2f}' if mpi else ''} | {f'{ms / ddp:.2f}' if ddp else ''} | {wire} | "
                     f"{_ms(r.get('cpu_ms_per_exchange'))}{'' if cpu is None else f' · {cpu:.0f}'} |")
    return lines


def headline(out):
    """doc/performance.md's cluster headline from a run's DIR/cluster.json and
    DIR/cluster-training.json: the table of the largest model at the most
    hosts, and the goals."""
    with open(os.path.join(out, "cluster.json")) as f:
        records = measured(json.load(f))
    with open(os.path.join(out, "cluster-training.json")) as f:
        trainings = json.load(f)
    for r in records + trainings:
        r.setdefault("drop_ratio", 0.0)
    params, hosts = max(r["params"] for r in records), max(r["hosts"] for r in records)
    rows = [r for r in records if r["params"] == params and r["hosts"] == hosts]
    goals = _goals(records, trainings)
    return "\n".join(_shape_table(records, rows, ideal_bytes(hosts, params)) + [""] + goals[2:])


def _ms(value):
    """A CPU figure, or '?' where the run did not record it."""
    return "?" if value is None else f"{value:.0f}"


def _find(rows, **match):
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _goals(records, trainings):
    """Issue 14's goals, checked against the largest model at the most
    hosts measured; a missed goal names where the time went."""
    if not records:
        return []
    params, hosts = max(r["params"] for r in records), max(r["hosts"] for r in records)
    rows = [r for r in records if r["params"] == params and r["hosts"] == hosts]
    blkps = _find(rows, system="blkps-async", placement="co-located", dtype="float32", drop_ratio=0.0)
    blkps16 = _find(rows, system="blkps-async", placement="co-located", dtype="bfloat16", drop_ratio=0.0)
    dropping = next((r for r in rows if r["system"] == "blkps-async" and r["drop_ratio"]), None)
    engine = _find(rows, system="blkps-async-engine", placement="co-located", dtype="float32", drop_ratio=0.0)
    mpi, ddp = _find(rows, system="mpi", dtype="float32"), _find(rows, system="ddp", dtype="float32")
    ddp16 = _find(rows, system="ddp", dtype="float16")
    checks = [("blkps float32 / MPI float32", blkps, mpi, 1.0), ("blkps float32 / DDP float32", blkps, ddp, 1.0),
              ("blkps bfloat16 / MPI float32", blkps16, mpi, 0.6), ("blkps bfloat16 / DDP fp16", blkps16, ddp16, 1.0)]
    if engine:  # not one of the goals: the same goal, exchanging as the engine trains
        checks.append(("blkps float32 with the engine (push and next pull at once) / DDP float32", engine, ddp, 1.0))
    exchange = _find(rows, system="blkps-async-exchange", placement="co-located", dtype="float32")
    if exchange:  # issue 24 item 5's goal, with each request's pull following its push
        checks.append(("blkps float32 pipelined exchange (Model.exchange) / MPI float32", exchange, mpi, 1.0))
    lines = [f"## Goals ({params / 1e6:.0f}M parameters, {hosts} hosts, co-located)", "",
             "| goal | measured | |", "|---|---:|---|"]
    for what, ours, peer, limit in checks:
        if ours and peer:
            ratio = ours["ms_per_exchange"] / peer["ms_per_exchange"]
            lines.append(f"| {what} <= {limit} | {ratio:.2f} | {'met' if ratio <= limit else 'missed'} |")
        else:
            lines.append(f"| {what} <= {limit} | | not measured in this run |")
    if blkps:
        wire = blkps["wire_bytes_per_host"] / ideal_bytes(hosts, params)
        lines.append(f"| blkps float32 wire bytes / 2(N-1)/N model, within 5% | {wire:.3f} | "
                     f"{'met' if abs(wire - 1) <= 0.05 else 'missed'} |")
    peer = _find(trainings, system="allreduce-gloo", straggler=True)
    for ours in trainings:
        if (ours["system"].startswith("blkps") and ours["straggler"] and peer and ours["seconds_to_target"]
                and peer["seconds_to_target"]):
            ratio = ours["seconds_to_target"] / peer["seconds_to_target"]
            lines.append(f"| {ours['system']} time to target with a straggler / all-reduce's <= 0.7 | {ratio:.2f} | "
                         f"{'met' if ratio <= 0.7 else 'missed'} |")
    if blkps:
        link_ms = ideal_bytes(hosts, params) * 8 / _bits(blkps["link"]) * 1e3
        lines += ["", f"Where blkps's time goes: {blkps['ms_per_exchange']:.0f} ms per exchange against "
                  f"{link_ms:.0f} ms for its bytes at the link rate; per exchange a learner used "
                  f"{_ms(blkps.get('cpu_ms_per_exchange'))} ms of CPU and each host's tgtd "
                  f"{blkps.get('tgtd_cpu_ms_per_exchange', 0):.0f} ms (and a host's learner and tgtd share the "
                  f"machine's 2 cores with every other host){_phases(blkps)}."]
    if exchange:
        lines += ["", f"The pipelined exchange (async): {exchange['ms_per_exchange']:.0f} ms per exchange"
                  f"{_phases(exchange)}; a host's link sent {exchange['wire_bytes_per_host'] / 1e6:.1f} MB and "
                  f"received {exchange['wire_rx_bytes_per_host'] / 1e6:.1f} MB per exchange."]
    for torch in (r for r in rows if "-torch" in r["system"]):
        lines += ["", f"blkps.torch's own buckets ({_system(torch)}: a DistributedOptimizer step whose backward "
                  f"costs next to nothing): {torch['ms_per_exchange']:.0f} ms per step{_phases(torch)}; per step "
                  f"a learner used {_ms(torch.get('cpu_ms_per_exchange'))} ms of CPU and each host's tgtd "
                  f"{torch.get('tgtd_cpu_ms_per_exchange', 0):.0f} ms."]
    if dropping:
        lines += ["", f"Gradient dropping (ratio {dropping['drop_ratio']:g}, async; the engine pushes the largest "
                  f"runs and pulls the whole model): {dropping['ms_per_exchange']:.0f} ms per exchange"
                  f"{_phases(dropping)}; a host's link sent {dropping['wire_bytes_per_host'] / 1e6:.1f} MB and "
                  f"received {dropping['wire_rx_bytes_per_host'] / 1e6:.1f} MB per exchange"
                  + (f" (float32 without dropping: {blkps['wire_bytes_per_host'] / 1e6:.1f} and "
                     f"{blkps['wire_rx_bytes_per_host'] / 1e6:.1f} MB)" if blkps else "") + "."]
    return lines + [""]


def _drop_ratio(rows):
    """' (ratio R)' of the first row that drops gradients, or ''."""
    ratio = next((r["drop_ratio"] for r in rows if r.get("drop_ratio")), None)
    return f" (ratio {ratio:g})" if ratio else ""


def _phases(r):
    """The push's and the pull's median ms of an exchange, as a clause, where the run has them."""
    share = phase_link_share(r)
    if unphased(r["system"]) and share:
        how = "pipelined" if r["system"].endswith("-exchange") else "not timed apart"
        return (f"; push and pull {how}, each direction of a host's link carried its payload at "
                f"{100 * share[0]:.0f}% of the link over the exchange")
    if "ms_per_push" not in r:
        return ""
    text = f"; of an exchange, the push took {r['ms_per_push']:.0f} ms and the pull {r['ms_per_pull']:.0f} ms (medians)"
    if share:
        text += f", {100 * share[0]:.0f}% and {100 * share[1]:.0f}% of the link"
    if "phase_alignment" in r:
        text += (f"; the learners were in the same phase {100 * r['phase_alignment']:.0f}% of the time they "
                 "overlapped")
    return text


def unphased(system):
    """Whether a blkps system's learner times its exchanges whole, not its
    push and pull apart: a pipelined exchange or a blkps.torch step."""
    return system.endswith("-exchange") or "-torch" in system


def phase_link_share(r):
    """(push, pull): the share of a host's link rate at which a learner's
    median push and pull moved its payload over the link ((H-1)/H of the
    model co-located, all of it from dedicated servers), or None where a
    phase moves less than the whole model (dropping) or overlaps the other
    (the engine). Payload only: with 1500-byte frames TCP's and Ethernet's
    headers take 4.4% of the link, so 0.956 is the ceiling.
    A pipelined exchange (-exchange) and a blkps.torch step (-torch) have
    no phases timed apart (unphased): each direction of a co-located host's
    link carries both payloads (its push out and others' pushes in; its
    shard's weights out and its pull in) within the median exchange,
    whatever their order: the same share both ways."""
    if r.get("drop_ratio") or r["system"].endswith("-engine"):
        return None
    model = r["params"] * (4 if r["dtype"] == "float32" else 2)
    payload = model if r.get("servers") else model * (r["hosts"] - 1) / r["hosts"]
    seconds = payload * 8 / _bits(r["link"])
    if unphased(r["system"]):
        both = (1 if r.get("servers") else 2) * seconds * 1e3 / r["ms_per_exchange"]
        return both, both
    if "ms_per_push" not in r:
        return None
    return seconds * 1e3 / r["ms_per_push"], seconds * 1e3 / r["ms_per_pull"]


def _bits(link):
    from net import link_bits_per_s
    return link_bits_per_s(link)


def _plot(out, records, run):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("cluster: no matplotlib: no cluster.png (scripts/setup.sh --bench installs it)")
        return
    shapes = sorted({(r["params"], r["hosts"]) for r in records})
    if not shapes:
        return
    labels = list(dict.fromkeys(_label(r) for r in records))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(shapes) * len(labels) / 3), 4))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        xs, ys = [], []
        for x, (params, hosts) in enumerate(shapes):
            for r in records:
                if (r["params"], r["hosts"]) == (params, hosts) and _label(r) == label:
                    xs.append(x + i * width)
                    ys.append(r["ms_per_exchange"])
        ax.bar(xs, ys, width, label=label)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))])
    ax.set_xticklabels([f"{p / 1e6:.0f}M params, {h} hosts" for p, h in shapes])
    ax.set_ylabel("ms per model exchange (lower is better)")
    ax.set_title(f"blkps vs MPI and DDP, {run['link']} links" + (" (quick run)" if run["quick"] else ""))
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "cluster.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--headline":
        sys.exit("usage: report.py --headline DIR  (prints doc/performance.md's cluster headline from DIR/cluster.json)")
    print(headline(sys.argv[2]))
