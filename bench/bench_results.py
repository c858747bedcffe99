"""What the Python benches share (bench/replica_cost.py, bench/catch_up.py):
this checkout's blkps package over this build's library, and writing a
run's results as NAME.json (the numbers) and NAME.md (the table README and
doc/ take through bench/tables.py)."""
import json
import os
import sys

top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_this_checkout(build):
    """Makes `import blkps` (and learner/examples' torch_fashion_job, whose
    start_server and stop_server run private targets) find this checkout's
    code over `build`'s libblkps."""
    os.environ.setdefault("BLKPS_LIB", os.path.join(build, "learner", "libblkps.so"))
    sys.path.insert(0, os.path.join(top, "learner", "python"))
    sys.path.insert(0, os.path.join(top, "learner", "examples"))


def write_results(out, name, numbers, lines):
    """Writes out/NAME.json (`numbers`) and out/NAME.md (`lines`), and prints
    the table."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(numbers, f, indent=2)
    with open(os.path.join(out, name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def cpu_seconds(pid):
    """Process `pid`'s user and system CPU time so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
