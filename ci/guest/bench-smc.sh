# shellcheck shell=sh
# bench-smc.sh: guest side of ci/bench-smc.sh (sourced after ci-lib.sh).
#
# SMC-R vs TCP between the same two guests, same bytes: for each CONNS in
# $CI_BENCH_CONNS, one `smc-guest-tests stream --proto P --direction c2s`
# round per proto, BENCH_BYTES_TOTAL split over the connections. Around every
# stream run each guest samples the `cpu` line of /proc/stat (whole guest:
# user, nice, system, irq, softirq, steal; SMC-R's kernel work runs largely in
# softirq / kworkers, which getrusage of the tool does not see) and prints
#   CI-BENCH proto=P conns=C role=R rc=N bytes=B secs=S mibps=X cpu_s=Y (tool) \
#            guest_user_s= guest_sys_s= guest_irq_s= guest_softirq_s= guest_busy_s= guest_wall_s= smc_mode=M
# The stream tool verifies every byte; --proto smc uses --expect-mode smcr (no TCP fallback).

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
    # fields: $1-$8 ticks before, $9 $10 uptime/idle before, $11-$18 ticks after, $19 $20 uptime/idle after
    _g=$(echo "$_s0 $_s1" | awk '{
        hz = 100
        us = ($11 + $12 - $1 - $2) / hz; sy = ($13 - $3) / hz; ir = ($16 - $6) / hz
        si = ($17 - $7) / hz; st = ($18 - $8) / hz; io = ($15 - $5) / hz
        wall = $19 - $9; idle = $20 - $10
        printf "guest_user_s=%.2f guest_sys_s=%.2f guest_irq_s=%.2f guest_softirq_s=%.2f guest_ticks_busy_s=%.2f guest_busy_s=%.2f guest_wall_s=%.2f",
            us, sy, ir, si, us + sy + ir + si + st, wall - idle - io, wall }')
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
