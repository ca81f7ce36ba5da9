# shellcheck shell=sh
# RDMA helpers every guest job shares (POSIX sh, run by dash): the e2e
# scripts put it in their /opt/vr/common.sh, the matrix and the soak ship it
# as /opt/vr/ci/rdma-lib.sh beside ci-lib.sh (which sources it), the demo
# as /opt/vr/rdma-lib.sh.

# roce_gid_index DEV IPV4: the index of the RoCE v2 GID ::ffff:IPV4 on port
# 1 of DEV (rxe and erdma list an IPv4 address so), on stdout; waits up to
# 30 s for the GID to appear (the kernel adds it when the address is up).
roce_gid_index() {
    _want=$(echo "$2" | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4 }')
    _i=0
    while [ $_i -lt 30 ]; do
        for _f in /sys/class/infiniband/"$1"/ports/1/gids/*; do
            _n=${_f##*/}
            [ "$(cat "$_f" 2>/dev/null)" = "$_want" ] || continue
            case "$(cat /sys/class/infiniband/"$1"/ports/1/gid_attrs/types/"$_n" 2>/dev/null)" in
                *v2*|*V2*) echo "$_n"; return 0 ;;
            esac
        done
        _i=$((_i + 1))
        sleep 1
    done
    return 1
}

# rping_pings LOG: the pings an `rping -v -V` run verified (its "ping data:
# rdma-ping-" lines, client or server). rping exits 0 even when it never
# connected, so a run is judged by this count, not by its status.
rping_pings() { grep -c 'ping data: rdma-ping-' "$1"; }
