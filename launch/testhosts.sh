#!/usr/bin/env bash
# Test hosts for multi-node tests: N network namespaces on one private /24, reachable only from each other.
#
#   launch/testhosts.sh up N [NAME]        create hosts NAME-h0 .. NAME-h{N-1} (idempotent)
#   launch/testhosts.sh down N [NAME]      remove them and everything they hold (idempotent, never fails)
#   launch/testhosts.sh addr K             print host K's address
#   launch/testhosts.sh throttle RATE N [NAME]   tbf-limit every host's uplink (egress) to RATE, e.g. 1gbit
#   launch/testhosts.sh unthrottle N [NAME]
#   launch/testhosts.sh cut K [NAME] / mend K [NAME]   take host K's link down / up
#
# Topology: two hosts are joined by one veth pair; three or more hang off a bridge that lives in a
# namespace of its own (NAME-sw), so nothing is ever added to the root namespace. Every host's link is
# called $TESTHOSTS_IF (tb0), so GLOO_SOCKET_IFNAME=tb0 is the same on every host.
# Safety: hosts get only their /24 connected route (no default route, no gateway) and loopback, so no
# address outside the namespaces can be reached from inside them. Used by the multi-node tests and benchmarks
# (through dstoolkit/runtime/testhosts/hosts.py); needs root.
set -euo pipefail

# One private /24 of our own (RFC 1918 10/8); it exists only inside these namespaces.
SUBNET="${TESTHOSTS_SUBNET:-10.213.7}"
IFNAME="${TESTHOSTS_IF:-tb0}"
# Largest host count the /24 can address with .1 .. .N (leaves .254 unused for safety margin).
MAX_HOSTS=250

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

name_ok() { [[ "$1" =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || { echo "testhosts: bad NAME '$1' (letters, digits, _ . - ; at most 40)" >&2; exit 2; }; }
count_ok() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 2 ] && [ "$1" -le "$MAX_HOSTS" ] || { echo "testhosts: N must be 2..$MAX_HOSTS, got '$1'" >&2; exit 2; }; }

host() { echo "$NAME-h$1"; }
addr() { echo "$SUBNET.$(( $1 + 1 ))"; }
ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$1"; }

down() {
  # Every namespace of this NAME (any host count, plus the switch). Processes inside are killed first:
  # they can only be ours, started in these namespaces by tests.
  local ns re
  re="^$(printf '%s' "$NAME" | sed 's/[.]/\\./g')-(h[0-9]+|sw)\$"
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E -- "$re" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  return 0
}

is_up() {
  local k
  for (( k = 0; k < N; k++ )); do
    ns_exists "$(host "$k")" || return 1
    ip -n "$(host "$k")" -4 addr show dev "$IFNAME" 2>/dev/null | grep -q "inet $(addr "$k")/24" || return 1
  done
  if [ "$N" -gt 2 ]; then ns_exists "$NAME-sw" || return 1; fi
  # A host beyond N left from an earlier, larger `up` would share the subnet: treat as not up.
  ! ns_exists "$(host "$N")"
}

up() {
  if is_up; then echo "testhosts: $N hosts '$NAME' already up"; return 0; fi
  # Partial state from an interrupted run: clear it (including a larger earlier set) before building.
  down
  trap 'rc=$?; if [ $rc -ne 0 ]; then echo "testhosts: up failed (rc=$rc), cleaning up" >&2; down; fi; exit $rc' EXIT
  local k ns
  for (( k = 0; k < N; k++ )); do
    ns="$(host "$k")"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
  done
  if [ "$N" -eq 2 ]; then
    # Created directly inside the two namespaces: no interface ever appears in the root namespace.
    ip link add "$IFNAME" netns "$(host 0)" type veth peer name "$IFNAME" netns "$(host 1)"
  else
    ip netns add "$NAME-sw"
    ip -n "$NAME-sw" link set lo up
    ip -n "$NAME-sw" link add br0 type bridge
    ip -n "$NAME-sw" link set br0 up
    for (( k = 0; k < N; k++ )); do
      ip link add "$IFNAME" netns "$(host "$k")" type veth peer name "p$k" netns "$NAME-sw"
      ip -n "$NAME-sw" link set "p$k" master br0
      ip -n "$NAME-sw" link set "p$k" up
    done
  fi
  for (( k = 0; k < N; k++ )); do
    ns="$(host "$k")"
    ip -n "$ns" addr add "$(addr "$k")/24" dev "$IFNAME"
    ip -n "$ns" link set "$IFNAME" up
  done
  trap - EXIT
  for (( k = 0; k < N; k++ )); do echo "$(host "$k") $(addr "$k") $IFNAME"; done
}

throttle() {
  # tbf shapes egress only, so each host's uplink gets its own limiter: both directions are capped.
  # burst: 256 KiB holds several 64 KiB GSO segments, so the limiter is not starved by timer granularity.
  local k
  for (( k = 0; k < N; k++ )); do
    ip netns exec "$(host "$k")" tc qdisc replace dev "$IFNAME" root tbf rate "$RATE" burst 256kb latency 100ms
  done
}

unthrottle() {
  local k
  for (( k = 0; k < N; k++ )); do
    ip netns exec "$(host "$k")" tc qdisc del dev "$IFNAME" root 2>/dev/null || true
  done
}

cmd="${1:-}"; shift || true
case "$cmd" in
  up|down|unthrottle)
    [ $# -ge 1 ] || usage
    N="$1"; NAME="${2:-dstk}"; name_ok "$NAME"; count_ok "$N"
    "$cmd" ;;
  throttle)
    [ $# -ge 2 ] || usage
    RATE="$1"; N="$2"; NAME="${3:-dstk}"; name_ok "$NAME"; count_ok "$N"
    [[ "$RATE" =~ ^[0-9]+(\.[0-9]+)?([kmgKMG]?(bit|bps))$ ]] || { echo "testhosts: RATE like 1gbit or 200mbit, got '$RATE'" >&2; exit 2; }
    throttle ;;
  addr)
    [ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]] || usage
    addr "$1" ;;
  cut|mend)
    [ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]] || usage
    NAME="${2:-dstk}"; name_ok "$NAME"
    if [ "$cmd" = cut ]; then state=down; else state=up; fi
    ip -n "$NAME-h$1" link set "$IFNAME" "$state" ;;
  *) usage ;;
esac
