#!/usr/bin/env bash
# `blkps target start --tgtd 2`: one model served by two co-located tgtds
# (doc/data-path.md "Scale-out"), end to end against real tgtds on loopback.
#
#   scaleout_test.sh <repo> <build dir> learners
#     `target show` names layout files and two live tgtds; 2 digits learners
#     train in bsp through the URLs it prints (>= 0.90 held out); `blkps
#     status --dir` shows both shards and `blkps set --dir` reaches both; a
#     sync checkpoints every shard; `target stop` leaves no tgtd; a start
#     with --tgtd auto from the checkpoint serves the same weights through
#     2 tgtds again, and --tgtd 1 is refused for that checkpoint.
#   scaleout_test.sh <repo> <build dir> torch-mount
#     blkps.torch given only the learner layout (no BLKPS_CONTROL) finds the
#     job's control: it reads the mode, broadcast_parameters puts rank 0's
#     values on both shards (pulled back exactly), and steps train; then
#     `blkps mount --dir` gives a slot file whose bytes are the model's and
#     whose pwrite is a gradient applied once (sgd lr=1, integers);
#     `target stop` leaves no tgtd.
#   scaleout_test.sh <repo> <build dir> checkpoint-full
#     The checkpoint folder is a small tmpfs that holds one generation and
#     half of the next: the sync of the second fails for the learner and
#     status says so; stop's final checkpoint fails too, and stop says so
#     and stops; start loads the first generation on both shards (not
#     zeros, not half of the second).
#   scaleout_test.sh <repo> <build dir> checkpoint-swapped
#     An older copy of shard 1's part swapped in: start is refused in one
#     line naming the file and what differs, and no tgtd is left; stray
#     .tmp files do not count; --fresh starts a new job over the set.
#   scaleout_test.sh <repo> <build dir> stop-keeps-pushes
#     With 2 tgtds and with 1: push, sync, push; `target stop` writes a
#     final generation and says how long it took, and the restart serves
#     both pushes; with --no-checkpoint it serves the synced one only. A
#     push, then the --owner-pid process exits: the watchdogs write the
#     final generation, and the restart serves the push.
#   scaleout_test.sh <repo> <build dir> kill-restart-async
#     2 async learners through 2 tgtds (pushing 1 and 3 a round, learner 1
#     syncing every 4 rounds); kill -9 of shard 1's tgtd mid-training and
#     `target restart`: shard 1 comes back on its port from the committed
#     generation, shard 0 runs on, the learners go on through the same
#     layouts, and in the end every parameter of shard 0 is the pushed sums
#     and every one of shard 1 the pushed sums minus the pushes libblkps
#     told each learner were lost there. Meanwhile `blkps status --dir`
#     shows shard 0 and names shard 1 as unreachable.
#   scaleout_test.sh <repo> <build dir> kill-restart-bsp
#     2 bsp learners through 2 tgtds (pushing 1 and 3 a round, then waiting
#     for the test before their last sync; learner 1 syncs every 4 rounds
#     while learner 2 has already pushed the next round's gradient to shard
#     0 but not to shard 1); with both learners paused after round
#     BLKPS_KILL_AT_ROUND's pull (default 10) and stopped, kill -9 of shard
#     BLKPS_KILL_SHARD's tgtd (default 1) and `target restart`: both shards
#     come back on their ports from one generation whose parts are at one
#     round with every learner at it; the learners go on and finish, and on
#     each shard the weights are the rounds' averages of the gradients it
#     holds, and each learner's pushes minus those its shards hold are the
#     pushes libblkps told it were lost (bench/kill_restart_bsp_probe.sh
#     moves the kill).
#   scaleout_test.sh <repo> <build dir> kill-restart-ssp
#     The same in ssp:2, both learners syncing every 4 rounds (learner 2's
#     fsync first, waiting on the shards for learner 1's push), learner 1
#     paused after round BLKPS_KILL_AT_ROUND and learner 2 one round later:
#     both shards come back from one generation with every learner at one
#     iteration; in the end each shard's weights are the sums of the pushes
#     it holds, and each learner's pushes minus those its shards hold are
#     the pushes libblkps told it were lost.
set -euo pipefail
top=$1 build=$2 what=$3
py=/usr/bin/python3
blkps="$top/scripts/blkps"
plugin="$build/target-plugin/bs_blkps.so"
export BLKPS_LIB="$build/learner/libblkps.so" PYTHONPATH="$top/learner/python"
state=$(mktemp -d /tmp/blkps-scaleout-test-XXXXXX)
mnt="$state/mnt" mount_pid="" owner_pid="" learner_pids=()
cleanup() {
  local pid
  for pid in "${learner_pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done  # stopped ones too
  if [ -n "$owner_pid" ]; then kill "$owner_pid" 2>/dev/null || true; fi
  if [ -n "$mount_pid" ] && kill -0 "$mount_pid" 2>/dev/null; then
    kill -TERM "$mount_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$mount_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  if grep -qs " $mnt " /proc/mounts; then fusermount3 -u "$mnt" || true; fi
  "$blkps" target stop --dir "$state/ps" --no-checkpoint
  if grep -qs " $state/ck " /proc/mounts; then umount "$state/ck" || true; fi
  rm -rf "$state"
}
trap cleanup EXIT
fail() { echo "scaleout_test: $*" >&2; exit 1; }

# Fails unless no process of <pids> runs (zombies count as gone).
no_tgtd_left() {
  local pid
  for pid in "$@"; do
    if [ -e "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
      # What it is, for a failure's reader: a tgtd that outlived its stop, or another process by that id.
      fail "tgtd $pid still runs after target stop ($(grep '^State:' "/proc/$pid/status" 2>/dev/null);" \
        "command: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null))"
    fi
  done
}

# Checkpoint sets: a model of 2 stripe units, one per tgtd, that adds
# what is pushed (rule=sum), checkpointed to $state/ck/model.ckpt.
ck_params=524288  # 2 MiB: 1 MiB on each tgtd
ck_start() {
  "$blkps" target start --dir "$state/ps" --tgtd "${ck_tgtds:-2}" --plugin "$plugin" --owner-pid "${ck_owner:-$$}" "$@" \
    --bsopts "params=$ck_params;block=64K;rule=sum;checkpoint=$state/ck/model.ckpt"
}
# Pushes ones to every parameter, then syncs; "ok" or "fails" says what the
# sync must do, "none" skips it.
ck_push_sync() {
  "$py" - "$("$blkps" target show --dir "$state/ps" --get URL)" "$ck_params" "$1" <<'PY'
import sys
import numpy as np
import blkps
url, n, expect = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with blkps.Model(url) as m:
    m.push(0, np.ones(n, dtype=np.float32))
    if expect == "none":
        sys.exit(0)
    try:
        m.sync()
    except OSError as e:
        if expect == "ok":
            sys.exit(f"sync failed: {e}")
        print(f"sync failed as expected: {e}")
        sys.exit(0)
if expect != "ok":
    sys.exit("sync succeeded")
PY
}
# Fails unless every weight on both tgtds (both halves of the model) is $1.
ck_weights_are() {
  "$py" - "$("$blkps" target show --dir "$state/ps" --get URL)" "$ck_params" "$1" <<'PY' || fail "weights after restart"
import sys
import numpy as np
import blkps
url, n, want = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with blkps.Model(url) as m:
    w = m.pull(0, n)
half = n // 2
for k, part in enumerate((w[:half], w[half:])):
    if not np.all(part == want):
        sys.exit(f"tgtd {k} serves {np.unique(part)[:4]}, expected {want}")
PY
}

# kill-restart-*: 2 learner LUNs on 2 tgtds adding what is pushed (rule=sum)
# in mode $1, checkpointed to $state/ck; ports gets each tgtd's port.
kill_restart_start() {
  mkdir -p "$state/ck"
  "$blkps" target start --dir "$state/ps" --tgtd 2 --plugin "$plugin" --owner-pid $$ --luns 2 \
    --bsopts "params=$ck_params;block=64K;rule=sum;mode=$1;checkpoint=$state/ck/model.ckpt" >/dev/null
  read -r -a ports < <("$blkps" target show --dir "$state/ps" --get CONTROL_URLS | sed 's|[^ ]*:\([0-9]*\)/[^ ]*|\1|g')
}
# Returns once both learners' progress files ($2, $3) say round $1 or later
# (polled, bounded).
both_past() {
  local _
  for _ in $(seq 600); do
    [ "$(cat "$2" 2>/dev/null || echo 0)" -ge "$1" ] && [ "$(cat "$3" 2>/dev/null || echo 0)" -ge "$1" ] && return
    sleep 0.1
  done
}

case "$what" in
  kill-restart-bsp | kill-restart-ssp)
    mode=bsp
    if [ "$what" = kill-restart-ssp ]; then mode=ssp:2; fi
    kill_restart_start "$mode"
    rounds=24
    kill_at=${BLKPS_KILL_AT_ROUND:-10} kill_shard=${BLKPS_KILL_SHARD:-1}
    [ "$kill_at" -gt 4 ] || fail "BLKPS_KILL_AT_ROUND=$kill_at: the first generation is taken after round 4"
    mkdir -p "$state/marks"
    for learner in 1 2; do
      # bsp: both pause after round $kill_at; ssp: learner 1 there, learner
      # 2 one later.
      pause=$kill_at
      if [ "$mode" != bsp ]; then pause=$((kill_at + learner - 1)); fi
      "$py" "$top/tests/scaleout_round_learner.py" "layout:$state/ps/slot-$learner.layout" "$ck_params" "$learner" \
        "$rounds" "$state/marks" "$mode" "$pause" > "$state/lost-$learner" 2> "$state/learner-$learner.log" &
      learner_pids[learner]=$!
    done
    # Stop both learners once both have paused (polled, bounded), so that
    # the restarted job is seen before they go on.
    both_past 1 "$state/marks/paused-1" "$state/marks/paused-2"
    kill -STOP "${learner_pids[1]}" "${learner_pids[2]}"
    kill -9 "$(cat "$state/ps/shard-$kill_shard/tgtd.pid")"
    "$blkps" target restart --dir "$state/ps" > "$state/restarted" || fail "restart: $(cat "$state/restarted")"
    cat "$state/restarted"
    for k in 0 1; do
      grep -q "^restarted shard $k (.*) on port ${ports[$k]}: generation" "$state/restarted" ||
        fail "shard $k was not restarted on its port ${ports[$k]}"
    done
    # The generation loaded, copied while the learners are stopped (they
    # may commit newer ones and prune it once they go on).
    gen=$(sed -n 's/^restarted shard 0 .*: generation \([0-9]*\) of job .*/\1/p' "$state/restarted")
    mkdir -p "$state/loaded"
    cp "$state/ck/model.ckpt.shard-0.gen-$gen" "$state/ck/model.ckpt.shard-1.gen-$gen" "$state/loaded/"
    : > "$state/marks/restarted"  # the learners' meetings end (tests/scaleout_round_learner.py)
    kill -CONT "${learner_pids[1]}" "${learner_pids[2]}"
    : > "$state/marks/finish"
    # One generation, one round: in both parts every block has applied the
    # same R rounds (bsp) and holds nothing of the next, and every learner is
    # at R with nothing partial (the clocks section,
    # aggregator/learner_clocks.cc Save()).
    "$py" - "$mode" "$state/loaded/model.ckpt.shard-0.gen-$gen" "$state/loaded/model.ckpt.shard-1.gen-$gen" <<'PY' ||
import sys
import numpy as np
seen = []
for path in sys.argv[2:]:
    with open(path, "rb") as f:
        head = f.read(4096).decode("ascii", "replace").splitlines()
    offset, length = next((int(w[1]), int(w[2])) for w in (line.split() for line in head)
                          if len(w) == 4 and w[0] == "section" and w[3] == "clocks")
    words = np.fromfile(path, dtype="<u8", count=length // 8, offset=offset)
    blocks, learners = int(words[0]), int(words[1])
    per_block = words[2:2 + 3 * blocks].reshape(blocks, 3)  # round, contributors, version
    clocks = words[2 + 3 * blocks:].reshape(learners, 1 + 2 * blocks)[:, 1:].reshape(learners, blocks, 2)
    rounds = set(per_block[:, 0]) if sys.argv[1] == "bsp" else set()  # ssp blocks have no rounds
    seen.append((path, rounds | set(clocks[:, :, 0].ravel()),
                 int(per_block[:, 1].sum() + clocks[:, :, 1].sum())))
rounds = set().union(*(r for _, r, _ in seen))
if len(rounds) != 1 or any(pending for _, _, pending in seen):
    sys.exit(f"the generation loaded is not one job at one round: {seen}")
print(f"restarted at round {rounds.pop()}")
PY
      fail "after the restart"
    wait "${learner_pids[1]}" || fail "learner 1: $(tail -3 "$state/learner-1.log")"
    wait "${learner_pids[2]}" || fail "learner 2: $(tail -3 "$state/learner-2.log")"
    learner_pids=()  # ended: their ids are no longer ours
    "$blkps" status --dir "$state/ps" --json > "$state/final.json"
    "$py" - "$("$blkps" target show --dir "$state/ps" --get URL)" "$ck_params" "$rounds" \
      "$(cat "$state/lost-1")" "$(cat "$state/lost-2")" "$state/final.json" "$mode" <<'PY' || fail "after the restart"
import json, sys
import numpy as np
import blkps
url, n, rounds, final, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[6], sys.argv[7]
(lost1, made1), (lost2, made2) = (map(int, sys.argv[k].split()) for k in (4, 5))  # bytes lost, halves pushed
part = 4 * n // 2  # a push's bytes on one tgtd
with open(final) as f:
    shards = json.load(f)
with blkps.Model(url) as m:
    w = m.pull(0, n)
held = {1: 0, 2: 0}  # pushes the shards hold, per learner
for k, s in enumerate(shards):
    its = {l["lun"]: l["iteration"] for l in s["learners"]}
    a, b = sorted(its)  # learner 1's LUN, learner 2's
    deaths = [l["deaths"] for l in s["learners"]]
    if any(deaths):  # a round completed without a learner: the count below would not hold
        sys.exit(f"tgtd {k} declared a learner dead (deaths {deaths}): the learners waited for each other")
    g1, g2 = its[a], its[b]  # gradients held: the clocks (nobody died, nobody rejoined)
    held[1] += g1
    held[2] += g2
    # bsp: rounds with both, their average 2; the rounds after, one
    # learner's own. ssp: every push as it came.
    want = (2.0 * min(g1, g2) + 1.0 * max(g1 - g2, 0) + 3.0 * max(g2 - g1, 0) if mode == "bsp"
            else 1.0 * g1 + 3.0 * g2)
    chunk = w[k * n // 2:(k + 1) * n // 2]
    if not np.all(chunk == want):
        sys.exit(f"tgtd {k} serves {np.unique(chunk)[:4]}, expected {want} (clocks {g1}, {g2})")
for learner, lost, made in ((1, lost1, made1), (2, lost2, made2)):
    if lost != (made - held[learner]) * part:
        sys.exit(f"learner {learner} was told {lost} bytes lost; its shards lack "
                 f"{made - held[learner]} of its pushes of {part} bytes")
print(f"lost {lost1 // part} and {lost2 // part} pushes; clocks {held}")
PY
    ;;
  kill-restart-async)
    kill_restart_start async
    rounds=40 learner_pids=()
    for learner in 1 2; do
      "$py" - "layout:$state/ps/slot-$learner.layout" "$ck_params" "$learner" "$rounds" "$state/progress-$learner" \
        > "$state/lost-$learner" 2> "$state/learner-$learner.log" <<'PY' &
import sys
import numpy as np
import blkps
url, n, learner, rounds, progress = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
value = 1.0 if learner == 1 else 3.0
with blkps.Model(url) as m:
    for r in range(1, rounds + 1):
        m.push(0, np.full(n, value, dtype=np.float32))
        m.pull(0, n)
        if learner == 1 and r % 4 == 0:
            m.sync()  # a generation
        with open(progress, "w") as f:
            f.write(f"{r}\n")
    m.sync()  # then pushed_bytes_lost is complete
    print(m.pushed_bytes_lost)
PY
      learner_pids[learner]=$!
    done
    # Kill shard 1 once both learners are past round 10 (polled, bounded).
    both_past 10 "$state/progress-1" "$state/progress-2"
    kill -9 "$(cat "$state/ps/shard-1/tgtd.pid")"
    if "$blkps" status --dir "$state/ps" > "$state/status"; then fail "status of a job with a dead shard says 0"; fi
    grep -q "^job: shard 0 step [0-9]* generation [0-9]*, shard 1 unreachable; shard 1 not running" "$state/status" ||
      fail "status does not name the unreachable shard: $(tail -1 "$state/status")"
    "$blkps" target restart --dir "$state/ps" > "$state/restarted" || fail "restart: $(cat "$state/restarted")"
    cat "$state/restarted"
    grep -q "^restarted shard 1 (dead) on port ${ports[1]}: generation" "$state/restarted" ||
      fail "shard 1 was not restarted on its port ${ports[1]}"
    if grep -q "^restarted shard 0" "$state/restarted"; then fail "async: the live shard 0 was restarted"; fi
    wait "${learner_pids[1]}" || fail "learner 1: $(tail -3 "$state/learner-1.log")"
    wait "${learner_pids[2]}" || fail "learner 2: $(tail -3 "$state/learner-2.log")"
    learner_pids=()  # ended: their ids are no longer ours
    "$py" - "$("$blkps" target show --dir "$state/ps" --get URL)" "$ck_params" "$rounds" \
      "$(cat "$state/lost-1")" "$(cat "$state/lost-2")" <<'PY' || fail "after the restart"
import json, sys
import numpy as np
import blkps
url, n, rounds, lost1, lost2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
part = 4 * n // 2  # a push's bytes on one tgtd
if lost1 % part or lost2 % part:
    sys.exit(f"lost bytes {lost1}, {lost2} are not whole pushes of {part} bytes to one tgtd")
# Only shard 1 lost what it had not checkpointed; shard 0 kept every push.
wants = (1.0 * rounds + 3.0 * rounds, 1.0 * (rounds - lost1 // part) + 3.0 * (rounds - lost2 // part))
with blkps.Model(url) as m:
    w = m.pull(0, n)
for k, (chunk, want) in enumerate(zip((w[: n // 2], w[n // 2:]), wants)):
    if not np.all(chunk == want):
        sys.exit(f"tgtd {k} serves {np.unique(chunk)[:4]}, expected {want} (lost {lost1}, {lost2} bytes)")
print(f"lost {lost1 // part} and {lost2 // part} pushes on shard 1; weights {wants}")
PY
    ;;
  stop-keeps-pushes)
    mkdir -p "$state/ck"
    for ck_tgtds in 2 1; do
      rm -f "$state/ck/"*
      ck_start >/dev/null
      ck_push_sync ok
      ck_push_sync none  # acknowledged, not synced
      "$blkps" target stop --dir "$state/ps" > "$state/stopped"
      grep -Eq "^final checkpoint: generation 2 of job [0-9a-f]+ written by $ck_tgtds tgtd\(s\) in [0-9.]+ s$" \
        "$state/stopped" || fail "stop did not report its final checkpoint: $(cat "$state/stopped")"
      ck_start >/dev/null
      ck_weights_are 2
      ck_push_sync none
      "$blkps" target stop --dir "$state/ps" --no-checkpoint > "$state/stopped"
      [ ! -s "$state/stopped" ] || fail "--no-checkpoint wrote a checkpoint: $(cat "$state/stopped")"
      ck_start >/dev/null
      ck_weights_are 2
      "$blkps" target stop --dir "$state/ps" --no-checkpoint
    done
    # The --owner-pid watchdogs stop the same way when the owner exits.
    rm -f "$state/ck/"*
    ck_tgtds=2
    sleep 600 >/dev/null 2>&1 & ck_owner=$! owner_pid=$!
    ck_start >/dev/null
    read -r -a pids < <("$blkps" target show --dir "$state/ps" --get PIDS)
    ck_push_sync none
    kill "$ck_owner"
    owner_pid=""
    for _ in $(seq 300); do  # the watchdogs poll their owner every second
      [ ! -e "$state/ps/shard-0/target.env" ] && [ ! -e "$state/ps/shard-1/target.env" ] && break
      sleep 0.1
    done
    no_tgtd_left "${pids[@]}"
    "$blkps" target stop --dir "$state/ps" --no-checkpoint  # the job's own files
    ck_owner=$$
    ck_start >/dev/null
    ck_weights_are 1
    ;;
  checkpoint-full)
    mkdir -p "$state/ck"
    # A part is 1 MiB and a few KiB: generation 1 (2 parts) and one part of
    # generation 2 fit, the other part does not.
    mount -t tmpfs -o size=3400k tmpfs "$state/ck"
    ck_start >/dev/null
    ck_push_sync ok  # generation 1: every weight 1
    ck_push_sync fails  # generation 2: one part fails, the generation fails
    "$blkps" status --dir "$state/ps" > "$state/status"
    grep -q "checkpoint error: generation 2 failed" "$state/status" ||
      fail "status does not report the failed generation: $(cat "$state/status")"
    # One part of generation 2 may have fitted (then the shards' generations
    # differ) or neither (both parts were being written at once).
    grep -Eq "^job: shard 0 step 2 generation ([12]), shard 1 step 2 generation ([12]); the shards (agree|differ in generation)$" \
      "$state/status" || fail "status has no job line for the shards: $(tail -1 "$state/status")"
    if grep -q "generation 1, .* generation 2; the shards agree\|generation 2, .* generation 1; the shards agree" \
      "$state/status"; then fail "status does not flag the shards' generations: $(tail -1 "$state/status")"; fi
    # The final checkpoint fails too: stop says so, and stops all the same.
    if "$blkps" target stop --dir "$state/ps" 2> "$state/stopped"; then
      fail "stop did not report the failed final checkpoint"
    fi
    grep -q "the final checkpoint failed on shard .*; the target was stopped" "$state/stopped" ||
      fail "unexpected stop message: $(cat "$state/stopped")"
    [ ! -e "$state/ps/target.env" ] || fail "a stop whose final checkpoint failed left the target running"
    ck_start >/dev/null
    [ "$("$blkps" target show --dir "$state/ps" --get TGTD)" = 2 ] || fail "the restart did not serve 2 tgtds"
    ck_weights_are 1
    ;;
  checkpoint-swapped)
    mkdir -p "$state/ck"
    ck_start >/dev/null
    ck_push_sync ok  # generation 1: 1
    ck_push_sync ok  # generation 2: 2
    read -r -a pids < <("$blkps" target show --dir "$state/ps" --get PIDS)
    "$blkps" target stop --dir "$state/ps" --no-checkpoint
    : > "$state/ck/model.ckpt.shard-2.tmp"
    : > "$state/ck/model.ckpt.shard-0.gen-9.tmp"
    ck_start >/dev/null  # the stray files do not count
    [ "$("$blkps" target show --dir "$state/ps" --get TGTD)" = 2 ] || fail "stray .tmp files changed the tgtd count"
    ck_weights_are 2
    "$blkps" target stop --dir "$state/ps" --no-checkpoint
    cp "$state/ck/model.ckpt.shard-1.gen-1" "$state/ck/model.ckpt.shard-1.gen-2"
    if out=$(ck_start 2>&1); then fail "started from a set with an older part swapped in"; fi
    echo "$out"
    [ "$(echo "$out" | wc -l)" = 1 ] || fail "expected one line, got: $out"
    case "$out" in
      *"model.ckpt.shard-1.gen-2 does not belong to"*"mixed: it is generation 1"*"--fresh"*) ;;
      *) fail "the refusal does not name the file and the difference: $out" ;;
    esac
    [ ! -e "$state/ps/target.env" ] || fail "a refused start left target.env"
    no_tgtd_left "${pids[@]}"
    ck_start --fresh >/dev/null
    ck_weights_are 0
    ;;
  learners)
    train="$top/learner/examples/train_digits.py"
    params=$("$py" "$train" --params)
    start() {
      "$blkps" target start --dir "$state/ps" --plugin "$plugin" --owner-pid $$ --luns 2 "$@" \
        --bsopts "params=$params;block=4K;lr=0.2;init=normal:0.1;mode=bsp;checkpoint=$state/model.ckpt"
    }
    start --tgtd 2 > "$state/started"
    cat "$state/started"
    grep -q "^learner 2: layout:$state/ps/slot-2.layout$" "$state/started" || fail "no layout for slot 2 printed"
    read -r -a pids < <("$blkps" target show --dir "$state/ps" --get PIDS)
    [ "${#pids[@]}" = 2 ] || fail "expected 2 tgtd pids, got '${pids[*]}'"
    for pid in "${pids[@]}"; do kill -0 "$pid" || fail "tgtd $pid is not running"; done
    read -r slot1 slot2 < <("$blkps" target show --dir "$state/ps" --get URLS)
    "$py" "$train" --target "$slot1" --learner 0 --learners 2 --epochs 6 & a=$!
    "$py" "$train" --target "$slot2" --learner 1 --learners 2 --epochs 6 & b=$!
    wait $a
    wait $b
    "$py" "$train" --target "$slot1" --evaluate --min-accuracy 0.90
    "$blkps" status --dir "$state/ps" > "$state/status"
    [ "$(grep -c '^== shard' "$state/status")" = 2 ] || fail "status does not show both shards: $(cat "$state/status")"
    "$blkps" set lr=0.05 --dir "$state/ps"
    lrs=$("$blkps" status --dir "$state/ps" --json |
          "$py" -c 'import json, sys; print(" ".join(str(s["rule_params"]["lr"]) for s in json.load(sys.stdin)))')
    [ "$lrs" = "0.05 0.05" ] || fail "lr per tgtd after set: '$lrs', expected '0.05 0.05'"
    "$py" - "$slot1" "$params" "$state/before.f32" <<'PY'
import sys
import blkps
with blkps.Model(sys.argv[1]) as m:
    m.pull(0, int(sys.argv[2])).tofile(sys.argv[3])
    m.sync()  # fsync: every shard checkpoints its part
PY
    # bsp: generations are numbered by their round (doc/server.md "One round
    # on every shard").
    for k in 0 1; do ls "$state/model.ckpt.shard-$k.gen-"* >/dev/null || fail "no checkpoint of shard $k"; done
    [ -s "$state/model.ckpt.manifest" ] || fail "the sync committed no generation"
    "$blkps" target stop --dir "$state/ps"
    no_tgtd_left "${pids[@]}"
    [ ! -e "$state/ps/target.env" ] || fail "target.env left after stop"
    if out=$(start --tgtd 1 2>&1); then fail "--tgtd 1 started from a checkpoint of 2 tgtds"; fi
    echo "$out"
    case "$out" in *"written by 2 tgtd(s), not 1"*) ;; *) fail "unexpected refusal: $out" ;; esac
    start > "$state/started"
    [ "$("$blkps" target show --dir "$state/ps" --get TGTD)" = 2 ] || fail "auto did not follow the checkpoint's 2"
    "$py" - "$("$blkps" target show --dir "$state/ps" --get URL)" "$params" "$state/after.f32" <<'PY'
import sys
import blkps
with blkps.Model(sys.argv[1]) as m:
    m.pull(0, int(sys.argv[2])).tofile(sys.argv[3])
PY
    cmp "$state/before.f32" "$state/after.f32" || fail "the restart from the checkpoint serves other weights"
    read -r -a pids < <("$blkps" target show --dir "$state/ps" --get PIDS)
    "$blkps" target stop --dir "$state/ps"
    no_tgtd_left "${pids[@]}"
    ;;
  torch-mount)
    params=300000  # 1.2 MB: a 1 MiB stripe unit on tgtd 0, the rest on tgtd 1
    "$blkps" target start --dir "$state/ps" --tgtd 2 --plugin "$plugin" --owner-pid $$ \
      --bsopts "params=$params;rule=sgd;lr=1;mode=async" >/dev/null
    url=$("$blkps" target show --dir "$state/ps" --get URL)
    BLKPS_TARGET=$url "$py" - "$params" <<'PY' || fail "blkps.torch through 2 tgtds"
import sys
import numpy as np
import torch
import blkps
import blkps.torch as bps
n = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Linear(n // 100 - 1, 100)  # (n/100 - 1) * 100 + 100 = n parameters
assert bps.param_count(model) == n
bps.init()  # BLKPS_TARGET only: the layout names the control LUNs
assert bps.control() and bps.control().startswith("layout:"), bps.control()
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
assert opt.mode == "async", opt.mode
with torch.no_grad():
    model.weight.copy_(torch.arange(model.weight.numel(), dtype=torch.float32).view_as(model.weight) % 251)
    model.bias.fill_(7)
want = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
bps.broadcast_parameters(model.state_dict(), root_rank=0)
with blkps.Model(bps.target()) as m:
    got = m.pull(0, n)
if not np.array_equal(got, want):
    sys.exit(f"broadcast: the server holds {got[:4]}... at {np.flatnonzero(got != want)[:4]}, expected {want[:4]}...")
x = torch.randn(8, n // 100 - 1)
loss = model(x).pow(2).mean()
loss.backward()
opt.step()
with blkps.Model(bps.target()) as m:
    after = m.pull(0, n)
if np.array_equal(after, want):
    sys.exit("a step changed nothing on the server")
opt.close()
PY
    mkdir -p "$mnt"
    "$blkps" mount "$mnt" -f --dir "$state/ps" 2>"$state/mount.log" & mount_pid=$!
    for _ in $(seq 100); do
      grep -qs " $mnt fuse" /proc/mounts && break
      kill -0 "$mount_pid" 2>/dev/null || { cat "$state/mount.log" >&2; fail "blkps-mount exited"; }
      sleep 0.1
    done
    [ -e "$mnt/control" ] || fail "no control file in the mount"
    "$py" - "$mnt/slot1" "$url" "$params" <<'PY' || fail "the mounted slot over 2 tgtds"
import os, sys
import numpy as np
import blkps
path, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with blkps.Model(url) as m:
    before = m.pull(0, n)
with open(path, "rb") as f:
    seen = np.frombuffer(f.read(4 * n), dtype="<f4")
if not np.array_equal(seen, before):
    sys.exit("the slot file's bytes are not the model's")
g = np.zeros(n, dtype="<f4")
g[::997] = 3  # touches every 1 MiB stripe unit, both tgtds
fd = os.open(path, os.O_WRONLY)
os.pwrite(fd, g.tobytes(), 0)
os.close(fd)
with blkps.Model(url) as m:
    after = m.pull(0, n)
if not np.array_equal(after, before - g):
    sys.exit(f"the mounted gradient was not applied once: {np.flatnonzero(after != before - g)[:4]}")
PY
    kill -TERM "$mount_pid"
    wait "$mount_pid" || fail "blkps-mount exited with $? after SIGTERM"
    mount_pid=""
    read -r -a pids < <("$blkps" target show --dir "$state/ps" --get PIDS)
    "$blkps" target stop --dir "$state/ps"
    no_tgtd_left "${pids[@]}"
    ;;
  *) fail "unknown test '$what' (learners, torch-mount, checkpoint-full, checkpoint-swapped, stop-keeps-pushes, kill-restart-async, kill-restart-bsp, kill-restart-ssp)" ;;
esac
