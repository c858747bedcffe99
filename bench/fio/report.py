#!/usr/bin/python3
"""Results of the fio sweep (bench/fio/sweep.sh).

  report.py result FIO_JSON RW      one run: prints "MBps IOPS LAT_US" (or exits 1
                                    with fio's error on stderr)
  report.py summary FIO_CSV OUTDIR  OUTDIR/fio.md (MB/s and the ratio to tgt's null
                                    store measured in the same run) and one PNG per
                                    link and path, in the shape of the iRDMA paper's
                                    Fig. 5: MB/s against request size (log2 x),
                                    one line per store, panels read/write x sync/async.

The CSV has one row per fio run: link,store,path,rw,bs,iodepth,mbps,iops,lat_us
(bs in bytes; mbps in 10^6 bytes/s; lat_us the mean completion latency; mbps
empty when the run failed).
"""
import csv
import json
import os
import sys

NULL = "null"
STORE_ORDER = ["blkps-sgd", "blkps-adam", "rdwr", NULL]


def result(path, rw):
    with open(path) as f:
        text = f.read()
    # fio may print warnings before the JSON object.
    start = text.find("{")
    if start < 0:
        sys.exit(f"report: no JSON in {path}")
    job = json.loads(text[start:])["jobs"][0]
    side = job[rw]
    if job.get("error"):
        sys.exit(f"report: fio job error {job['error']}")
    if side["io_bytes"] == 0:
        sys.exit("report: fio moved no bytes")
    print(f"{side['bw_bytes'] / 1e6:.1f} {side['iops']:.0f} {side['lat_ns']['mean'] / 1e3:.1f}")


def size_label(n):
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["bs"] = int(r["bs"])
        r["iodepth"] = int(r["iodepth"])
        r["mbps"] = float(r["mbps"]) if r["mbps"] else None
    return rows


def ordered(values, order):
    return [v for v in order if v in values] + sorted(v for v in values if v not in order)


def table(rows):
    """Markdown: one line per (link, path, rw, bs, qd), MB/s (ratio to null) per store."""
    stores = ordered({r["store"] for r in rows}, STORE_ORDER)
    by_key = {}
    for r in rows:
        by_key.setdefault((r["link"], r["path"], r["rw"], r["bs"], r["iodepth"]), {})[r["store"]] = r["mbps"]
    out = ["| link | path | rw | bs | qd | " + " | ".join(stores) + " |",
           "|---|---|---|---|---|" + "---|" * len(stores)]
    links = list(dict.fromkeys(r["link"] for r in rows))  # in the order they ran
    paths = list(dict.fromkeys(r["path"] for r in rows))
    for key in sorted(by_key, key=lambda k: (links.index(k[0]), paths.index(k[1]), k[2], k[4], k[3])):
        cells = by_key[key]
        ceiling = cells.get(NULL)
        line = []
        for s in stores:
            v = cells.get(s, "absent")
            if v == "absent":
                line.append("")
            elif v is None:
                line.append("failed")
            elif ceiling and s != NULL:
                line.append(f"{v:.0f} ({v / ceiling:.2f})")
            else:
                line.append(f"{v:.0f}")
        link, path, rw, bs, qd = key
        out.append(f"| {link} | {path} | {rw} | {size_label(bs)} | {qd} | " + " | ".join(line) + " |")
    return out


def plots(rows, outdir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: python3-matplotlib not installed: no plots (scripts/setup.sh --bench)", file=sys.stderr)
        return []
    made = []
    for link, path in sorted({(r["link"], r["path"]) for r in rows}):
        sel = [r for r in rows if r["link"] == link and r["path"] == path and r["mbps"] is not None]
        if len({r["bs"] for r in sel}) < 2:
            continue  # one request size (the multi-host run): the table says it all
        depths = sorted({r["iodepth"] for r in sel})
        async_depths = [d for d in depths if d > 1]
        fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
        for col, (mode, qds) in enumerate((("sync (qd 1)", [1]), ("async (qd " + ", ".join(map(str, async_depths)) + ")", async_depths))):
            for row, rw in enumerate(("read", "write")):
                ax = axes[row][col]
                for k, store in enumerate(ordered({r["store"] for r in sel}, STORE_ORDER)):
                    for i, qd in enumerate(qds):
                        pts = sorted((r["bs"], r["mbps"]) for r in sel
                                     if r["store"] == store and r["rw"] == rw and r["iodepth"] == qd)
                        if not pts:
                            continue
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                                color=f"C{STORE_ORDER.index(store) if store in STORE_ORDER else k}", linestyle="-" if i == 0 else "--",
                                label=store if len(qds) == 1 else f"{store} qd{qd}")
                ax.set_xscale("log", base=2)
                ticks = sorted({r["bs"] for r in sel})
                ax.set_xticks(ticks)
                ax.set_xticklabels([size_label(t) for t in ticks])
                ax.set_title(f"{rw}, {mode}")
                ax.set_ylabel("MB/s")
                ax.grid(True, alpha=0.3)
                if row == 1:
                    ax.set_xlabel("request size")
                if ax.get_lines():
                    ax.legend(fontsize=7)
                else:
                    ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
        fig.suptitle(f"fio throughput: {path}, {link}")
        fig.tight_layout()
        name = f"fio-{link}-{path}.png".replace(" ", "_").replace("/", "_")
        fig.savefig(os.path.join(outdir, name), dpi=90)
        plt.close(fig)
        made.append(name)
    return made


def summary(csv_path, outdir):
    rows = load(csv_path)
    if not rows:
        sys.exit(f"report: {csv_path} has no runs")
    failed = sum(r["mbps"] is None for r in rows)
    images = plots(rows, outdir)
    md = ["# fio sweep", "",
          "MB/s (10^6 bytes/s) per store; in parentheses the ratio to tgt's `null` store "
          "(same tgtd, link, path, request size and queue depth, same run). "
          "Rows: link (loopback, or a veth pair between network namespaces, with its "
          "tc shaping), path (`libiscsi`: fio's libiscsi engine; `fuse`: libaio with "
          "direct=1 on the blkps-mount file), rw, request size, queue depth.", ""]
    md += table(rows)
    if failed:
        md += ["", f"{failed} of {len(rows)} runs failed (see the sweep's log)."]
    md += [""] + [f"![{i}]({i})" for i in images]
    with open(os.path.join(outdir, "fio.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def main(argv):
    if len(argv) == 4 and argv[1] == "result":
        result(argv[2], argv[3])
    elif len(argv) == 4 and argv[1] == "summary":
        summary(argv[2], argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
