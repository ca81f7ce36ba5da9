# shellcheck shell=sh
# The guest side of scripts/demo.sh (POSIX sh: the test guests run it with
# dash as /opt/vr/demo-guest.sh ROLE, ROLE a or b). Not meant to be run on
# the host.
#
# Guest a (10.77.0.1): an erdma function bound to its virtio-net eth0
# (DEMO_ERDMA=1; else rxe0 on eth0) and, with DEMO_GVE=1, a gVNIC eth1
# (10.77.1.1). Guest b (10.77.0.2): siw0 on its virtio-net eth0, then rxe0
# (rdma_cm uses the first RDMA device of a netdev, so they take turns).
# The virtual host vh (10.77.0.10) runs in the daemon.
#
# Steps: the host starts step N for both guests at once. Each guest touches
# /job/ready-N and waits for /job/go-N (the host creates it when both are
# there), runs its part and writes /job/end-N ("rc=RC DETAIL"); the host then
# judges the step from the tool logs the guests leave in /job and from the
# daemon. /job/abort (the other guest stopped) ends the wait. Lines starting
# with "DEMO: " are the progress the host shows.
set -u
ROLE=${1:?usage: demo-guest.sh a|b}
A=10.77.0.1 B=10.77.0.2 VH=10.77.0.10 GA=10.77.1.1 GB=10.77.1.2
: "${DEMO_BYTES:=64M}" "${DEMO_ERDMA:=1}" "${DEMO_GVE:=1}" "${DEMO_QUEUES:=1}" "${DEMO_WAIT:=900}"
UEID=VHOST-RDMA-DEMO
# roce_gid_index: scripts/guest/rdma-lib.sh, shipped beside this script.
. /opt/vr/rdma-lib.sh

say() { echo "DEMO: $*"; }

# step_wait N: wait until the host starts step N (both guests are at it)
step_wait() {
    : >"/job/ready-$1"
    _w=0
    while [ ! -e "/job/go-$1" ]; do
        if [ -e /job/abort ]; then
            say "the other guest stopped before step $1: giving up"
            exit 1
        fi
        _w=$((_w + 1))
        if [ $_w -ge $((DEMO_WAIT * 5)) ]; then
            say "the host never started step $1"
            exit 1
        fi
        sleep 0.2
    done
}

# step_end N RC DETAIL: this guest's part of step N is over
step_end() {
    echo "CASE step-$1 rc=$2"
    printf 'rc=%s %s\n' "$2" "$3" >"/job/end-$1.tmp"
    mv "/job/end-$1.tmp" "/job/end-$1"
}

# retry N CMD...: a client whose server may not listen yet
retry() {
    _n=$1; shift
    _t=0
    while [ $_t -lt "$_n" ]; do
        "$@" && return 0
        _t=$((_t + 1))
        sleep 2
    done
    return 1
}

# active DEV: wait for DEV/1 ACTIVE on eth0
active() {
    _i=0
    until rdma link show "$1/1" 2>/dev/null | grep -q 'state ACTIVE.*netdev eth0'; do
        _i=$((_i + 1))
        [ $_i -ge 60 ] && return 1
        sleep 1
    done
}

# reach IP: wait until IP answers ping (up to 60 s)
reach() {
    _i=0
    until ping -c 1 -W 2 "$1" >/dev/null 2>&1; do
        _i=$((_i + 1))
        [ $_i -ge 60 ] && return 1
        sleep 1
    done
}

# net_up PEER: eth0 has carrier (and N queues), PEER and the virtual host answer
net_up() {
    _i=0
    while [ "$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do
        _i=$((_i + 1))
        [ $_i -ge 30 ] && { say "eth0 has no carrier"; return 1; }
        sleep 1
    done
    if [ "$DEMO_QUEUES" -gt 1 ]; then ethtool -L eth0 combined "$DEMO_QUEUES" || return 1; fi
    say "eth0 up: $(ip -br addr show eth0 | awk '{print $3}') ($(ethtool -i eth0 | sed -n 's/^driver: //p'))"
    reach "$1" || { say "no answer from $1"; return 1; }
    reach $VH || { say "no answer from the virtual host $VH"; return 1; }
    say "ping: the other guest $1 and the virtual host $VH answer"
}

# smc_ueid: the UEID SMCv2 needs (the same on both peers)
smc_ueid() {
    smc-guest-tests smc ueid add $UEID >>/job/smc-setup.$ROLE.log 2>&1
}
# smc_ready: an SMC-R capable RDMA device
smc_ready() {
    smc-guest-tests smc devices --require-smcr >>/job/smc-setup.$ROLE.log 2>&1 || return 1
    say "SMC: UEID $UEID; $(grep '^SMCR-DEVICES' /job/smc-setup.$ROLE.log | tail -n 1)"
}

# stream_line LOG: the tool's summary, or its last line
stream_line() {
    grep '^summary' "$1" | tail -n 1 | grep . || tail -n 1 "$1"
}

# rping_to PORT LOG: rping -V to the virtual host; it exits 0 even when it
# never connected, so success is 10 compared echoes ("ping data:" lines)
rping_to() {
    retry 5 sh -c "timeout 120 rping -c -a $VH -p $1 -C 10 -v -V >$2 2>&1; grep -q '^ping data:' $2"
    _n=$(grep -c '^ping data: rdma-ping-' "$2")
    tail -n 3 "$2"
    [ "$_n" -ge 10 ] && ! grep -qi 'data mismatch' "$2"
}

role_a() {
    say "kernel $(uname -r); RDMA: $([ "$DEMO_ERDMA" = 1 ] && echo 'erdma function' || echo 'rxe'), gVNIC: $([ "$DEMO_GVE" = 1 ] && echo yes || echo no)"
    # ---- step 1: devices up
    rc=0
    net_up $B || rc=1
    if [ "$DEMO_ERDMA" = 1 ]; then
        DEV=erdma_0
        dmesg | grep -i 'erdma' | tail -n 3 | sed 's/^/  dmesg: /'
        active $DEV || { say "erdma_0 is not ACTIVE on eth0"; rdma link; rc=1; }
    else
        DEV=rxe0
        rdma link add rxe0 type rxe netdev eth0 && active rxe0 || rc=1
    fi
    G=$(roce_gid_index $DEV $A) || { say "$DEV: no RoCE v2 GID for $A"; rc=1; }
    say "$(rdma link show $DEV/1 | sed 's/ *$//'); RoCE v2 GID index ${G:-?}"
    GVE=""
    if [ "$DEMO_GVE" = 1 ]; then
        for n in /sys/class/net/*; do
            [ "$(basename "$(readlink "$n/device/driver" 2>/dev/null)")" = gve ] && GVE=${n##*/}
        done
        if [ -n "$GVE" ]; then
            # ARP for 10.77.1.1 must be answered by the gVNIC only (both
            # NICs are on the same switch)
            echo 1 >/proc/sys/net/ipv4/conf/all/arp_ignore
            echo 2 >/proc/sys/net/ipv4/conf/all/arp_announce
            ip link set "$GVE" up && ip addr add $GA/24 dev "$GVE" &&
                ethtool -G "$GVE" tcp-data-split on || rc=1
            say "gVNIC $GVE ($(ethtool -i "$GVE" | sed -n 's/^driver: //p')) up with $GA, header split: $(ethtool -g "$GVE" | sed -n 's/^TCP data split:[[:space:]]*//p')"
        else
            say "no gve netdev found"; rc=1
        fi
    fi
    { smc_ueid && smc_ready; } || { say "SMC setup failed: $(tail -n 2 /job/smc-setup.a.log)"; rc=1; }
    step_end 1 $rc "$DEV gid=${G:-?} gve=${GVE:--}"

    # ---- step 2: b's
    step_wait 2; step_end 2 0 idle

    # ---- step 3: SMC-R server
    step_wait 3
    say "SMC-R server on $A:7781 over $DEV: $DEMO_BYTES each way, every byte checked"
    timeout -k 5 900 smc-guest-tests stream server --proto smc --addr $A --port 7781 --bytes "$DEMO_BYTES" \
        --direction both --seed 3 --expect-mode smcr --once --accept-timeout 300 --io-timeout 120 \
        >/job/smcr.a.log 2>&1
    rc=$?
    say "$(stream_line /job/smcr.a.log)"
    step_end 3 $rc ""

    # ---- step 4: ibv_rc_pingpong against the virtual host
    step_wait 4
    say "ibv_rc_pingpong -d $DEV -g $G -p 18515 $VH"
    timeout 300 ibv_rc_pingpong -d $DEV -g "$G" -p 18515 $VH >/job/pingpong.a.log 2>&1
    rc=$?
    say "$(tail -n 1 /job/pingpong.a.log)"
    step_end 4 $rc ""

    # ---- step 5: b's
    step_wait 5; step_end 5 0 idle

    # ---- step 6: TCP over the gVNIC
    step_wait 6
    if [ -n "$GVE" ]; then
        h0=$(ethtool -S "$GVE" | sed -n 's/^ *rx_hsplit_pkt: //p')
        say "TCP server on $GA:5201 (gVNIC $GVE, header split on): $DEMO_BYTES each way"
        timeout -k 5 600 smc-guest-tests stream server --proto tcp --addr $GA --port 5201 --bytes "$DEMO_BYTES" \
            --direction both --seed 5 --once --accept-timeout 300 >/job/gve.a.log 2>&1
        rc=$?
        h1=$(ethtool -S "$GVE" | sed -n 's/^ *rx_hsplit_pkt: //p')
        say "$(stream_line /job/gve.a.log)"
        say "guest driver: rx_hsplit_pkt +$((${h1:-0} - ${h0:-0}))"
        step_end 6 $rc "guest_rx_hsplit_pkt=$((${h1:-0} - ${h0:-0}))"
    else
        step_end 6 0 skip
    fi

    # ---- step 7: the host reads the daemon's view while we are still up
    step_wait 7
    say "done"
}

role_b() {
    say "kernel $(uname -r); RDMA: siw, then rxe"
    # ---- step 1: devices up. rdma_cm takes the first RDMA device on eth0,
    # so siw0 (iWARP, step 2) and rxe0 (RoCE, steps 3-5) take turns.
    rc=0
    net_up $A || rc=1
    rdma link add siw0 type siw netdev eth0 || rc=1
    active siw0 || { say "siw0 is not ACTIVE"; rc=1; }
    say "$(rdma link show siw0/1 | sed 's/ *$//')"
    smc_ueid || { say "SMC: ueid add failed: $(tail -n 2 /job/smc-setup.b.log)"; rc=1; }
    step_end 1 $rc "siw0"

    # ---- step 2: rping over iWARP
    step_wait 2
    say "rping -c -a $VH -p 7174 -C 10 -v -V (siw0, iWARP)"
    rping_to 7174 /job/rping-iwarp.b.log
    rc=$?
    step_end 2 $rc ""

    # ---- step 3: SMC-R client over rxe0
    step_wait 3
    rc=0
    rdma link delete siw0 || rc=1
    rdma link add rxe0 type rxe netdev eth0 || rc=1
    active rxe0 || { say "rxe0 is not ACTIVE"; rc=1; }
    G=$(roce_gid_index rxe0 $B) || { say "rxe0: no RoCE v2 GID for $B"; rc=1; }
    say "siw0 deleted, $(rdma link show rxe0/1 | sed 's/ *$//'); RoCE v2 GID index ${G:-?}"
    smc_ready || { say "SMC setup failed: $(tail -n 2 /job/smc-setup.b.log)"; rc=1; }
    say "SMC-R client to $A:7781 over rxe0"
    timeout -k 5 900 smc-guest-tests stream client --proto smc --addr $A --port 7781 --bytes "$DEMO_BYTES" \
        --direction both --seed 3 --expect-mode smcr --connect-timeout 120 --io-timeout 120 \
        >/job/smcr.b.log 2>&1 || rc=1
    say "$(stream_line /job/smcr.b.log)"
    step_end 3 $rc ""

    # ---- step 4: ibv_rc_pingpong against the virtual host
    step_wait 4
    say "ibv_rc_pingpong -d rxe0 -g $G -p 18516 $VH"
    timeout 300 ibv_rc_pingpong -d rxe0 -g "$G" -p 18516 $VH >/job/pingpong.b.log 2>&1
    rc=$?
    say "$(tail -n 1 /job/pingpong.b.log)"
    step_end 4 $rc ""

    # ---- step 5: rping over RoCE (rdma_cm: IB CM MADs on QP1)
    step_wait 5
    say "rping -c -a $VH -p 7174 -C 10 -v -V (rxe0, RoCE)"
    rping_to 7174 /job/rping-roce.b.log
    rc=$?
    step_end 5 $rc ""

    # ---- step 6: TCP to a's gVNIC
    step_wait 6
    if [ "$DEMO_GVE" = 1 ]; then
        ip addr add $GB/24 dev eth0
        say "TCP client to $GA:5201 (a's gVNIC) from $GB"
        timeout -k 5 600 smc-guest-tests stream client --proto tcp --addr $GA --port 5201 --bytes "$DEMO_BYTES" \
            --direction both --seed 5 --connect-timeout 120 >/job/gve.b.log 2>&1
        rc=$?
        say "$(stream_line /job/gve.b.log)"
        step_end 6 $rc ""
    else
        step_end 6 0 skip
    fi

    # ---- step 7: the host reads the daemon's view
    step_wait 7
    say "done"
}

case "$ROLE" in
    a) role_a ;;
    b) role_b ;;
    *) echo "demo-guest.sh: unknown role $ROLE" >&2; exit 2 ;;
esac
exit 0
