#!/usr/bin/env bash
# Two real nodes (multi-node launch, not only local ranks): two network namespaces joined by a veth pair, each with its own
# address, one ampkit-launch --nnodes 2 --node-rank R in each, gloo over the veth addresses (not
# 127.0.0.1). Checks that the result equals the single-node 2-rank run (param_sha256), then kills
# node 1's rank and checks that node 0's rank exits 7 within --dist-timeout + 10 s naming it.
# Needs root (CI runs as root); elsewhere it says why and exits 77 (ctest: skipped).
#
#   tests/dist/test_two_nodes.sh BIN_DIR
set -euo pipefail
BIN=$(cd "$1" && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root (ip netns), this is uid $(id -u)"
command -v ip >/dev/null || skip "no 'ip' command (Debian package iproute2; tools/setup.sh installs it)"

id=$$
ns0=ampkit-n0-$id ns1=ampkit-n1-$id v0=av0-$id v1=av1-$id
net=10.231.$((id % 250)) port=$((21000 + id % 3000))
tmp=$(mktemp -d /tmp/ampkit-two-nodes-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}" $(ip netns pids "$ns0" 2>/dev/null) $(ip netns pids "$ns1" 2>/dev/null); do
    kill -9 "$p" 2>/dev/null || true
  done
  ip netns del "$ns0" 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
ip netns add "$ns0" 2>"$tmp/err" || skip "cannot create a network namespace: $(head -1 "$tmp/err")"
ip netns add "$ns1"
ip link add "$v0" type veth peer name "$v1" 2>"$tmp/err" || skip "cannot create a veth pair: $(head -1 "$tmp/err")"
ip link set "$v0" netns "$ns0"
ip link set "$v1" netns "$ns1"
ip -n "$ns0" addr add "$net.1/24" dev "$v0"
ip -n "$ns1" addr add "$net.2/24" dev "$v1"
for n in "$ns0:$v0" "$ns1:$v1"; do
  ip -n "${n%%:*}" link set lo up
  ip -n "${n%%:*}" link set "${n##*:}" up
done
echo "nodes: $ns0 ($net.1, $v0) and $ns1 ($net.2, $v1); master $net.1:$port"

job=(--workload synthetic --synthetic-inputs 32 --synthetic-width 64 --synthetic-depth 3 --seed 4
  --progress never --threads 1 --batch-size 8)

# node R: ampkit-launch in namespace R, gloo on that namespace's veth; the rest of the words go to ampkit-train
node() {
  local r=$1 ns=$2 dev=$3
  shift 3
  GLOO_SOCKET_IFNAME=$dev ip netns exec "$ns" "$BIN/ampkit-launch" --nnodes 2 --node-rank "$r" \
    --nproc-per-node 1 --master-addr "$net.1" --master-port "$port" -- "$BIN/ampkit-train" "${job[@]}" "$@"
}

# 1. Parity: two nodes over the veth pair = one node with two ranks on loopback.
"$BIN/ampkit-launch" --nproc-per-node 2 --master-port 0 -- "$BIN/ampkit-train" "${job[@]}" --steps 40 \
  --summary "$tmp/one-node.json" >"$tmp/one-node.log" 2>&1 || { cat "$tmp/one-node.log"; fail "single-node run"; }
node 0 "$ns0" "$v0" --steps 40 --summary "$tmp/two-nodes.json" >"$tmp/node0.log" 2>&1 &
pids+=($!)
node 1 "$ns1" "$v1" --steps 40 >"$tmp/node1.log" 2>&1 &
pids+=($!)
wait "${pids[0]}" || { cat "$tmp/node0.log" "$tmp/node1.log"; fail "node 0 of the two-node run failed"; }
wait "${pids[1]}" || { cat "$tmp/node0.log" "$tmp/node1.log"; fail "node 1 of the two-node run failed"; }
pids=()
sha_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["param_sha256"])' "$1"; }
one=$(sha_of "$tmp/one-node.json") two=$(sha_of "$tmp/two-nodes.json")
echo "param_sha256: one node $one, two nodes $two"
[ "$one" = "$two" ] || fail "two nodes over the veth pair did not reproduce the single-node run"

# 2. A lost rank on node 1: node 0's rank names it and exits 7 within --dist-timeout + 10 s.
timeout=20
node 0 "$ns0" "$v0" --steps 1000000 --dist-timeout $timeout --metrics "$tmp/m.jsonl" >"$tmp/node0.log" 2>&1 &
pids+=($!)
node 1 "$ns1" "$v1" --steps 1000000 --dist-timeout $timeout >"$tmp/node1.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  [ -f "$tmp/m.jsonl" ] && [ "$(wc -l <"$tmp/m.jsonl")" -ge 5 ] && break
  sleep 0.1
done
[ "$(wc -l <"$tmp/m.jsonl" 2>/dev/null || echo 0)" -ge 5 ] || { cat "$tmp/node0.log" "$tmp/node1.log"; fail "the two nodes did not train"; }
victim=
for p in $(ip netns pids "$ns1"); do
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ampkit-train ] && victim=$p
done
[ -n "$victim" ] || fail "no ampkit-train process in $ns1"
kill -9 "$victim"
start=$(date +%s.%N)
code=0
wait "${pids[0]}" || code=$?
seconds=$(python3 -c "import sys; print(round($(date +%s.%N) - $start, 1))")
wait "${pids[1]}" || true
pids=()
echo "node 1's rank killed: node 0's launcher exited $code after $seconds s"
sed 's/^/  node 0: /' "$tmp/node0.log"
[ "$code" = 7 ] || fail "node 0 exited $code, expected 7"
python3 -c "import sys; sys.exit(0 if $seconds < $timeout + 10 else 1)" || fail "node 0 took $seconds s (limit $((timeout + 10)) s)"
grep -q "\[rank 0\] ampkit-train: error: rank 0: lost rank 1" "$tmp/node0.log" || fail "node 0 did not name the lost rank 1"
grep -q "^ampkit-launch: failed: rank 0 exited with code 7" "$tmp/node0.log" || fail "node 0's launcher did not name its failed rank"
echo "PASSED: two nodes over veth match one node; a lost rank on node 1 is named on node 0 in $seconds s"
