#!/usr/bin/env bash
# Sharding end to end, against real tgtds on loopback (blkps shards).
#
#   shard_integration_test.sh <repo> <build dir> same-weights
#     2 Python learners train the digits MLP in bsp mode through a model
#     striped over 2 shards, and again through 1 shard, from the same initial
#     weights with the same seeds: the final weights must be equal byte for
#     byte, and so the held-out accuracy (>= 0.90).
#   shard_integration_test.sh <repo> <build dir> partial-start
#     a start where the second shard fails (its part of the committed
#     checkpoint is corrupt) prints one line naming it and leaves no tgtd
#     running.
#   shard_integration_test.sh <repo> <build dir> sixteen-bit
#     a model of 10,007 parameters over 3 bfloat16 shards (--bsopts
#     dtype=bfloat16): the layout says dtype, and small integer gradients
#     pushed through layout: add up exactly in the float32 model.
#   shard_integration_test.sh <repo> <build dir> table
#     a table larger than one server's memory (bsopts memory=) is refused by
#     one target and served over 2 shards: pull_rows/push_rows through
#     layout: match before - lr * summed gradients, rows sit on the shard
#     the striping says, a bad stripe unit for the row is refused; a hashed
#     table's shards serve CAPACITY / 2 rounded up each, and its kind =
#     hashed layout is refused as a block device (blkps-layout read).
#   shard_integration_test.sh <repo> <build dir> status-and-set
#     `blkps set lr=... --dir DIR` reaches every shard, and `blkps status
#     --dir DIR` reports each.
#
# Why 2 learners in bsp give exactly the same weights however the model is
# cut: in bsp a learner's pull of iteration t+1 sees exactly the rounds
# 1..t, so each learner computes the same gradients in both runs. The server
# applies a round to a block as w -= lr * avg, avg = (0 + g_a + g_b) / 2:
# with two addends the sum is g_a + g_b or g_b + g_a depending on which
# learner's write arrived first, and float addition is commutative, so the
# sum (and the average) is the same bit pattern in any order. Each parameter
# gets that average once per round, whichever shard serves it. With the
# stripe unit equal to the model block (4 KiB), the servers' blocks hold the
# same parameters in both runs, so even the rule's inner loop sees the same
# runs of parameters. (With 3 or more learners the arrival order would
# change the rounding of the sum; in async the interleaving of pulls and
# pushes would change the gradients.)
set -euo pipefail
top=$1 build=$2 what=$3
# shellcheck source=SCRIPTDIR/lib.sh
. "$top/tests/lib.sh"
train="$top/learner/examples/train_digits.py"
scratch shard-test
trap stop_started EXIT
params=$("$py" "$train" --params)
fail() { echo "shard_integration_test: $*" >&2; exit 1; }

# Trains through <shards> shards started in <dir>; leaves there weights.f32
# (every parameter, pulled at the end) and accuracy (the evaluation line).
train_through() {
  local shards=$1 dir=$2
  # dead_after=300: a learner still importing numpy on a loaded machine
  # must not be declared dead, or the other trains rounds alone.
  shards_start "$dir" "params=$params;block=4K;lr=0.2;init=file:$state/init.f32;mode=bsp;dead_after=300" \
    --shards "$shards" --stripe-unit 4096 --luns 2
  local slot1 slot2 a b LAYOUTS CONTROL_URLS SHARD_PARAMS
  load_state shards "$dir" LAYOUTS CONTROL_URLS SHARD_PARAMS
  read -r slot1 slot2 <<<"$LAYOUTS"
  "$py" "$train" --target "layout:$slot1" --learner 0 --learners 2 --epochs 10 & a=$!
  "$py" "$train" --target "layout:$slot2" --learner 1 --learners 2 --epochs 10 & b=$!
  wait $a
  wait $b
  "$py" "$train" --target "layout:$slot1" --evaluate --min-accuracy 0.90 | tee "$dir/accuracy"
  "$py" - "layout:$slot1" "$params" "$dir/weights.f32" <<'PY'
import os, sys
sys.path.insert(0, os.environ["BLKPS_PY"])
import blkps
with blkps.Model(sys.argv[1]) as m:
    m.pull(0, int(sys.argv[2])).tofile(sys.argv[3])
PY
  # Each server holds only its part of the model.
  local k=0 url json
  for url in $CONTROL_URLS; do
    json=$("$blkps" status --control "$url" --json)
    "$py" -c 'import json, sys
got, want = json.loads(sys.argv[1])["params"], int(sys.argv[2])
sys.exit(0 if got == want else f"shard {sys.argv[3]} serves {got} parameters, expected {want}")' \
      "$json" "$(echo "$SHARD_PARAMS" | cut -d' ' -f$((k + 1)))" "$k"
    k=$((k + 1))
  done
  [ "$k" = "$shards" ] || fail "expected $shards control URLs, got $k"
  "$blkps" shards stop --dir "$dir"
}

case "$what" in
  same-weights)
    "$py" -c 'import sys, numpy as np
np.random.default_rng(1).normal(0, 0.1, int(sys.argv[1])).astype("<f4").tofile(sys.argv[2])' \
      "$params" "$state/init.f32"
    train_through 2 "$state/two"
    train_through 1 "$state/one"
    cmp "$state/two/weights.f32" "$state/one/weights.f32" ||
      fail "the weights trained through 2 shards differ from those through 1 shard"
    cmp -s "$state/init.f32" "$state/one/weights.f32" && fail "training did not change the weights"
    [ "$(cat "$state/two/accuracy")" = "$(cat "$state/one/accuracy")" ] ||
      fail "accuracy through 2 shards '$(cat "$state/two/accuracy")' != through 1 shard '$(cat "$state/one/accuracy")'"
    ;;
  partial-start)
    # Shard 1 finds its part of the committed checkpoint corrupt (a byte of
    # its weights flipped: only the shard that loads the part reads them)
    # and refuses to start; shard 0 had started and must be stopped again.
    shards_start "$state/two" "params=$params;block=4K;checkpoint=$state/model.ckpt" --shards 2 --stripe-unit 4096
    "$py" - "layout:$("$blkps" shards show --dir "$state/two" --get LAYOUT)" <<'PY'
import os, sys
sys.path.insert(0, os.environ["BLKPS_PY"])
import blkps
with blkps.Model(sys.argv[1]) as m:
    m.sync()  # generation 1, committed
PY
    "$blkps" shards stop --dir "$state/two"
    printf '\377' | dd of="$state/model.ckpt.shard-1.gen-1" bs=1 seek=4100 conv=notrunc status=none
    shard_sets+=("$state/two") # stopped at the end, should a shard be left running
    if out=$("$blkps" shards start --dir "$state/two" --shards 2 --stripe-unit 4096 \
        --plugin "$plugin" \
        --bsopts "params=$params;block=4K;checkpoint=$state/model.ckpt" 2>&1); then
      fail "start succeeded with a corrupt checkpoint part on shard 1"
    fi
    echo "$out"
    [ "$(echo "$out" | wc -l)" = 1 ] || fail "expected one line, got: $out"
    case "$out" in "blkps: shards start: shard 1: "*) ;; *) fail "the message does not name shard 1: $out" ;; esac
    [ ! -e "$state/two/shard-0/tgtd.pid" ] || fail "shard 0's tgtd was left running"
    [ ! -e "$state/two/shards.env" ] || fail "shards.env written for a failed start"
    ;;
  status-and-set)
    shards_start "$state/two" "params=$params;block=4K;lr=0.1" --shards 2 --stripe-unit 4096
    "$blkps" set lr=0.025 --dir "$state/two"
    lrs=$("$blkps" status --dir "$state/two" --json |
          "$py" -c 'import json, sys; print(" ".join(str(s["rule_params"]["lr"]) for s in json.load(sys.stdin)))')
    [ "$lrs" = "0.025 0.025" ] || fail "lr per shard after set: '$lrs', expected '0.025 0.025'"
    [ "$("$blkps" status --dir "$state/two" | grep -c '^== shard')" = 2 ] ||
      fail "status does not show both shards"
    ;;
  sixteen-bit)
    shards_start "$state/three" "params=10007;block=4K;rule=sum;dtype=bfloat16" --shards 3 --stripe-unit 4096
    layout=$("$blkps" shards show --dir "$state/three" --get LAYOUT)
    grep -qx "dtype = bfloat16" "$layout" || fail "the layout has no 'dtype = bfloat16' line: $(cat "$layout")"
    "$py" - "layout:$layout" <<'PY' || fail "sums through 3 bfloat16 shards are not exact"
import os, sys
import numpy as np
sys.path.insert(0, os.environ["BLKPS_PY"])
import blkps
n = 10007
g = (np.arange(n, dtype=np.float32) % 13) - 6
with blkps.Model(sys.argv[1], dtype="bfloat16") as m:
    for _ in range(3):
        m.push(0, g)
    m.push(17, g[:100])  # an unaligned range too
    w = m.pull(0, n)
want = 3 * g
want[17:117] += g[:100]
sys.exit(0 if np.array_equal(w, want) else f"weights {w[:8]}..., expected {want[:8]}...")
PY
    "$blkps" shards stop --dir "$state/three"
    ;;
  table)
    # A table larger than one server's memory (memory= stands in for a small
    # server) is refused by one target and served by 2 shards, rows striped
    # 4 to a 512-byte stripe unit (doc/embeddings.md "Tables over shards").
    rows=200000 width=32
    table="table=$rows:$width;rule=sgd;lr=0.5;init=normal:0.1;seed=3;memory=16M"
    if out=$("$blkps" target start --dir "$state/one" --plugin "$plugin" --bsopts "$table" 2>&1); then
      fail "one target took a table of 25 MB with memory=16M"
    fi
    echo "$out"
    case "$out" in *"memory= allows 16 MiB"*) ;; *) fail "the refusal does not name memory=: $out" ;; esac
    out=$("$blkps" shards start --dir "$state/two" --shards 2 --stripe-unit 512 --plugin "$plugin" \
      --bsopts "table=$rows:256" 2>&1) && fail "a stripe unit of 512 bytes took rows of 1024 bytes"
    [ "$(echo "$out" | wc -l)" = 1 ] || fail "expected one line, got: $out"
    case "$out" in *"a multiple of its row's 1024 bytes"*) ;; *) fail "wrong refusal: $out" ;; esac
    # A hashed table is not striped: its shards split the ids by hash, each
    # with CAPACITY / 2 rounded up, and its layout is no block device
    # (blkps-layout read, what blkps login --layout asks, refuses it).
    shards_start "$state/hashed" "table=hash:1001:32" --shards 2 --stripe-unit 512 ||
      fail "shards start refused a hashed table"
    hashed_layout=$("$blkps" shards show --dir "$state/hashed" --get LAYOUT)
    grep -qx "kind = hashed" "$hashed_layout" || fail "the hashed table's layout does not say kind = hashed"
    for d in "$state"/hashed/shard-*; do
      "$blkps" status --dir "$d" | grep -q "0 of at most 501 rows" || fail "$d does not serve 1001 / 2 rows rounded up"
    done
    out=$("$build/learner/tools/blkps-layout" read "$hashed_layout" 2>&1) &&
      fail "blkps-layout read took a hashed layout"
    [ "$(echo "$out" | wc -l)" = 1 ] || fail "expected one line, got: $out"
    case "$out" in *"reached through the row windows only"*) ;; *) fail "wrong refusal: $out" ;; esac
    "$blkps" shards stop --dir "$state/hashed"
    "$blkps" shards start --dir "$state/two" --shards 2 --stripe-unit 512 --plugin "$plugin" --owner-pid $$ \
      --bsopts "$table" >/dev/null
    layout=$("$blkps" shards show --dir "$state/two" --get LAYOUT)
    mapfile -t shard_urls < <("$build/learner/tools/blkps-layout" read "$layout" | tail -n +2)
    "$py" - "layout:$layout" "$rows" "$width" "${shard_urls[@]}" <<'PY' || fail "rows through 2 shards are wrong"
import os, sys
import numpy as np
sys.path.insert(0, os.environ["BLKPS_PY"])
import blkps
url, rows, width, shard_urls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rng = np.random.default_rng(5)
ids = ((rng.zipf(1.05, 4096) - 1) % rows).astype(np.uint64)
ids[:3] = [0, 5, rows - 1]  # both shards, the last row
grads = rng.standard_normal((len(ids), width)).astype(np.float32)
with blkps.Model(url) as t:
    before = t.pull_rows(ids, width)
    t.push_rows(ids, grads)
    after = t.pull_rows(ids, width)
    try:
        t.pull_rows(np.array([rows], dtype=np.uint64), width)
        sys.exit("row ROWS was served")
    except OSError:
        pass
summed = {}
for i, g in zip(ids.tolist(), grads):
    summed[i] = summed.get(i, 0) + g
want = before - 0.5 * np.stack([summed[i] for i in ids.tolist()])
if not np.allclose(after, want, atol=1e-5):
    sys.exit(f"rows after the push differ from before - lr * summed gradient by {np.abs(after - want).max()}")
if np.all(before == 0) or np.unique(before[:, 0]).size < 100:
    sys.exit("the rows were not initialised per row")
# Row r is in stripe unit r // 4 (4 rows of 128 bytes), on shard unit % 2 at
# that shard's row (unit // 2) * 4 + r % 4.
for r in (0, 5, 4096, rows - 1):
    unit = r // 4
    with blkps.Model(shard_urls[unit % 2]) as shard:
        direct = shard.pull_rows(np.array([unit // 2 * 4 + r % 4], dtype=np.uint64), width)[0]
    with blkps.Model(url) as t:
        if not np.array_equal(direct, t.pull_rows(np.array([r], dtype=np.uint64), width)[0]):
            sys.exit(f"row {r} is not at shard {unit % 2}, row {unit // 2 * 4 + r % 4}")
PY
    made=$("$blkps" status --dir "$state/two" --json |
           "$py" -c 'import json, sys; print(" ".join(str(s["table"]["rows"]) + ":" + str(s["table"]["rows_made"] > 0) for s in json.load(sys.stdin)))')
    [ "$made" = "100000:True 100000:True" ] || fail "shards' tables (rows:made any): '$made'"
    "$blkps" shards stop --dir "$state/two"
    ;;
  *) fail "unknown test '$what' (same-weights, partial-start, sixteen-bit, status-and-set, table)" ;;
esac
