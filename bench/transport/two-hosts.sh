#!/usr/bin/env bash
# `sluice bench transport` with the server and the client on two "hosts" of one machine: the
# server in its own network namespace behind a veth pair and pinned to CPU 0, the client in the
# root namespace pinned to CPU 1, and receive packet steering (RPS) sending each side's incoming
# packets to its own CPU. Over loopback the receiver's TCP work runs on the sender's CPU and is
# billed to the sender, so loopback cannot say what serving a file costs the server alone; here
# each CPU does what one host would. Needs root and iproute2. Cleans up after itself.
#
#   bench/transport/two-hosts.sh [--veth-mtu N] [bench transport options…]
#
# Default MTU 1500, as on an Ethernet NIC; --veth-mtu 65535 gives loopback's packet size (which
# changes which path is cheaper: docs/benchmarks-log.md#two-hosts).
set -euo pipefail
cd "$(dirname "$0")/../.."

NS=sluice-bench-srv
A=sluice-b0   # root namespace end (client side)
B=sluice-b1   # server namespace end
CLIENT_IP=10.213.0.1
SERVER_IP=10.213.0.2
MTU=1500
if [[ "${1:-}" == "--veth-mtu" ]]; then MTU="$2"; shift 2; fi

[[ $(id -u) == 0 ]] || { echo "two-hosts.sh: needs root (network namespaces)" >&2; exit 2; }
command -v ip >/dev/null || { echo "two-hosts.sh: needs iproute2 (ip)" >&2; exit 2; }
(( $(nproc) >= 2 )) || { echo "two-hosts.sh: needs 2 CPUs" >&2; exit 2; }

cleanup() {
  ip link del "$A" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT
cleanup

ip netns add "$NS"
ip link add "$A" mtu "$MTU" type veth peer name "$B" mtu "$MTU"
ip link set "$B" netns "$NS"
ip addr add "$CLIENT_IP/30" dev "$A"
ip link set "$A" up
ip -n "$NS" addr add "$SERVER_IP/30" dev "$B"
ip -n "$NS" link set "$B" up
ip -n "$NS" link set lo up
# Packets arriving at the client's end are processed on CPU 1, at the server's end on CPU 0.
echo 2 > "/sys/class/net/$A/queues/rx-0/rps_cpus"
ip netns exec "$NS" sh -c "echo 1 > /sys/class/net/$B/queues/rx-0/rps_cpus"

cargo build --release -q -p sluice
${SLUICE_BENCH_WRAP:-} taskset -c 1 ./target/release/sluice bench transport \
  --server-ip "$SERVER_IP" --server-prefix "ip netns exec $NS taskset -c 0" "$@"
