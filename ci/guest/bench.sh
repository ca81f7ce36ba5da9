# shellcheck shell=sh
# bench.sh: the guest side of the runner's benches (guest-runner
# bench-smc, bench-erdma, bench-vhost, bench-gve; sourced after ci-lib.sh).
#
# bench_one PROTO CONNS PORT: one `smc-guest-tests stream --proto PROTO
# --direction c2s` run, CI_BENCH_TOTAL_MIB split over CONNS connections,
# every byte verified (--proto smc: --expect-mode smcr, no TCP fallback).
# bench_write: ib_write_bw -s CI_BENCH_SIZE -n CI_BENCH_ITERS on this
# guest's RDMA device. Around each run both guests sample the `cpu` line of
# /proc/stat and /proc/uptime (whole guest: SMC-R's and rxe's kernel work
# runs largely in softirq / kworkers, which getrusage of the tool does not
# see) and print
#   CI-BENCH proto=P conns=C role=R rc=N ... mibps=X cpu_s=Y (tool) \
#            guest_user_s= guest_sys_s= guest_irq_s= guest_softirq_s= guest_busy_s= guest_wall_s= smc_mode=M

CI_BENCH_CONNS=${CI_BENCH_CONNS:-1 4}
CI_BENCH_TOTAL_MIB=${CI_BENCH_TOTAL_MIB:-128}
CI_BENCH_PROTOS=${CI_BENCH_PROTOS:-smc tcp}

# USER_HZ ticks: user nice system idle iowait irq softirq steal, then /proc/uptime (s): up idle
# The guest kernel uses tick-sampled CPU accounting (TICK_CPU_ACCOUNTING, no
# IRQ_TIME_ACCOUNTING), which under TCG undercounts busy time (fewer ticks land
# than the process's precise runtime), while idle time is measured exactly
# (NO_HZ_IDLE). So whole-guest busy = elapsed - idle from /proc/uptime (1 vCPU);
# the /proc/stat ticks only give the user/system/softirq split.
bench_stat() {
    awk '$1 == "cpu" { printf "%s %s %s %s %s %s %s %s ", $2, $3, $4, $5, $6, $7, $8, $9; exit }' /proc/stat
    cat /proc/uptime
}

# bench_busy BEFORE AFTER: the guest's CPU between two bench_stat samples
bench_busy() {
    # fields: $1-$8 ticks before, $9 $10 uptime/idle before, $11-$18 ticks after, $19 $20 uptime/idle after
    echo "$1 $2" | awk '{
        hz = 100
        us = ($11 + $12 - $1 - $2) / hz; sy = ($13 - $3) / hz; ir = ($16 - $6) / hz
        si = ($17 - $7) / hz; st = ($18 - $8) / hz; io = ($15 - $5) / hz
        wall = $19 - $9; idle = $20 - $10
        printf "guest_user_s=%.2f guest_sys_s=%.2f guest_irq_s=%.2f guest_softirq_s=%.2f guest_ticks_busy_s=%.2f guest_busy_s=%.2f guest_wall_s=%.2f",
            us, sy, ir, si, us + sy + ir + si + st, wall - idle - io, wall }'
}

bench_one() {
    _proto=$1 _conns=$2 _port=$3
    _per=$((CI_BENCH_TOTAL_MIB / _conns))
    _name=bench-$_proto-$_conns
    _log=$CI_LOGDIR/$_name.$ROLE.log
    _common="--proto $_proto --port $_port --bytes ${_per}M --conns $_conns --direction c2s --seed 5 --io-timeout 300"
    [ "$_proto" = smc ] && _common="$_common --expect-mode smcr"
    barrier "$_name start"
    if [ "$ROLE" = server ]; then
        _cmd="smc-guest-tests stream server --addr $SELF $_common --once --accept-timeout 300"
    else
        # let the server reach accept() first; the client retries its connect anyway
        sleep 2
        _cmd="smc-guest-tests stream client --addr $PEER $_common --connect-timeout 120"
    fi
    say "$_name: $_cmd"
    echo "+ $_cmd" >"$_log"
    _s0=$(bench_stat)
    # shellcheck disable=SC2086
    timeout -k 5 "$CI_STREAM_TIMEOUT" $_cmd >>"$_log" 2>&1
    _rc=$?
    _s1=$(bench_stat)
    echo "rc=$_rc" >>"$_log"
    _res=$(grep '^STREAM-RESULT' "$_log" | tail -n 1)
    _g=$(bench_busy "$_s0" "$_s1")
    _f() { echo "$_res" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
    echo "CI-BENCH proto=$_proto conns=$_conns role=$ROLE rc=$_rc status=$(_f status) verified=$(_f verified) bytes=$(_f total_bytes) secs=$(_f secs) mibps=$(_f mibps) cpu_s=$(_f cpu_s) cpu_s_per_gib=$(_f cpu_s_per_gib) smc_mode=$(_f smc_mode) $_g"
    if [ "$_rc" = 0 ] && echo "$_res" | grep -q 'verified=1' && echo "$_res" | grep -q 'status=pass'; then
        result "$_name" PASS "$(_f secs | cut -d. -f1)" "$(_f mibps)" "$_res"
    else
        result "$_name" FAIL 0 "$(_f mibps)" "rc=$_rc ${_res:-no STREAM-RESULT}; $(grep -E 'error|fallback' "$_log" | head -n 2 | tr '\n' ' ')"
        show_log "$_log" 30
    fi
    # SMC-R close / link group teardown can take ~30 s: both sides done before the next phase
    barrier "$_name done"
}

cell_smc_bench() {
    smc_setup yes
    barrier "smc ready"
    _port=7790
    for _c in $CI_BENCH_CONNS; do
        for _p in $CI_BENCH_PROTOS; do
            _port=$((_port + 1))
            bench_one "$_p" "$_c" "$_port"
        done
    done
    diag rxe0
    say "cell done"
}

# bench_write: ib_write_bw between the guests on CI_RDMA_DEV (rxe0 or the
# erdma function), one row per role with the guest's CPU around it
# (CI_BENCH_QP_TIMEOUT: its -u; a TCG guest can stall longer than the
# default 67 ms, and rxe then fails the run with RETRY_EXC_ERR)
bench_write() {
    _gx=$(roce_gid_index "$CI_RDMA_DEV" "$SELF") || _gx=1
    _pt="ib_write_bw -d $CI_RDMA_DEV -x $_gx ${CI_BENCH_QP_TIMEOUT:+-u $CI_BENCH_QP_TIMEOUT} -s $CI_BENCH_SIZE -n $CI_BENCH_ITERS -p 18601"
    _s0=$(bench_stat)
    tool_test write-bw tcp 18601 "$_pt" "$_pt $PEER" check_perftest
    _s1=$(bench_stat)
    echo "CI-BENCH proto=write conns=1 role=$ROLE status=$_st mibps=$(perftest_bw "$CI_LOGDIR/write-bw.$ROLE.log") bytes=$((CI_BENCH_SIZE * CI_BENCH_ITERS)) $(bench_busy "$_s0" "$_s1")"
}

# cell_erdma_bench: ib_write_bw, then one SMC-Rv2 stream, on this cell's
# RDMA device (the erdma functions, or rxe on both)
cell_erdma_bench() {
    smc_setup yes
    barrier "devices up"
    bench_write
    bench_one smc 1 7790
    diag "$CI_RDMA_DEV"
    say "cell done"
}

# cell_vhost_bench: ib_write_bw from the client over rxe, first to the
# server guest, then to the virtual host vh (CI_VHOST, its write-bw-server
# on port 18600), each with the guest's CPU around it
cell_vhost_bench() {
    net_up
    rdma_dev_up rxe rxe0 || { echo "CI-ABORT reason=link-add"; exit 0; }
    barrier "devices up"
    bench_write
    [ "$ROLE" = client ] || return 0
    _s0=$(bench_stat)
    host_test write-bw-vhost check_perftest_row ib_write_bw -d rxe0 -x "$_gx" \
        ${CI_BENCH_QP_TIMEOUT:+-u $CI_BENCH_QP_TIMEOUT} -p 18600 -s "$CI_BENCH_SIZE" -n "$CI_BENCH_ITERS" "$CI_VHOST"
    _s1=$(bench_stat)
    echo "CI-BENCH proto=vhost conns=1 role=client status=$_st mibps=$(perftest_bw "$CI_LOGDIR/write-bw-vhost.client.log") $(bench_busy "$_s0" "$_s1")"
    say "cell done"
}

# gcpu: busy ticks (USER_HZ; user nice system irq softirq steal, all
# vCPUs), interrupts and TCP segments retransmitted so far
gcpu() {
    awk '/^cpu /{b=$2+$3+$4+$7+$8+$9} /^intr /{i=$2}
         /^Tcp:/{if(!c){for(k=1;k<=NF;k++)if($k=="RetransSegs")c=k}else r=$c}
         END{print b, i, r}' /proc/stat /proc/net/snmp
}

# gve_xfer NAME PORT 'RECEIVER' 'SENDER': one transfer of smc-guest-tests'
# RECEIVER (server, listening on PORT) and SENDER (client) between
# barriers, after a 3 s gap (the daemon's CPU sampler tells the transfers
# apart by it); prints both guests' CPU around it and the tool's result:
#   CI-BENCH proto=NAME role=R rc=N busy_ticks= intr= retrans= RESULT-FIELDS...
gve_xfer() {
    _n=$1 _port=$2
    _log=$CI_LOGDIR/$_n.$ROLE.log
    barrier "$_n start"
    sleep 3
    _c0=$(gcpu)
    if [ "$ROLE" = server ]; then
        # shellcheck disable=SC2086 # the tool's arguments
        smc-guest-tests $3 >"$_log" 2>&1 &
        srv_pid=$!
        wait_listen tcp "$_port"
        barrier "$_n listening"
        wait "$srv_pid"
        _rc=$?
        srv_pid=
    else
        barrier "$_n listening"
        # shellcheck disable=SC2086
        smc-guest-tests $4 >"$_log" 2>&1
        _rc=$?
    fi
    _c1=$(gcpu)
    _res=$(grep -E '^(STREAM|DEVMEM)-RESULT' "$_log" | tail -n 1)
    echo "CI-BENCH $(echo "$_c0 $_c1" | awk '{ printf "busy_ticks=%d intr=%d retrans=%d", $4 - $1, $5 - $2, $6 - $3 }') ${_res#*-RESULT } proto=$_n role=$ROLE rc=$_rc"
    if [ $_rc = 0 ]; then
        result "$_n" PASS 0 "$(echo "$_res" | sed -n 's/.* mibps=\([0-9.]*\).*/\1/p')" "$_res"
    else
        result "$_n" FAIL 0 "" "rc=$_rc $(tail -n 2 "$_log" | tr '\n' ' ')"
    fi
    barrier "$_n done"
}

# cheap_xfer NIC SUFFIX: the cheap sender (devmem-send into devmem-recv
# --ordinary) into the server's virtio-net eth0 (NIC virtio) or gVNIC (gve)
cheap_xfer() {
    if [ "$1" = virtio ]; then
        gve_xfer "cheap-virtio$2" 5304 "devmem-recv --ordinary --listen $_va:5304 $_rx" "devmem-send --to $_va:5304 $_tx"
    else
        gve_xfer "cheap-gve$2" 5305 "devmem-recv --ordinary --listen $GVE_SRV:5305 $_rx" "devmem-send --to $GVE_SRV:5305 $_tx"
    fi
}

# cell_gve_bench: TCP into the server through its virtio-net eth0 and
# through its gVNIC, from the same client, CI_BENCH_BYTES each: the cheap
# sender on each NIC, CI_BENCH_ROUNDS times (rounds after the first swap
# which NIC goes first, and are named cheap-virtio-K, cheap-gve-K), the
# stream tool on each NIC, then devmem TCP into a udmabuf and its control
# (the same receiver and sender on a flow RSS keeps on an ordinary queue)
cell_gve_bench() {
    gve_up
    _va=$SELF _b=$CI_BENCH_BYTES
    [ "$ROLE" = client ] && _va=$PEER
    _rx="--bytes $_b --pattern-mod 7 --accept-timeout 300"
    _tx="--bytes $_b --pattern-mod 7 --connect-timeout 300"
    _st="--proto tcp --bytes $_b --seed 81"
    cheap_xfer virtio ""
    cheap_xfer gve ""
    _k=2
    while [ "$_k" -le "${CI_BENCH_ROUNDS:-1}" ]; do
        if [ $((_k % 2)) = 0 ]; then
            cheap_xfer gve "-$_k"
            cheap_xfer virtio "-$_k"
        else
            cheap_xfer virtio "-$_k"
            cheap_xfer gve "-$_k"
        fi
        _k=$((_k + 1))
    done
    gve_xfer stream-virtio 5301 "stream server --addr $_va --port 5301 $_st --once --accept-timeout 300" \
        "stream client --addr $_va --port 5301 $_st --connect-timeout 300"
    gve_xfer stream-gve 5306 "stream server --addr $GVE_SRV --port 5306 $_st --once --accept-timeout 300" \
        "stream client --addr $GVE_SRV --port 5306 $_st --connect-timeout 300"
    # devmem's NIC setup, what ncdevmem -l does before it binds (devmem.rst,
    # "NIC Setup"): header split on, RSS only onto queue 0, the flow (the
    # sender binds port 5302 too) onto queue 1, which gets the dmabuf
    if [ "$ROLE" = server ]; then
        ethtool -G "$GVE_IF" tcp-data-split on && ethtool -K "$GVE_IF" ntuple on &&
            ethtool -X "$GVE_IF" equal 1 &&
            ethtool -N "$GVE_IF" flow-type tcp4 src-ip 10.78.0.2 dst-ip "$GVE_SRV" src-port 5302 dst-port 5302 action 1 ||
            say "devmem NIC setup failed"
    fi
    gve_xfer devmem 5302 "devmem-recv --dev ${GVE_IF:-} --queue 1 --listen $GVE_SRV:5302 $_rx" \
        "devmem-send --to $GVE_SRV:5302 --bind 10.78.0.2:5302 $_tx"
    gve_xfer control 5303 "devmem-recv --dev ${GVE_IF:-} --queue 1 --listen $GVE_SRV:5303 $_rx --allow-ordinary" \
        "devmem-send --to $GVE_SRV:5303 --bind 10.78.0.2:5303 $_tx"
    say "cell done"
}
