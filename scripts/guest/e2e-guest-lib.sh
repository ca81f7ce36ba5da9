# shellcheck shell=sh
# Guest-side helpers of the two-guest e2e scripts (e2e-erdma.sh,
# e2e-vxlan-guests.sh): copied into the guest as /opt/vr/common.sh (with
# the script's own additions) and sourced by its job scripts (dash).

# case_ NAME RC TEXT: the result line the host script reads
case_() { echo "CASE $1 rc=$2 $3"; }
# row_ok RC LOG: a perftest run passed: exit 0 and its 65536-byte result row
row_ok() { [ "$1" = 0 ] && grep -q '^ *65536 ' "$2"; }
# gid_index DEV IPV4: index of the RoCE v2 GID ::ffff:IPV4 on port 1
gid_index() {
    want=$(echo $2 | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4 }')
    for t in $(seq 1 20); do
        for f in /sys/class/infiniband/$1/ports/1/gids/*; do
            n=${f##*/}
            [ "$(cat $f 2>/dev/null)" = "$want" ] || continue
            case "$(cat /sys/class/infiniband/$1/ports/1/gid_attrs/types/$n 2>/dev/null)" in
                *v2*|*V2*) echo $n; return 0 ;;
            esac
        done
        sleep 1
    done
    return 1
}
# retry N CMD...: a client whose server may not listen yet
retry() {
    n=$1; shift
    for t in $(seq 1 $n); do
        "$@" && return 0
        sleep 2
    done
    return 1
}
# rping_ok LOG: rping exits 0 even when it never connected; count the pings
rping_ok() { [ "$(grep -c 'ping data:' $1)" -ge 10 ]; }
