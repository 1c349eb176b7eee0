#!/usr/bin/env bash
# A simulated cluster on one machine: K "hosts" as network namespaces, each joined to a switch
# (a bridge in a namespace of its own) by a veth pair whose both ends are shaped with tc, and one
# MPI job across them over OpenMPI's TCP transport only. Traffic between ranks of one host stays
# on that host's loopback (unshaped, the fast link inside a node); traffic between hosts crosses
# two shaped links (the sender's and the receiver's), like two NICs and a switch.
#
#   slow_link.sh [--hosts K] [--ranks-per-host R] [--rate 1gbit] [--delay 0.1ms] [--stats FILE]
#                [--tcp-retries2 N] -- PROGRAM ARGS...
#
# Runs PROGRAM ARGS as K x R ranks (ranks 0..R-1 on host 0, and so on), with the environment of
# this script. Node identity: each host also gets a UTS namespace of its own, with the hostname
# slowlink-hN. OpenMPI needs that: with one hostname for all, its TCP transport delivered a
# connection between two hosts to the wrong process of a host (a crash in ob1 at 2 ranks per host).
# With it, OpenMPI runs one daemon per host and MPI_COMM_TYPE_SHARED groups exactly the ranks of a
# host, so libzero finds the K nodes itself: ZERO_RANKS_PER_NODE is not needed and not set.
#
# --tcp-retries2 N sets the hosts' net.ipv4.tcp_retries2 (each namespace has its own), the node
# setting that bounds how long mpiexec waits for a lost host (docs/multi-node.md). When mpiexec
# has ended by itself, processes still running in the hosts' namespaces after 5 s are named on
# stderr ("slow_link: left running: ...") before they are removed.
#
# Needs root (namespaces, veth, tc). Exits 77 (skipped) where they cannot be made. Everything it
# makes (namespaces with their links and qdiscs, a temporary directory) carries its process id and
# is removed on every exit; namespaces left by an earlier run that was killed with SIGKILL are
# removed at the next start. Environment: MPIEXEC (default mpiexec), SLOW_LINK_MPI_ARGS (extra
# mpiexec arguments, split on spaces).
set -euo pipefail

usage() {
  sed -n '8,9p' "$0" | sed '1s/^#   /usage: /; 2s/^#  //' >&2
  exit 2
}

hosts=2 ranks=1 rate=1gbit delay=0.1ms delay_given=0 stats= retries2=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts=${2:?}; shift 2 ;;
    --ranks-per-host) ranks=${2:?}; shift 2 ;;
    --rate) rate=${2:?}; shift 2 ;;
    --delay) delay=${2:?}; delay_given=1; shift 2 ;;
    --stats) stats=${2:?}; shift 2 ;;
    --tcp-retries2) retries2=${2:?}; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "slow_link: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ $# -gt 0 ]] || { echo "slow_link: no program to run (put it after --)" >&2; usage; }
[[ $hosts =~ ^[0-9]+$ && $hosts -ge 1 && $hosts -le 200 ]] || { echo "slow_link: --hosts $hosts: need 1..200" >&2; exit 2; }
[[ -z $retries2 || $retries2 =~ ^[0-9]+$ ]] || { echo "slow_link: --tcp-retries2 $retries2: need a count" >&2; exit 2; }
[[ $ranks =~ ^[0-9]+$ && $ranks -ge 1 ]] || { echo "slow_link: --ranks-per-host $ranks: need a positive number" >&2; exit 2; }

# tbf needs a byte count for its bucket: the rate in bits/s, from tc's own units.
rate_bps=$(awk -v r="$rate" 'BEGIN {
  if (match(r, /^[0-9.]+/) == 0) exit 1
  n = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
  m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9
  m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9
  if (!(u in m) || n <= 0) exit 1
  printf "%.0f", n * m[u] }') || { echo "slow_link: --rate $rate: use tc's units, e.g. 50mbit, 1gbit" >&2; exit 2; }
[[ $delay =~ ^[0-9.]+(us|ms|s)?$ ]] || { echo "slow_link: --delay $delay: use e.g. 0.1ms, 100us, 0" >&2; exit 2; }
delay_zero=$(awk -v d="$delay" 'BEGIN { print (d + 0 == 0) ? 1 : 0 }')

skip() { echo "slow_link: SKIPPED: $*" >&2; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root to make network namespaces (run as root, e.g. in CI)"
for tool in ip tc awk unshare; do
  command -v "$tool" >/dev/null || skip "'$tool' is not installed (iproute2, util-linux)"
done
mpiexec_bin=${MPIEXEC:-mpiexec}
command -v "$mpiexec_bin" >/dev/null || { echo "slow_link: '$mpiexec_bin' not found (set MPIEXEC)" >&2; exit 2; }

prefix=slowlink-$$
switch=$prefix-sw
subnet=10.231.0     # only inside the namespaces: nothing on this machine's own links changes
host_ns() { echo "$prefix-h$1"; }
host_addr() { echo "$subnet.$(($1 + 1))"; }
tmp=

remove_namespaces() {  # $1: the prefix whose namespaces go
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$1-" || true); do
    # Processes this run started inside (an orphaned daemon) would keep the namespace alive.
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}

# What crossed each host's link, measured on the wire (headers included): "HOST SENT RECEIVED" in
# bytes per line, into --stats FILE, from the veth counters before the namespaces go.
write_stats() {
  local h
  for ((h = 0; h < hosts; ++h)); do
    ip -n "$(host_ns "$h")" -s -j link show slow0 2>/dev/null \
      | awk -v h="slowlink-h$h" '{ match($0, /"rx":\{"bytes":[0-9]+/); rx = substr($0, RSTART + 14, RLENGTH - 14)
                                   match($0, /"tx":\{"bytes":[0-9]+/); tx = substr($0, RSTART + 14, RLENGTH - 14)
                                   print h, tx, rx }' || true
  done > "$stats"
}

mpi_pid=
mpi_ended=0
# What still runs in the hosts' namespaces (the switch runs nothing), as "pid:name" words.
left_running() {
  local h pid
  for ((h = 0; h < hosts; ++h)); do
    for pid in $(ip netns pids "$(host_ns "$h")" 2>/dev/null || true); do
      echo "$pid:$(cat "/proc/$pid/comm" 2>/dev/null || echo gone)@slowlink-h$h"
    done
  done
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ $mpi_ended -eq 1 ]]; then
    local left
    for _ in $(seq 1 25); do
      left=$(left_running)
      [[ -z $left ]] && break
      sleep 0.2
    done
    [[ -n $left ]] && echo "slow_link: left running: $(echo $left)" >&2
  fi
  if [[ -n $mpi_pid ]] && kill -0 "$mpi_pid" 2>/dev/null; then
    kill -TERM "$mpi_pid" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$mpi_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$mpi_pid" 2>/dev/null || true
  fi
  [[ -n $stats && -n $tmp ]] && write_stats
  remove_namespaces "$prefix"  # deleting a namespace deletes its veth ends, bridge and qdiscs
  [[ -n $tmp ]] && rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Namespaces of earlier runs killed too hard to clean up (their script's process is gone).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^slowlink-[0-9]+-sw$' || true); do
  old=${ns#slowlink-}; old=${old%-sw}
  if ! kill -0 "$old" 2>/dev/null; then
    remove_namespaces "slowlink-$old"
    rm -rf "/tmp/slowlink-$old".*
  fi
done

ip netns add "$switch" 2>/dev/null || skip "cannot make a network namespace here (no CAP_SYS_ADMIN, or namespaces are disabled)"
ip -n "$switch" link add br0 type bridge 2>/dev/null || skip "cannot make a bridge in a namespace (no bridge support in this kernel)"
ip -n "$switch" link set br0 up
ip -n "$switch" link set lo up

# Shaping of one end: tbf for the rate, netem under it for the delay where the kernel has netem.
# The bucket holds 1 ms at the rate (at least 16 KiB), the queue 200 ms (at least 256 KiB).
burst=$(( rate_bps / 8 / 1000 > 16384 ? rate_bps / 8 / 1000 : 16384 ))
limit=$(( rate_bps / 8 / 5 > 262144 ? rate_bps / 8 / 5 : 262144 ))
have_netem=1
shape() {  # $1 namespace, $2 device
  tc -n "$1" qdisc add dev "$2" root handle 1: tbf rate "$rate" burst "$burst" limit "$limit" 2>/dev/null \
    || skip "tc cannot attach tbf to a veth here (sch_tbf missing)"
  [[ $delay_zero -eq 1 || $have_netem -eq 0 ]] && return 0
  local err
  err=$(tc -n "$1" qdisc add dev "$2" parent 1:1 handle 10: netem delay "$delay" limit 100000 2>&1) && return 0
  if [[ $err != *unknown* ]]; then
    echo "slow_link: tc cannot add a $delay netem delay: $err" >&2
    exit 1
  fi
  have_netem=0
  if [[ $delay_given -eq 1 ]]; then
    echo "slow_link: --delay $delay: this kernel has no netem qdisc (sch_netem) to add delay; pass --delay 0" >&2
    exit 1
  fi
  echo "slow_link: note: no netem qdisc in this kernel: links are rate-limited only, without the default $delay delay" >&2
}

for ((h = 0; h < hosts; ++h)); do
  ns=$(host_ns "$h")
  ip netns add "$ns"
  # Both ends are made in their namespaces directly: nothing appears in this machine's own.
  ip -n "$switch" link add "h$h" type veth peer name slow0 netns "$ns" 2>/dev/null \
    || skip "cannot make veth pairs between namespaces (no veth support in this kernel)"
  ip -n "$switch" link set "h$h" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$(host_addr "$h")/24" dev slow0
  ip -n "$ns" link set slow0 up
  [[ -n $retries2 ]] && ip netns exec "$ns" sysctl -q -w "net.ipv4.tcp_retries2=$retries2"
  shape "$ns" slow0        # what the host sends
  shape "$switch" "h$h"    # what it receives
done

ip netns exec "$(host_ns 0)" unshare --uts true 2>/dev/null || skip "cannot make a UTS namespace here (unshare --uts)"

tmp=$(mktemp -d "/tmp/$prefix.XXXXXX")
# mpiexec's remote shell: "agent HOST COMMAND...", COMMAND quoted for a shell as ssh would get it.
# It starts OpenMPI's daemon inside the host's namespace; the environment passes through as is.
cat > "$tmp/agent" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
  $subnet.*) h=\$((\${host##*.} - 1))
             exec ip netns exec "$prefix-h\$h" unshare --uts /bin/sh -c "hostname slowlink-h\$h && \$*" ;;
  *) echo "slow_link agent: unknown host \$host" >&2; exit 1 ;;
esac
EOF
chmod +x "$tmp/agent"
for ((h = 0; h < hosts; ++h)); do echo "$(host_addr "$h") slots=$ranks"; done > "$tmp/hostfile"

delay_text=$delay
[[ $have_netem -eq 0 || $delay_zero -eq 1 ]] && delay_text=none
echo "slow_link: $hosts hosts x $ranks ranks, each host's link $rate each way, delay $delay_text per link" >&2

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# mpiexec runs on host 0 (so its own address is in the hostfile) and reaches the others through
# the agent; the TCP transport and OpenMPI's own wiring use only the namespaces' subnet.
# shellcheck disable=SC2086  # SLOW_LINK_MPI_ARGS is a list of words
ip netns exec "$(host_ns 0)" unshare --uts /bin/sh -c 'hostname slowlink-h0 && exec "$@"' sh "$mpiexec_bin" --hostfile "$tmp/hostfile" -n $((hosts * ranks)) --map-by slot \
  --bind-to none --mca plm_rsh_agent "$tmp/agent" --mca plm_rsh_no_tree_spawn 1 \
  --mca btl tcp,self --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
  --mca pml ob1 --mca orte_tmpdir_base "$tmp" ${SLOW_LINK_MPI_ARGS:-} "$@" &
mpi_pid=$!
status=0
wait "$mpi_pid" || status=$?
mpi_ended=1
exit "$status"
