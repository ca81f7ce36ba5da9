# shellcheck shell=sh
# soak-lib.sh: guest side of scripts/soak.sh (one daemon, four guests, two
# pairs looping verified RDMA / SMC-R transfers for N minutes).
#
# Sourced after ci-lib.sh (same ROLE/SELF/PEER/CELL variables, same barriers,
# CI-TEST lines and checks). Pair 2 also gets SELF1/PEER1: the addresses of
# eth1, where rxe0 lives (siw0 is on eth0, so rdma_cm's address resolution
# for rping picks siw0 without ambiguity).
#
# Rounds: before each round a guest writes its round number to /job/round,
# then reads /job/stop (written by the host when the time is up): the host
# puts there a round number R above every round either guest of the pair had
# reached, so both guests stop at the same round R without talking to each
# other (a guest that stopped would leave its peer waiting at a barrier).

SOAK_SMC_BYTES=${SOAK_SMC_BYTES:-4M}
SOAK_PERFTEST_ITERS=${SOAK_PERFTEST_ITERS:-100}
soak_round=0

# soak_next: 0 (true) while the pair should run another round
soak_next() {
    soak_round=$((soak_round + 1))
    echo "$soak_round" >/job/round.tmp && mv /job/round.tmp /job/round
    if [ -f /job/stop ]; then
        _stop=$(cat /job/stop 2>/dev/null)
        if [ -n "$_stop" ] && [ "$soak_round" -ge "$_stop" ]; then
            say "soak: stopping before round $soak_round (stop round $_stop)"
            echo "SOAK-DONE rounds=$((soak_round - 1))"
            return 1
        fi
    fi
    say "soak: round $soak_round"
    return 0
}

# soak_verbs NAME DEV PORT TESTS SERVER_ADDR: one `smc-guest-tests verbs` run
# of the comma list TESTS (ci-lib.sh verbs_run, verbs_results); one CI-TEST
# line per test (NAME-TEST)
soak_verbs() {
    _dev=$2
    verbs_run "$1" "$3" "$5" --tests "$4" --seed "$soak_round"
    verbs_results "$1" "$(echo "$4" | tr ',' ' ')"
    [ $_bad = 0 ] || show_log "$_log" 30
    barrier "$1 done"
}

# pair 1: SMC-R streams over rxe (UEID set), verified, both directions
soak_pair_smcr() {
    smc_setup yes
    barrier "smc ready"
    while soak_next; do
        smc_stream "smc-$soak_round" smcr "$SOAK_SMC_BYTES" 2 both $((7800 + soak_round % 100))
    done
    diag rxe0
    say "soak done"
}

# pair 2: siw on eth0 (rping -V, verbs write/read) and rxe on eth1
# (ib_write_bw, verbs send/write/read)
soak_pair_rdma() {
    # both NICs share one L2 fabric: each answers ARP only for its own address
    sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 2>/dev/null ||
        { echo 1 >/proc/sys/net/ipv4/conf/all/arp_ignore; echo 2 >/proc/sys/net/ipv4/conf/all/arp_announce; }
    net_up
    if ! rdma_dev_up siw siw0 eth0 || ! rdma_dev_up rxe rxe0 eth1; then
        echo "CI-ABORT reason=link-add"
        exit 0
    fi
    [ "${CI_SIW_TRACE:-1}" != 0 ] && siw_trace_on
    gidx=$(roce_gid_index rxe0 "$SELF1")
    [ -n "$gidx" ] || { say "no RoCE v2 GID for $SELF1 on rxe0"; gidx=1; }
    until ping -c 1 -W 2 "$PEER1" >/dev/null 2>&1; do sleep 1; done
    barrier "devices up"
    while soak_next; do
        _p=$((18000 + (soak_round % 100) * 10))
        # ci-lib.sh names the known siw races only for cells called */siw*
        CELL=7.3/siw-soak
        RPING_COUNT=10 tool_test "rping-siw-$soak_round" cm "$_p" \
            "rping -s -a $SELF -p $_p -C 10 -v -V" \
            "rping -c -a $PEER -p $_p -C 10 -v -V" check_rping
        if [ "$ROLE" = server ]; then _sa=$SELF; else _sa=$PEER; fi
        soak_verbs "verbs-siw-$soak_round" siw0 $((_p + 2)) write,read "$_sa"
        # shellcheck disable=SC2034  # read by ci-lib.sh tool_test
        CELL=7.3/rxe-soak
        tool_test "ib_write_bw-rxe-$soak_round" tcp $((_p + 4)) \
            "ib_write_bw -d rxe0 -x $gidx -n $SOAK_PERFTEST_ITERS -p $((_p + 4))" \
            "ib_write_bw -d rxe0 -x $gidx -n $SOAK_PERFTEST_ITERS -p $((_p + 4)) $PEER1" check_perftest
        if [ "$ROLE" = server ]; then _sa=$SELF1; else _sa=$PEER1; fi
        soak_verbs "verbs-rxe-$soak_round" rxe0 $((_p + 6)) send,write,read "$_sa"
    done
    diag siw0
    diag rxe0
    [ "${CI_SIW_TRACE:-1}" != 0 ] && siw_trace_dump
    say "soak done"
}
