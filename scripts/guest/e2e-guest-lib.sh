# shellcheck shell=sh
# Guest-side helpers of the two-guest e2e script e2e-vxlan-guests.sh: copied into the guest as /opt/vr/common.sh (with
# the script's own additions, after scripts/guest/rdma-lib.sh) and sourced
# by its job scripts (dash).

# case_ NAME RC TEXT: the result line the host script reads
case_() { echo "CASE $1 rc=$2 $3"; }
# row_ok RC LOG: a perftest run passed: exit 0 and its 65536-byte result row
row_ok() { [ "$1" = 0 ] && grep -q '^ *65536 ' "$2"; }
# retry N CMD...: a client whose server may not listen yet
retry() {
    n=$1; shift
    for t in $(seq 1 $n); do
        "$@" && return 0
        sleep 2
    done
    return 1
}
# rping_ok LOG: at least 10 verified pings (rdma-lib.sh rping_pings)
rping_ok() { [ "$(rping_pings "$1")" -ge 10 ]; }
