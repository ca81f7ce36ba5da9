# shellcheck shell=sh
# ci-lib.sh: guest side of the guest test matrix (ci/matrix.sh): the
# switch, RSS, the gVNIC, virtual hosts, RDMA, SMC-R, the upstream suites,
# device faults.
#
# Sourced by the per-guest job script that the matrix writes (run by
# vr-init with /bin/sh = dash, in /job, PATH starting with /opt/vr/bin). The
# job sets
#     ROLE=server|client  SELF=<own IPv4>  PEER=<peer IPv4>  CELL=<cell name>
# and calls one of the cell_* functions of this file (a one-guest cell's
# PEER is the daemon's virtual host vh).
#
# Every test prints exactly one line per guest:
#     CI-TEST test=NAME role=ROLE status=PASS|FAIL|SKIP secs=N [bw=MiB/s] reason="..."
# The host combines the two guests' lines: FAIL if either side failed, SKIP if
# both skipped, PASS otherwise. Tool output goes to /job/<test>.<role>.log and
# is echoed (tail) to the console when a test fails.
#
# The two guests keep in step with barriers: a zero-byte `smc-guest-tests
# stream --proto tcp` round on port 9100+N (the server side listens, the
# client side retries its connect), so neither guest starts a phase before the
# other has finished the previous one. A lost barrier (peer dead) aborts the
# job: the host reports the tests without a result as FAIL.

: "${ROLE:?}" "${SELF:?}" "${PEER:?}" "${CELL:=cell}"
# roce_gid_index, rping_pings: scripts/guest/rdma-lib.sh, shipped beside this file.
. /opt/vr/ci/rdma-lib.sh
CI_BARRIER_TIMEOUT=${CI_BARRIER_TIMEOUT:-300}
CI_TOOL_TIMEOUT=${CI_TOOL_TIMEOUT:-180}
CI_LOGDIR=${CI_LOGDIR:-/job}
CI_UEID=${CI_UEID:-VHOST-RDMA-CI}
CI_STREAM_TIMEOUT=${CI_STREAM_TIMEOUT:-1800}
CI_SMC_BYTES=${CI_SMC_BYTES:-64M}
CI_SMC_BIG_BYTES=${CI_SMC_BIG_BYTES:-256M}
CI_SMC_MANY_BYTES=${CI_SMC_MANY_BYTES:-256K}
CI_FAILOVER_BYTES=${CI_FAILOVER_BYTES:-512M}
CI_PERFTEST_ITERS=${CI_PERFTEST_ITERS:-500}
CI_VERBS_SIZE=${CI_VERBS_SIZE:-61441}
CI_VERBS_ITERS=${CI_VERBS_ITERS:-8}
CI_VERBS_TESTS="send send_imm write write_imm read cas faa"
# This guest's RDMA device for the SMC-R cells: rxe (rdma link add rxe0 on
# eth0) or erdma (the daemon's emulated function, erdma_0, probed at boot).
CI_RDMA=${CI_RDMA:-rxe}
if [ "$CI_RDMA" = erdma ]; then CI_RDMA_DEV=${CI_RDMA_DEV:-erdma_0}; else CI_RDMA_DEV=${CI_RDMA_DEV:-${CI_RDMA}0}; fi
ci_barrier_n=0

# The kernel's text symbols, for the host: if this guest stops answering,
# the matrix (guest-runner stuck-diagnosis) samples its CPU's RIP through QEMU's monitor and names the
# functions it spins in (StuckGuestWatch). Copied whole in the background
# (the host keeps the text symbols; filtering here under TCG takes minutes);
# a guest that cannot read them just leaves no file.
[ -z "${CI_NO_KALLSYMS:-}" ] && [ -r /proc/kallsyms ] && [ -d /job ] &&
    (cat /proc/kallsyms >/job/kallsyms.tmp 2>/dev/null && mv /job/kallsyms.tmp /job/kallsyms) &

say() { echo "[ci $CELL/$ROLE] $*"; }

# result TEST STATUS SECS BW REASON
result() {
    _bw=
    [ -n "$4" ] && _bw=" bw=$4"
    # keep the reason on one line, without double quotes
    _r=$(printf '%s' "$5" | tr '\n"' "  " | cut -c1-400)
    echo "CI-TEST test=$1 role=$ROLE status=$2 secs=$3$_bw reason=\"$_r\""
}

now() { date +%s; }

# show_log FILE: the tail of a tool's output, indented (for failures)
show_log() {
    echo "----- tail of $1"
    tail -n "${2:-25}" "$1" 2>/dev/null | sed 's/^/    | /'
    echo "-----"
}

# barrier LABEL: both guests reach this point, or the job aborts.
barrier() {
    ci_barrier_n=$((ci_barrier_n + 1))
    _bport=$((9100 + ci_barrier_n))
    _blog=$CI_LOGDIR/barrier-$ci_barrier_n.$ROLE.log
    if [ "$ROLE" = server ]; then
        smc-guest-tests stream server --proto tcp --addr "$SELF" --port "$_bport" --bytes 0 \
            --once --accept-timeout "$CI_BARRIER_TIMEOUT" >"$_blog" 2>&1
    else
        smc-guest-tests stream client --proto tcp --addr "$PEER" --port "$_bport" --bytes 0 \
            --connect-timeout "$CI_BARRIER_TIMEOUT" >"$_blog" 2>&1
    fi
    _brc=$?
    if [ $_brc -ne 0 ]; then
        say "BARRIER $ci_barrier_n ($1) FAILED (rc=$_brc): the peer guest did not arrive within ${CI_BARRIER_TIMEOUT}s"
        show_log "$_blog" 10
        echo "CI-ABORT barrier=$ci_barrier_n label=$1"
        exit 0
    fi
    say "barrier $ci_barrier_n ($1) passed"
}

# wait_carrier: eth0 up with carrier and the peer pingable
net_up() {
    _i=0
    while [ "$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do
        _i=$((_i + 1))
        if [ $_i -ge 30 ]; then
            say "eth0 has no carrier after 30 s (vhost-user backend not connected?)"
            ip link show eth0
            echo "CI-ABORT reason=no-carrier"
            exit 0
        fi
        sleep 1
    done
    _i=0
    until ping -c 1 -W 2 "$PEER" >/dev/null 2>&1; do
        _i=$((_i + 1))
        [ $_i -ge 60 ] && break
        sleep 1
    done
    if ! ping -c 3 -W 5 "$PEER"; then
        say "cannot ping $PEER"
        echo "CI-ABORT reason=no-ping"
        exit 0
    fi
}

# rdma_dev_up TYPE DEV: rdma link add DEV type TYPE netdev eth0, wait for ACTIVE
# erdma_up DEV NETDEV: the emulated erdma function (the daemon's kind=erdma
# port, a vfio-user PCI device) has no `rdma link add`: the driver probes it
# at boot and binds it to the netdev with its MAC. Test "erdma-up": DEV is
# bound to NETDEV and its port ACTIVE.
erdma_up() {
    _i=0
    until rdma link show "$1/1" 2>/dev/null | grep -q "state ACTIVE.* netdev $2"; do
        _i=$((_i + 1))
        if [ $_i -ge 60 ]; then
            result erdma-up FAIL $(($(now) - _t0)) "" "$1 not ACTIVE on $2 after 60 s: $(rdma link show 2>&1 | tr '\n' ' '); $(dmesg | grep -i erdma | tail -n 3 | tr '\n' ' ')"
            return 1
        fi
        sleep 1
    done
    rdma link show "$1/1"
    ibv_devices
    result erdma-up PASS $(($(now) - _t0)) "" "$(rdma link show "$1/1" 2>&1)"
}

rdma_dev_up() {
    _t0=$(now)
    _log=$CI_LOGDIR/link-add.$ROLE.log
    _nd=${3:-eth0}
    [ "$1" = erdma ] && { erdma_up "$2" "$_nd"; return; }
    if ! rdma link add "$2" type "$1" netdev "$_nd" >"$_log" 2>&1; then
        result "link-add-$1" FAIL $(($(now) - _t0)) "" "rdma link add $2 type $1 netdev $_nd: $(cat "$_log")"
        return 1
    fi
    _i=0
    until rdma link show "$2/1" 2>/dev/null | grep -q 'state ACTIVE'; do
        _i=$((_i + 1))
        if [ $_i -ge 30 ]; then
            rdma link show >>"$_log" 2>&1
            result "link-add-$1" FAIL $(($(now) - _t0)) "" "$2 port 1 not ACTIVE after 30 s: $(rdma link show "$2/1" 2>&1)"
            return 1
        fi
        sleep 1
    done
    rdma link show "$2/1"
    ibv_devices
    result "link-add-$1" PASS $(($(now) - _t0)) "" "$(rdma link show "$2/1" 2>&1)"
}

# wait_listen tcp|cm PORT: until something listens on PORT (TCP socket or
# rdma_cm id). Best effort: after 30 s it gives up and lets the client try.
wait_listen() {
    _i=0
    while [ $_i -lt 60 ]; do
        case "$1" in
            tcp) ss -ltnH "sport = :$2" 2>/dev/null | grep -q . && return 0 ;;
            cm) rdma resource show cm_id 2>/dev/null | grep LISTEN | grep -Eq ":$2( |$)" && return 0 ;;
        esac
        # the server died early: no point in waiting
        [ -n "${srv_pid:-}" ] && ! kill -0 "$srv_pid" 2>/dev/null && return 1
        _i=$((_i + 1))
        sleep 0.5
    done
    say "warning: no $1 listener on port $2 after 30 s"
    return 1
}

# perftest_bw LOG: "BW average[MiB/sec]" of the first result row, in MiB/s
# (perftest 25 prints MiB/sec; older ones MB/sec, converted)
perftest_bw() {
    awk '/BW average\[MiB/ { h = 1; f = 1; next }
         /BW average\[MB/ { h = 1; f = 1000000 / 1048576; next }
         h && NF >= 4 && $1 ~ /^[0-9]+$/ { printf "%.2f\n", $4 * f; exit }' "$1"
}

# ---------------------------------------------------------------------------
# two-sided test runner
#
# tool_test NAME LISTEN PORT 'SERVER CMD' 'CLIENT CMD' CHECK
#   LISTEN: tcp|cm (how the server side's readiness is detected)
#   CHECK: a function called as CHECK LOG RC that prints "PASS|FAIL reason"
#          on stdout (may also print "BW=x" on a second line)
# Sequence: barrier; server starts its side in the background and waits for
# its listener; barrier; client runs; both judge their own output; barrier.
tool_test() {
    _name=$1 _lkind=$2 _port=$3 _scmd=$4 _ccmd=$5 _check=$6
    _log=$CI_LOGDIR/$_name.$ROLE.log
    barrier "$_name start"
    siw_trace_mark "$_name start"
    _t0=$(now)
    if [ "$ROLE" = server ]; then
        say "$_name server: $_scmd"
        echo "+ $_scmd" >"$_log"
        # shellcheck disable=SC2086
        timeout -k 5 "$CI_TOOL_TIMEOUT" $_scmd >>"$_log" 2>&1 &
        srv_pid=$!
        # a server still running at half its timeout is probably hung: snapshot its
        # TCP sockets (siw runs its QPs on kernel TCP sockets: a non-zero Recv-Q
        # there = data the QP never consumed) and the siw trace so far
        # (its sleep must not hold the console pipe: the watcher is killed when
        # the server ends, and vr-init's tee waited for every holder, 80 s of
        # each rxe cell once)
        ( sleep $((CI_TOOL_TIMEOUT / 2)) >/dev/null 2>&1 </dev/null; kill -0 "$srv_pid" 2>/dev/null || exit 0
          { echo "== $_name server still running after $((CI_TOOL_TIMEOUT / 2))s: ss -tnoie"; ss -tnoie
            echo "== rdma resource show cm_id / qp"; rdma resource show cm_id; rdma resource show qp
          } >"$CI_LOGDIR/$_name.$ROLE.hung.log" 2>&1
          say "$_name: server still running after $((CI_TOOL_TIMEOUT / 2))s, sockets:"
          sed 's/^/    | /' "$CI_LOGDIR/$_name.$ROLE.hung.log" ) &
        _hang_watch=$!
        wait_listen "$_lkind" "$_port"
        barrier "$_name listening"
        wait "$srv_pid"
        _rc=$?
        kill "$_hang_watch" 2>/dev/null
        srv_pid=
    else
        barrier "$_name listening"
        say "$_name client: $_ccmd"
        echo "+ $_ccmd" >"$_log"
        # shellcheck disable=SC2086
        timeout -k 5 "$CI_TOOL_TIMEOUT" $_ccmd >>"$_log" 2>&1
        _rc=$?
    fi
    _secs=$(($(now) - _t0))
    echo "rc=$_rc" >>"$_log"
    tool_verdict "$_check" "$_log" "$_rc"
    # server hung with unread bytes on its (siw) connection while the QP is RTS:
    # the siw_accept() lost-wakeup race (ci/README.md, "siw: rdma_cm connection setup")
    # (siw cells only: elsewhere unread bytes are just a stuck out-of-band exchange)
    _siw=; case "$CELL" in */siw*) _siw=1 ;; esac
    if [ "$_st" != PASS ] && [ -n "$_siw" ] && [ -f "$CI_LOGDIR/$_name.$ROLE.hung.log" ]; then
        _rq=$(awk -v p=":$_port" '$1 == "ESTAB" && $4 ~ p"$" && $2 > 0 { print $2; exit }' "$CI_LOGDIR/$_name.$ROLE.hung.log")
        [ -n "$_rq" ] && _why="server hung with $_rq unread bytes on its TCP connection (port $_port) while the QP is RTS: the QP never consumed the peer's first message (siw_accept lost-wakeup race, see ci/README.md); $_why"
    fi
    # active side rejected the MPA reply because the peer's first FPDU came with it
    if [ "$_st" != PASS ] && [ -n "$_siw" ] && [ -r /sys/kernel/tracing/trace ] &&
        awk -v m="CI-MARK $_name start" 'index($0, m) { on = 1; next } on' /sys/kernel/tracing/trace |
        grep -q 'siw_recv_mpa_rr.*ret=-71'; then
        _why="siw rejected the MPA reply with -EPROTO (siw_recv_mpa_rr: the server's first message arrived right behind the MPA reply; siw race, see ci/README.md); $_why"
    fi
    # CI_QUIET_RESULT: the caller judges (device-fault cells: recovery checks)
    [ -n "${CI_QUIET_RESULT:-}" ] || result "$_name" "$_st" "$_secs" "$_bw" "$_why"
    [ "$_st" = PASS ] || show_log "$_log"
    barrier "$_name done"
}

# tool_verdict CHECK LOG RC: CHECK's verdict on a tool's LOG and exit status
# RC in _st (PASS|FAIL), _why and _bw (MiB/s or empty)
tool_verdict() {
    _verdict=$("$1" "$2" "$3")
    _st=$(echo "$_verdict" | head -n 1 | cut -d' ' -f1)
    _why=$(echo "$_verdict" | head -n 1 | cut -d' ' -f2-)
    _bw=$(echo "$_verdict" | sed -n 's/^BW=//p')
    [ "$3" = 124 ] && _why="timed out after ${CI_TOOL_TIMEOUT}s; $_why"
}

# verbs_run NAME PORT SERVER_ADDR [CLIENT ARGS]: one server/client run of the
# verbs tool between barriers, the server on SERVER_ADDR; output in
# $CI_LOGDIR/NAME.$ROLE.log, rc in $_rc, seconds in $_secs. Uses $_dev.
verbs_run() {
    _name=$1 _port=$2 _saddr=$3
    shift 3
    _log=$CI_LOGDIR/$_name.$ROLE.log
    barrier "$_name start"
    siw_trace_mark "$_name start"
    _t0=$(now)
    if [ "$ROLE" = server ]; then
        _cmd="smc-guest-tests verbs server --dev $_dev --addr $_saddr --port $_port --accept-timeout $CI_TOOL_TIMEOUT"
        say "$_name server: $_cmd"
        echo "+ $_cmd" >"$_log"
        # shellcheck disable=SC2086
        timeout -k 5 "$CI_TOOL_TIMEOUT" $_cmd >>"$_log" 2>&1 &
        srv_pid=$!
        wait_listen tcp "$_port"
        barrier "$_name listening"
        wait "$srv_pid"
        _rc=$?
        srv_pid=
    else
        barrier "$_name listening"
        _cmd="smc-guest-tests verbs client --dev $_dev --peer $_saddr --port $_port --size $CI_VERBS_SIZE --iters $CI_VERBS_ITERS --connect-timeout 60 $*"
        say "$_name client: $_cmd"
        echo "+ $_cmd" >"$_log"
        # shellcheck disable=SC2086
        timeout -k 5 "$CI_TOOL_TIMEOUT" $_cmd >>"$_log" 2>&1
        _rc=$?
    fi
    echo "rc=$_rc" >>"$_log"
    _secs=$(($(now) - _t0))
}

# verbs_results PREFIX TESTS: after verbs_run, one CI-TEST line per test of
# the space list TESTS (PREFIX-send, PREFIX-write, ...) from the tool's
# VERBS-RESULT lines (both sides print the combined verdict of both sides).
# A test without a result line (setup failure, crash, timeout) is a FAIL.
# Sets _bad to 1 if any failed.
verbs_results() {
    _err=$(grep -E '^error:' "$_log" | tail -n 1)
    [ "$_rc" = 124 ] && _err="timed out after ${CI_TOOL_TIMEOUT}s; $_err"
    _bad=0
    for _t in $2; do
        _l=$(grep "^VERBS-RESULT .* test=$_t " "$_log" | tail -n 1)
        if [ -z "$_l" ]; then
            result "$1-$_t" FAIL "$_secs" "" "no VERBS-RESULT line (rc=$_rc): $_err"
            _bad=1
            continue
        fi
        _st=$(echo "$_l" | sed -n 's/.* status=\([A-Z]*\) .*/\1/p')
        _ts=$(echo "$_l" | sed -n 's/.* secs=\([0-9]*\).*/\1/p')
        _mib=$(echo "$_l" | sed -n 's/.* mibps=\([0-9.]*\) .*/\1/p')
        _why=$(echo "$_l" | sed -n 's/.* reason="\(.*\)"$/\1/p')
        case "$_t" in cas | faa) _mib= ;; esac
        [ "$_st" = SKIP ] && _mib=
        if [ "$_st" = PASS ]; then
            _why="$(echo "$_l" | sed -n 's/.* \(ops=[0-9]* bytes=[0-9]*\) .*/\1/p') verified on both sides"
        fi
        [ "$_st" = FAIL ] && _bad=1
        [ "$_st" = SKIP ] && say "SKIPPED $1-$_t: $_why"
        result "$1-$_t" "$_st" "${_ts:-0}" "$_mib" "$_why"
    done
}

# verbs_test DEV: `smc-guest-tests verbs` (ibverbs crate; QP info over TCP,
# iWARP connected through rdma_cm on port+1): every verbs test in one run
# (verbs_results), then the same run with every test's last request spoiled.
verbs_test() {
    _dev=$1
    if [ "$ROLE" = server ]; then _vsa=$SELF; else _vsa=$PEER; fi
    verbs_run verbs 18650 "$_vsa" --tests all
    verbs_results verbs "$CI_VERBS_TESTS"
    [ $_bad = 0 ] || show_log "$_log" 40
    barrier "verbs done"

    # negative: the client spoils the last request of every test (flipped
    # data byte, wrong immediate, READ address + 1, wrong compare, wrong
    # addend); every test that runs must FAIL naming what was wrong, on both
    # sides, and the tool must exit 1
    verbs_run verbs-corrupt 18652 "$_vsa" --tests all --inject-corruption all
    _nrun=$(grep -cE '^VERBS-RESULT .* status=(PASS|FAIL) ' "$_log")
    _nfail=$(grep -c '^VERBS-RESULT .* status=FAIL ' "$_log")
    _nskip=$(grep -c '^VERBS-RESULT .* status=SKIP ' "$_log")
    if [ "$_rc" = 1 ] && [ "$_nrun" -gt 0 ] && [ "$_nfail" = "$_nrun" ] && [ $((_nrun + _nskip)) = 7 ]; then
        result verbs-corrupt PASS "$_secs" "" "all $_nfail tests that ran detected the spoiled request ($_nskip skipped): $(grep -o 'test=[a-z_]* status=FAIL.*reason="[^;"]*' "$_log" | sed 's/^test=//; s/ status=FAIL.*reason="/: /' | cut -c1-70 | tr '\n' ';')"
    else
        result verbs-corrupt FAIL "$_secs" "" "expected rc=1 and every non-skipped test FAIL; got rc=$_rc, $_nfail FAIL of $_nrun run, $_nskip skipped: $(grep -E '^error:|status=PASS' "$_log" | head -n 2 | tr '\n' ' ')"
        show_log "$_log" 40
    fi
    barrier "verbs-corrupt done"
}

# skip_test NAME REASON: both sides print the same SKIP line
skip_test() {
    say "SKIPPED $1: $2"
    result "$1" SKIP 0 "" "$2"
}

# ---- checks (print "STATUS reason" [+ "BW=x"])
rc_str() { [ "$1" = 0 ] && echo "rc=0" || echo "rc=$1"; }

check_pingpong() {
    _l=$(grep -E '[0-9]+ iters in [0-9.]+ seconds' "$1" | tail -n 1)
    if [ "$2" = 0 ] && [ -n "$_l" ]; then
        echo "PASS $(grep -E 'bytes in .* Mbit/sec' "$1" | tail -n 1); $_l"
        # Mbit/s (10^6 bit) -> MiB/s
        grep -E 'bytes in .* Mbit/sec' "$1" | tail -n 1 | awk '{ printf "BW=%.3f\n", $(NF-1) * 1e6 / 8 / 1048576 }'
    else
        echo "FAIL $(rc_str "$2"), no 'iters in' line; $(grep -iE 'fail|error|couldn' "$1" | head -n 2 | tr '\n' ' ')"
    fi
}

check_rping() {
    _n=$(rping_pings "$1")
    _want=${RPING_COUNT:-10}
    # the server prints one "server ping data" line per ping it answered
    if [ "$_n" -ge "$_want" ]; then
        echo "PASS $_n verified pings ($(rc_str "$2"))"
    else
        echo "FAIL only $_n of $_want 'ping data: rdma-ping-' lines ($(rc_str "$2")); $(grep -iE 'error|fail|reject|unreach' "$1" | head -n 2 | tr '\n' ' ')"
    fi
}

check_perftest() {
    _bw=$(perftest_bw "$1")
    if [ "$2" = 0 ] && [ -n "$_bw" ]; then
        echo "PASS BW average ${_bw} MiB/s"
        echo "BW=$_bw"
    elif [ "$2" = 0 ] && [ "$ROLE" = server ]; then
        # write/read servers print no result row: rc=0 is their verdict
        echo "PASS server side rc=0"
    else
        _cal=""
        # perftest times itself with the TSC and gives up when its samples
        # scatter (a loaded TCG host): no report, exit 1, the peer then fails
        grep -q "Can't produce a report" "$1" && grep -q 'Correlation coefficient' "$1" &&
            _cal=" perftest could not calibrate its clock ($(grep -m1 'Correlation coefficient' "$1")): no report; not a transfer error;"
        echo "FAIL $(rc_str "$2"), BW row: ${_bw:-none};$_cal $(grep -iE 'fail|error|couldn|unable' "$1" | head -n 2 | tr '\n' ' ')"
    fi
}

check_ucmatose() {
    if [ "$2" = 0 ] && grep -q 'test complete' "$1"; then
        echo "PASS test complete ($(grep -E 'return status' "$1" | tail -n 1))"
    else
        echo "FAIL $(rc_str "$2"); $(grep -iE 'fail|error|reject|unreach|return status' "$1" | head -n 3 | tr '\n' ' ')"
    fi
}

# diag DEV: RDMA and netdev counters (retransmissions, drops) for the logs
diag() {
    echo "== CI-DIAG $ROLE: rdma statistic show link $1/1"
    rdma statistic show link "$1/1" 2>&1 | tr '\n' ' ' |
        awk '{ for (i = 3; i < NF; i += 2) if ($(i + 1) != "0") printf "    %s %s\n", $i, $(i + 1) }'
    echo "== CI-DIAG $ROLE: ip -s link show eth0"
    ip -s link show eth0 2>&1 | sed 's/^/    /'
    echo "== CI-DIAG $ROLE: tcp counters"
    tcp_counters
    echo "== CI-DIAG $ROLE: dmesg (rdma/siw/rxe/tcp)"
    dmesg 2>/dev/null | grep -iE 'siw|rxe|infiniband|rdma|tcp|mpa' | grep -vE 'hash table|Hash tables' | tail -n 30 | sed 's/^/    /'
}

# tcp_counters: TCP retransmission / reset / timeout counters (nstat -az or /proc/net)
tcp_counters() {
    if command -v nstat >/dev/null 2>&1; then
        nstat -az 2>/dev/null | awk '$1 ~ /^(TcpRetransSegs|TcpExtTCPTimeouts|TcpExtTCPLostRetransmit|TcpOutRsts|TcpEstabResets|TcpAttemptFails|TcpExtTCPAbortOnData|TcpExtTCPAbortOnClose|TcpExtTCPAbortOnTimeout|TcpExtTCPSynRetrans|TcpExtListenDrops|TcpExtTCPBacklogDrop|TcpInErrs|TcpExtTCPOFOQueue)$/ { printf "    %s %s\n", $1, $2 }'
    else
        grep -A1 '^Tcp:' /proc/net/snmp | sed 's/^/    /'
    fi
}

# siw_trace_on: kprobes on siw connection-management internals, to see why a
# connection or a QP fails (the 7.3 guest kernel has no dynamic debug, and siw
# reports these only with siw_dbg). Best effort: probes that do not attach
# (inlined functions) are listed and skipped. Dump: siw_trace_dump.
#   siw_cm_upcall reason: 1 CONNECT_REQUEST 2 CONNECT_REPLY 3 ESTABLISHED 4 DISCONNECT 5 CLOSE
siw_trace_on() {
    _T=/sys/kernel/tracing
    [ -d $_T/events ] || mount -t tracefs nodev $_T 2>/dev/null
    [ -w $_T/kprobe_events ] || { say "siw trace: no tracefs"; return 0; }
    echo 8192 >$_T/buffer_size_kb 2>/dev/null
    # shellcheck disable=SC2016  # $retval is kprobe syntax, not shell
    for _p in \
        'r:siw_recv_mpa_rr siw_recv_mpa_rr ret=$retval:s32' \
        'r:siw_proc_mpareply siw_proc_mpareply ret=$retval:s32' \
        'r:siw_proc_mpareq siw_proc_mpareq ret=$retval:s32' \
        'p:siw_cm_upcall siw_cm_upcall reason=%si:s32 status=%dx:s32' \
        'p:siw_init_terminate siw_init_terminate layer=%si:u8 etype=%dx:u8 ecode=%cx:u8' \
        'p:siw_send_terminate siw_send_terminate' \
        'p:siw_qp_cm_drop siw_qp_cm_drop schedule=%si:s32' \
        'p:siw_qp_llp_close siw_qp_llp_close' \
        'r:siw_qp_sq_process siw_qp_sq_process ret=$retval:s32' \
        'p:siw_cm_llp_state_change siw_cm_llp_state_change' \
        'p:siw_cm_llp_data_ready siw_cm_llp_data_ready' \
        'p:siw_qp_llp_data_ready siw_qp_llp_data_ready' \
        'r:siw_send_mpareqrep siw_send_mpareqrep ret=$retval:s32' \
        'r:siw_qp_mpa_rts siw_qp_mpa_rts ret=$retval:s32' \
        'r:siw_accept siw_accept ret=$retval:s32' \
        'r:siw_connect siw_connect ret=$retval:s32'; do
        echo "$_p" >>$_T/kprobe_events 2>/dev/null || say "siw trace: cannot probe: $_p"
    done
    # per-WQE: errors only (-EAGAIN is the normal "socket full")
    echo 'ret < 0 && ret != -11' >$_T/events/kprobes/siw_qp_sq_process/filter 2>/dev/null
    echo 1 >$_T/events/kprobes/enable 2>/dev/null
    for _e in tcp/tcp_retransmit_skb tcp/tcp_send_reset tcp/tcp_receive_reset; do
        echo 1 >$_T/events/$_e/enable 2>/dev/null
    done
    echo 1 >$_T/tracing_on
    say "siw trace on: $(grep -c . $_T/kprobe_events) kprobes"
}

# siw_trace_mark TEXT: a marker line in the trace
siw_trace_mark() {
    [ -w /sys/kernel/tracing/trace_marker ] && echo "CI-MARK $*" >/sys/kernel/tracing/trace_marker
    return 0
}

# siw_trace_dump: the whole trace to /job/siw-trace.<role>.log; failures
# (negative ret/status, terminate, resets, retransmits) to the console
siw_trace_dump() {
    _T=/sys/kernel/tracing
    [ -r $_T/trace ] || return 0
    cat $_T/trace >"$CI_LOGDIR/siw-trace.$ROLE.log" 2>/dev/null
    # hits and misses per probe (a kprobe hit while another kprobe runs is missed, not traced)
    cat $_T/kprobe_profile >"$CI_LOGDIR/siw-kprobe-profile.$ROLE.log" 2>/dev/null
    echo "== CI-DIAG $ROLE: siw trace (failures; all in siw-trace.$ROLE.log)"
    # (resets with reason=NO_SOCKET are the barrier clients' connect retries: noise)
    grep -E 'CI-MARK|ret=-|status=-|tcp_send_reset|tcp_receive_reset|tcp_retransmit' \
        "$CI_LOGDIR/siw-trace.$ROLE.log" | grep -vE 'reason=NO_SOCKET|tcp_receive_reset: .* dport=91[0-9][0-9] ' | sed 's/^ *//' | tail -n 120 | sed 's/^/    /'
}

# ---------------------------------------------------------------------------
# cells

# cell_verbs rxe|siw
cell_verbs() {
    vtype=$1
    vdev=${vtype}0
    [ "$vtype" = erdma ] && vdev=erdma_0
    net_up
    if ! rdma_dev_up "$vtype" "$vdev"; then
        echo "CI-ABORT reason=link-add"
        # keep the peer's barriers from hanging for long: it aborts too
        exit 0
    fi
    [ "$vtype" = siw ] && [ "${CI_SIW_TRACE:-1}" != 0 ] && siw_trace_on
    barrier "devices up"

    if [ "$vtype" != siw ]; then  # RoCE v2: rxe or erdma
        gidx=$(roce_gid_index "$vdev" "$SELF")
        if [ -z "$gidx" ]; then
            say "no RoCE v2 GID for $SELF on $vdev:"
            for f in /sys/class/infiniband/"$vdev"/ports/1/gids/*; do echo "  ${f##*/} $(cat "$f")"; done
            gidx=1
        fi
        say "RoCE v2 GID index of $SELF on $vdev: $gidx"
        if [ -n "${CI_SKIP_PINGPONG:-}" ]; then
            skip_test ibv_rc_pingpong "$CI_SKIP_PINGPONG"
        else
            tool_test ibv_rc_pingpong tcp 18601 \
                "ibv_rc_pingpong -d $vdev -g $gidx -p 18601 -n 200" \
                "ibv_rc_pingpong -d $vdev -g $gidx -p 18601 -n 200 $PEER" check_pingpong
        fi
        pt="-d $vdev -x $gidx"
        ptl=tcp
    else
        if [ -n "${CI_TRY_UNSUPPORTED:-}" ]; then
            # evidence mode: run it anyway (expected to fail)
            CI_TOOL_TIMEOUT=40 tool_test ibv_rc_pingpong-siw-try tcp 18601 \
                "ibv_rc_pingpong -d $vdev -g 0 -p 18601 -n 10" \
                "ibv_rc_pingpong -d $vdev -g 0 -p 18601 -n 10 $PEER" check_pingpong
        fi
        skip_test ibv_rc_pingpong "iWARP (siw) QPs can only be connected by the iw_cm (rdma_cm) over a TCP connection; ibv_rc_pingpong moves the QP to RTR/RTS by hand with ibv_modify_qp and has no rdma_cm mode"
        pt="-d $vdev -R"
        ptl=cm
    fi

    RPING_COUNT=10 tool_test rping cm 18602 \
        "rping -s -a $SELF -p 18602 -C 10 -v -V" \
        "rping -c -a $PEER -p 18602 -C 10 -v -V" check_rping

    pport=18610
    for t in send write read; do
        pport=$((pport + 1))
        _po=
        # siw: with perftest's default outstanding reads (max_qp_rd_atom = 128)
        # ib_read_bw -R never gets through its rdma_cm data exchange (client
        # "Bad wc status 5", "Unable to read from socket/rdma_cm"; the server
        # hangs); -o 1 and -o 16 work. Reported, see ci/README.md.
        [ "$t" = read ] && [ "$vtype" = siw ] && [ "${CI_SIW_READ_OUTS:-16}" != 0 ] &&
            _po="-o ${CI_SIW_READ_OUTS:-16}"
        tool_test "ib_${t}_bw" "$ptl" "$pport" \
            "ib_${t}_bw $pt $_po -n $CI_PERFTEST_ITERS -p $pport" \
            "ib_${t}_bw $pt $_po -n $CI_PERFTEST_ITERS -p $pport $PEER" check_perftest
    done

    tool_test ucmatose cm 18620 \
        "ucmatose -p 18620" \
        "ucmatose -s $PEER -p 18620" check_ucmatose
    verbs_test "$vdev"
    # two QPs of the server's erdma function, both ends in this guest: the
    # function loops them back itself (the fabric never hands a port its
    # own frames)
    if [ "$vtype" = erdma ] && [ "$ROLE" = server ]; then
        loopback loopback-pingpong check_pingpong 18630 ibv_rc_pingpong -d "$vdev" -g "$gidx" -p 18630 -n 200
        loopback loopback-write-bw check_perftest_row 18631 ib_write_bw -d "$vdev" -x "$gidx" -p 18631 -n 200
    fi
    diag "$vdev"
    [ "$vtype" = siw ] && siw_trace_dump
    say "cell done"
}

# loopback NAME CHECK PORT CMD...: CMD as server in the background, then
# (host_test) as client towards this guest's own address
loopback() {
    _lname=$1 _lcheck=$2 _lport=$3
    shift 3
    timeout -k 5 "$CI_TOOL_TIMEOUT" "$@" >"$CI_LOGDIR/$_lname.loop-server.log" 2>&1 &
    _lpid=$!
    wait_listen tcp "$_lport"
    host_test "$_lname" "$_lcheck" "$@" "$SELF"
    wait "$_lpid"
}

# cell_siw_conn: connection-setup stress on siw (diagnostics for the siw cell's
# flaky ib_read_bw -R / ucmatose): CI_SIW_CONN_ROUNDS rounds of ucmatose and
# ib_read_bw -R (perftest's default outstanding reads), siw trace on.
cell_siw_conn() {
    net_up
    if ! rdma_dev_up siw siw0; then
        echo "CI-ABORT reason=link-add"
        exit 0
    fi
    [ "${CI_SIW_TRACE:-1}" != 0 ] && siw_trace_on
    barrier "devices up"
    siw_round=0
    while [ $siw_round -lt "${CI_SIW_CONN_ROUNDS:-5}" ]; do
        siw_round=$((siw_round + 1))
        tool_test "ucmatose-$siw_round" cm $((18700 + siw_round)) \
            "ucmatose -p $((18700 + siw_round))" \
            "ucmatose -s $PEER -p $((18700 + siw_round))" check_ucmatose
        tool_test "ib_read_bw-$siw_round" cm $((18800 + siw_round)) \
            "ib_read_bw -d siw0 -R -n 50 -p $((18800 + siw_round))" \
            "ib_read_bw -d siw0 -R -n 50 -p $((18800 + siw_round)) $PEER" check_perftest
    done
    diag siw0
    siw_trace_dump
    say "cell done"
}

# smc_setup yes|no: rxe0 + (optionally) the UEID; SMC info and device checks
smc_setup() {
    net_up
    if ! rdma_dev_up "$CI_RDMA" "$CI_RDMA_DEV"; then
        echo "CI-ABORT reason=link-add"
        exit 0
    fi
    _t0=$(now)
    _log=$CI_LOGDIR/smc-setup.$ROLE.log
    : >"$_log"
    if [ "$1" = yes ]; then
        if ! smc-guest-tests smc ueid add "$CI_UEID" >>"$_log" 2>&1; then
            result smc-ueid FAIL $(($(now) - _t0)) "" "smc ueid add $CI_UEID: $(tail -n 2 "$_log")"
            show_log "$_log"
            echo "CI-ABORT reason=ueid"
            exit 0
        fi
    fi
    smc-guest-tests smc ueid list >>"$_log" 2>&1
    smc-guest-tests smc info >>"$_log" 2>&1
    cat "$_log"
    if [ "$1" = yes ]; then
        result smc-ueid PASS $(($(now) - _t0)) "" "$(grep -v '^added' "$_log" | head -n 1)"
    fi
    _t0=$(now)
    _log=$CI_LOGDIR/smc-devices.$ROLE.log
    if smc-guest-tests smc devices --require-smcr >"$_log" 2>&1; then
        cat "$_log"
        result smc-devices PASS $(($(now) - _t0)) "" "$(grep SMCR-DEVICES "$_log")"
    else
        result smc-devices FAIL $(($(now) - _t0)) "" "$(tail -n 2 "$_log")"
        show_log "$_log"
    fi
}

# smc_stream NAME EXPECT BYTES CONNS DIRECTION PORT [CLOSE_ORDER]
#   CLOSE_ORDER: client-first (default) | server-first
#   EXPECT=smcr: rc 0, verified, smc_mode=smcr
#   EXPECT=tcp: plain TCP (--proto tcp), rc 0, verified
#   EXPECT=decline:CODE: the tool must FAIL and name CODE (e.g. 0x03030008)
smc_stream() {
    _name=$1 _exp=$2 _bytes=$3 _conns=$4 _dir=$5 _port=$6 _close=${7:-client-first}
    _log=$CI_LOGDIR/$_name.$ROLE.log
    _proto=smc
    [ "$_exp" = tcp ] && _proto=tcp
    _common="--proto $_proto --port $_port --bytes $_bytes --conns $_conns --direction $_dir --close-order $_close --seed 3 --io-timeout 120"
    [ "$_exp" = smcr ] && _common="$_common --expect-mode smcr"
    barrier "$_name start"
    _t0=$(now)
    if [ "$ROLE" = server ]; then
        _cmd="smc-guest-tests stream server --addr $SELF $_common --once --accept-timeout 300"
    else
        _cmd="smc-guest-tests stream client --addr $PEER $_common --connect-timeout 120"
    fi
    say "$_name: $_cmd"
    echo "+ $_cmd" >"$_log"
    # shellcheck disable=SC2086
    timeout -k 5 "$CI_STREAM_TIMEOUT" $_cmd >>"$_log" 2>&1
    _rc=$?
    _secs=$(($(now) - _t0))
    echo "rc=$_rc" >>"$_log"
    _res=$(grep '^STREAM-RESULT' "$_log" | tail -n 1)
    _mib=$(echo "$_res" | sed -n 's/.* mibps=\([0-9.]*\).*/\1/p')
    case "$_exp" in
        smcr | tcp)
            if [ "$_rc" = 0 ] && echo "$_res" | grep -q 'verified=1' && echo "$_res" | grep -q 'status=pass' &&
                { [ "$_exp" = tcp ] || echo "$_res" | grep -q 'smc_mode=smcr'; }; then
                result "$_name" PASS "$_secs" "$_mib" "$(grep '^summary' "$_log" | tail -n 1)"
            else
                result "$_name" FAIL "$_secs" "$_mib" "rc=$_rc ${_res:-no STREAM-RESULT}; $(grep -E 'error|fallback' "$_log" | head -n 2 | tr '\n' ' ')"
                show_log "$_log" 40
            fi
            ;;
        decline:*)
            _code=${_exp#decline:}
            if [ "$_rc" != 0 ] && grep -qiE "$_code" "$_log"; then
                result "$_name" PASS "$_secs" "" "failed as expected (rc=$_rc) naming $(grep -oiE "$_code" "$_log" | head -n 1): $(grep -oE 'error="[^"]*"' "$_log" | head -n 1 | cut -c1-300)"
            elif [ "$_rc" = 0 ]; then
                result "$_name" FAIL "$_secs" "" "expected a failure naming $_code, but the tool PASSED: ${_res:-no STREAM-RESULT}"
                show_log "$_log" 40
            else
                result "$_name" FAIL "$_secs" "" "the tool failed (rc=$_rc) but does not name $_code: $(grep -E 'error|fallback|0x' "$_log" | head -n 2 | tr '\n' ' ')"
                show_log "$_log" 40
            fi
            ;;
    esac
    # an SMC-R close and the link group teardown can take a while: let both
    # sides finish before anything else happens
    barrier "$_name done"
}

cell_smcr() {
    smc_setup yes
    barrier "smc ready"
    # The issue's ranges: 1 B .. 256 MiB per connection, 1 .. 64 parallel
    # connections, both directions, both close orders; every byte verified
    # and every connection proven SMC-R (sock_diag), a fallback fails.
    smc_stream smc-1byte smcr 1 1 c2s 7784
    [ "${CI_SMC_SKIP_MANY:-}" ] || smc_stream smc-64conns smcr "$CI_SMC_MANY_BYTES" 64 both 7785 server-first
    smc_stream smc-stream smcr "$CI_SMC_BYTES" "${CI_SMC_STREAM_CONNS:-4}" both 7781
    smc_stream smc-big-s2c smcr "$CI_SMC_BIG_BYTES" 1 s2c 7786 server-first
    diag "$CI_RDMA_DEV"
    say "cell done"
}

# SMC-R link failover (issue 6): two NICs per guest (eth0, eth1) on two daemon
# ports each, in the same IPv4 subnet (an SMC-Rv2 alternate link needs a
# device whose netdev is in the link group's source subnet:
# smc_ib_determine_gid), rxe0 on eth0 and rxe1 on eth1. The link group adds
# a second link over rxe1 (empty PNET IDs match, smc_pnet_match). The host
# takes the daemon port of the busiest link down in the middle of the stream
# (guest-runner failover-driver); the stream must complete verified over the
# other link. arp_ignore=1 / arp_announce=2: both NICs share one L2 fabric,
# each must answer ARP only for its own address, or RoCE frames for one
# rxe device reach the other. A guest may ask for its peer's address before
# the peer has set these (its job starts later): then both of the peer's
# NICs answer, and if the wrong answer comes first the RoCE frames for rxe0
# go to the peer's eth1, where rxe1 drops them and SMC-R's first contact
# never confirms its link (seen in 3 of 4 runs, ci/README.md). So once both
# have set them (a barrier), both forget what they learnt before.
cell_smcr_failover() {
    sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 2>/dev/null ||
        { echo 1 >/proc/sys/net/ipv4/conf/all/arp_ignore; echo 2 >/proc/sys/net/ipv4/conf/all/arp_announce; }
    smc_setup yes
    barrier "arp rules set"
    ip neigh flush dev eth0
    ip neigh flush dev eth1
    ip neigh show | sed 's/^/    neighbour after flush: /'
    # rxe treats the retry count SMC gives its link QPs (7) as infinite, so a
    # dead link never fails its QP; SMC-R then finds it by TEST_LINK (no
    # answer within 2 s), sent after smcr_testlink_time without traffic on the
    # link (default 30 s). 5 s makes the failover happen inside the 30 s the
    # host keeps the link down.
    sysctl -qw net.smc.smcr_testlink_time=5 2>/dev/null ||
        echo 5 >/proc/sys/net/smc/smcr_testlink_time 2>/dev/null ||
        say "cannot set net.smc.smcr_testlink_time (failover waits for the 30 s default)"
    say "net.smc.smcr_testlink_time = $(cat /proc/sys/net/smc/smcr_testlink_time 2>/dev/null || echo '?')"
    if ! rdma_dev_up rxe rxe1 eth1; then
        echo "CI-ABORT reason=link-add-rxe1"
        exit 0
    fi
    _n=$(smc-guest-tests smc devices 2>&1 | sed -n 's/^SMCR-DEVICES total=[0-9]* usable=\([0-9]*\).*/\1/p')
    if [ "${_n:-0}" -ge 2 ]; then
        result smc-two-devices PASS 0 "" "SMC-R usable devices: $_n"
    else
        result smc-two-devices FAIL 0 "" "expected 2 usable SMC-R devices, have ${_n:-0}: $(smc-guest-tests smc devices 2>&1 | tr '\n' ' ')"
    fi
    barrier "smc ready"
    # the host waits for this stream's traffic, then takes one link down
    echo "CI-EVENT failover-stream-start"
    smc_stream smc-failover-stream smcr "$CI_FAILOVER_BYTES" 1 c2s 7787
    say "smc kernel messages:"
    dmesg 2>/dev/null | grep -iE 'smc' | tail -n 20 | sed 's/^/    /'
    diag rxe0
    diag rxe1
    say "cell done"
}

# negative, two phases in one boot (kernel: net/smc/af_smc.c):
#  1. UEID on the server only: the client proposes SMCv2 without an EID, the
#     server's smc_listen_v2_check() declines SMC_CLC_DECL_NOUEID (0x03030008);
#     the client sees PEERDECL (0x05000000) + peer diagnosis 0x03030008.
#  2. UEID on the client only: the server's EID match fails silently in
#     smc_find_rdma_v2_device_serv(), so the decline carries the first error
#     stored before it: 0x03030007 (NOSMCD2DEV, from the SMC-Dv2 check: the
#     client also proposes its loopback-ism SMC-D device) on kernels with
#     CONFIG_SMC_LO, else NOUEID or NOSMCDEV. Here the tool must fail naming
#     one of those codes.
# Both stream tools must FAIL (fallback to TCP is an error) and name the code.
cell_smc_noueid() {
    if [ "$ROLE" = server ]; then smc_setup yes; else smc_setup no; fi
    barrier "smc ready"
    smc_stream smc-noueid-client "decline:${CI_NOUEID_CODE:-0x03030008}" 1M 1 both 7782
    _t0=$(now)
    _log=$CI_LOGDIR/smc-ueid-swap.$ROLE.log
    if [ "$ROLE" = server ]; then
        smc-guest-tests smc ueid del "$CI_UEID" >"$_log" 2>&1
    else
        smc-guest-tests smc ueid add "$CI_UEID" >"$_log" 2>&1
    fi
    _rc=$?
    smc-guest-tests smc ueid list >>"$_log" 2>&1
    if [ $_rc = 0 ]; then
        result smc-ueid-swap PASS $(($(now) - _t0)) "" "$(head -n 1 "$_log"); now: $(tail -n 1 "$_log")"
    else
        result smc-ueid-swap FAIL $(($(now) - _t0)) "" "$(cat "$_log")"
    fi
    smc_stream smc-noueid-server 'decline:0x0303000[078]' 1M 1 both 7783
    say "cell done"
}

# cell_fabric: plain TCP through the switch between the guests' virtio-net
# ports in the cell's QEMU, device form and CI_QUEUES queue pairs:
# CI_FABRIC_CONNS connections of CI_FABRIC_BYTES each, every byte verified
cell_fabric() {
    if [ "${CI_QUEUES:-1}" -gt 1 ]; then
        _t0=$(now)
        ethtool -L eth0 combined "$CI_QUEUES" >"$CI_LOGDIR/channels.log" 2>&1
        _rc=$?
        _cur=$(ethtool -l eth0 | awk '/Current/ { c = 1 } c && /^Combined:/ { print $2; exit }')
        if [ $_rc = 0 ] && [ "$_cur" = "$CI_QUEUES" ]; then
            result channels PASS $(($(now) - _t0)) "" "ethtool -L eth0 combined $CI_QUEUES: $_cur queue pairs"
        else
            result channels FAIL $(($(now) - _t0)) "" "ethtool -L eth0 combined $CI_QUEUES: rc=$_rc, current $_cur: $(cat "$CI_LOGDIR/channels.log")"
        fi
    fi
    net_up
    smc_stream tcp-stream tcp "$CI_FABRIC_BYTES" "${CI_FABRIC_CONNS:-1}" c2s 5201
    # which queue pairs carried the stream (flow hashing decides)
    ethtool -S eth0 2>/dev/null | grep -E '(rx|tx)_queue_[0-9]+_packets' | sed 's/^ */QSTAT /'
    say "cell done"
}

# cell_rss: multiqueue steering, RSS and hash report (4 queue pairs, the
# test-device form). The server walks through steps; at each the host
# (guest-runner rss-host) compares what the guest sees with the daemon's
# view (`ctl rss`, flow table) and acks through /job/STEP.ack:
#   default  `ethtool -x`: the RETA and key the daemon has
#   equal2   `ethtool -X equal 2`;  hkey  `ethtool -X equal 4 hkey K`
#   flows    TCP and UDP flows from the client's iperf3 (-R --cport P): each
#            peaks on the queue the daemon's model predicts (per-queue RX
#            packet deltas); then the host adds a steer and a drop rule
#   rules    a fresh flow lands on the rule's queue; the drop rule eats the
#            client's RSTs, so a connect times out instead of being refused
# The host judges (row rss-host); the server's row says it walked every step.
cell_rss() {
    if [ "$ROLE" = client ]; then
        ethtool -L eth0 combined 4
        iperf3 -s -p 5201 >"$CI_LOGDIR/iperf3.log" 2>&1 &
        _srv=$!
        _i=0
        while [ ! -f /job/stop ] && [ $_i -lt 3000 ]; do _i=$((_i + 1)); sleep 1; done
        kill $_srv 2>/dev/null
        result iperf3-server PASS $_i "" "served until the host's checks ended"
        return
    fi
    _t0=$(now)
    ethtool -L eth0 combined 4 || rss_fail "ethtool -L eth0 combined 4"
    smc-guest-tests qstats --dev eth0
    [ -n "$(rss_qstats)" ] || rss_fail "no per-queue RX packet counters (netdev qstats / ethtool -S)"
    net_up
    _i=0
    until iperf3 -c "$PEER" -p 5201 -t 1 >/dev/null 2>&1; do
        _i=$((_i + 1)); [ $_i -ge 60 ] && rss_fail "no iperf3 server on $PEER"; sleep 2
    done
    ethtool -k eth0 | grep -E 'receive-hashing|ntuple'
    ethtool -x eth0 | tee /job/x-default.txt
    rss_step default
    ethtool -X eth0 equal 2 || rss_fail "ethtool -X eth0 equal 2"
    ethtool -x eth0 | tee /job/x-equal2.txt
    rss_step equal2
    ethtool -X eth0 equal 4 hkey "$CI_RSS_KEY" || rss_fail "ethtool -X eth0 equal 4 hkey"
    ethtool -x eth0 | tee /job/x-hkey.txt
    rss_step hkey
    for _p in $CI_RSS_TCP_PORTS; do
        rss_flow "$PEER:5201-$SELF:$_p/tcp" iperf3 -c "$PEER" -p 5201 --cport "$_p" -R -t 2
    done
    for _p in $CI_RSS_UDP_PORTS; do
        rss_flow "$PEER:5201-$SELF:$_p/udp" iperf3 -c "$PEER" -p 5201 --cport "$_p" -R -u -b 4M -l 1000 -t 2
    done
    rss_step flows
    say "rule target queue: $(cat /job/flows.ack)"
    rss_flow "$PEER:5201-$SELF:$CI_RSS_MOVE_PORT/tcp" iperf3 -c "$PEER" -p 5201 --cport "$CI_RSS_MOVE_PORT" -R -t 2
    # nothing listens on the client's 5202: its RSTs are dropped by the rule
    rss_flow drop busybox nc -w 4 "$PEER" 5202 </dev/null
    rss_step rules
    smc-guest-tests qstats --dev eth0
    result rss-steps PASS $(($(now) - _t0)) "" "every step acked by the host"
}
rss_fail() {
    result rss-steps FAIL $(($(now) - _t0)) "" "$*"
    touch /job/abort
    exit 0
}
# rss_step STEP: ask the host to check STEP, wait for its ack
rss_step() {
    echo "== step $1"
    touch "/job/$1.req"
    _i=0
    while [ ! -f "/job/$1.ack" ]; do
        _i=$((_i + 1)); [ $_i -ge 3600 ] && rss_fail "host did not ack step $1"
        [ -f /job/abort ] && rss_fail "host aborted at step $1"
        sleep 0.5
    done
}
# per-queue RX packets: netdev netlink qstats (7.x virtio_net reports them
# only there), else ethtool -S rx_queue_N_packets (older kernels)
rss_qstats() {
    { smc-guest-tests qstats --dev eth0 2>/dev/null | sed -n 's/^rx [0-9]* packets \([0-9]*\).*/\1/p'
      ethtool -S eth0 | sed -n 's/^ *rx_queue_[0-9]*_packets: *\([0-9]*\).*/\1/p'; } | tr '\n' ' '
}
# rss_flow NAME CMD...: one flow, with the per-queue counters around it
rss_flow() {
    _fname=$1
    shift
    _b=$(rss_qstats)
    "$@" >/tmp/flow.log 2>&1
    _rc=$?
    sleep 0.5
    echo "FLOW $_fname rc=$_rc before=[$_b] after=[$(rss_qstats)]"
    [ $_rc = 0 ] || tail -n 3 /tmp/flow.log
}

# One guest (ROLE=server) against the daemon's virtual hosts (cells
# vhost-rxe, vhost-erdma, vhost-siw): PEER is host vh, CI_VHOST2 host vh2.
# The cell declares the hosts' services (guest-runner's virtual_hosts.rs):
# servers on the ports below, clients that retry until the guest's tool
# listens. The host judges its half of every row (its session's counts).
# host_test NAME CHECK CMD...: one tool run, judged by CHECK (as tool_test)
host_test() {
    _name=$1 _check=$2
    shift 2
    _log=$CI_LOGDIR/$_name.$ROLE.log
    say "$_name: $*"
    echo "+ $*" >"$_log"
    _t0=$(now)
    timeout -k 5 "$CI_TOOL_TIMEOUT" "$@" >>"$_log" 2>&1
    _rc=$?
    echo "rc=$_rc" >>"$_log"
    tool_verdict "$_check" "$_log" "$_rc"
    result "$_name" "$_st" $(($(now) - _t0)) "$_bw" "$_why"
    [ "$_st" = PASS ] || show_log "$_log"
}
# check_perftest_row LOG RC: check_perftest, the result row required
check_perftest_row() { ROLE=client check_perftest "$@"; }

cell_vhost() {
    vtype=$1 vdev=${1}0
    [ "$vtype" = erdma ] && vdev=erdma_0
    net_up
    rdma_dev_up "$vtype" "$vdev" || { echo "CI-ABORT reason=link-add"; exit 0; }
    if [ "$vtype" = siw ]; then
        for _crc in "" -crc; do
            _p=7174 _o=0
            [ -n "$_crc" ] && _p=7175 _o=10
            RPING_COUNT=10 host_test "rping-guest-client$_crc" check_rping rping -c -a "$PEER" -p $_p -C 10 -S 64 -v -V
            RPING_COUNT=10 host_test "rping-guest-server$_crc" check_rping rping -s -a "$SELF" -p $_p -S 64 -v -V
            for _v in write send read; do
                _o=$((_o + 1))
                host_test "$_v-bw-R-guest-client$_crc" check_perftest_row "ib_${_v}_bw" -R -d siw0 -p $((18520 + _o)) -n 200 -s 65536 "$PEER"
                host_test "$_v-bw-R-guest-server$_crc" check_perftest_row "ib_${_v}_bw" -R -d siw0 -p $((18540 + _o)) -n 200 -s 65536
            done
        done
    else
        gidx=$(roce_gid_index "$vdev" "$SELF") || { say "no RoCE v2 GID for $SELF on $vdev"; gidx=1; }
        host_test pingpong-guest-server check_pingpong ibv_rc_pingpong -d "$vdev" -g "$gidx" -p 18516 -n 1000
        host_test pingpong-guest-client check_pingpong ibv_rc_pingpong -d "$vdev" -g "$gidx" -p 18515 -n 1000 "$PEER"
        _o=0
        for _v in write send read atomic; do
            _sz="-s 65536"
            [ $_v = atomic ] && _sz=
            host_test "$_v-bw-guest-client" check_perftest_row "ib_${_v}_bw" -d "$vdev" -x "$gidx" -p $((18517 + _o)) -n 200 "$PEER"
            host_test "$_v-bw-guest-server" check_perftest "ib_${_v}_bw" -d "$vdev" -x "$gidx" -p $((18521 + _o)) -n 200
            # shellcheck disable=SC2086 # _sz: no size for atomics
            host_test "$_v-bw-R-guest-client" check_perftest_row "ib_${_v}_bw" -R -d "$vdev" -p $((18531 + _o)) -n 200 $_sz "$CI_VHOST2"
            # shellcheck disable=SC2086
            host_test "$_v-bw-R-guest-server" check_perftest_row "ib_${_v}_bw" -R -d "$vdev" -p $((18541 + _o)) -n 200 $_sz
            _o=$((_o + 1))
        done
        RPING_COUNT=10 host_test rping-guest-client check_rping rping -c -a "$PEER" -p 7174 -C 10 -v -V
        RPING_COUNT=10 host_test rping-guest-server check_rping rping -s -a "$SELF" -p 7174 -v -V
    fi
    host_test ucmatose-guest-client check_ucmatose ucmatose -s "$PEER" -p 7471 -C 10
    host_test ucmatose-guest-server check_ucmatose ucmatose -b "$SELF" -p 7471 -C 10
    diag "$vdev"
    say "cell done"
}

# cell_vxlan basic|rdma: the guests on two daemons joined only by VXLAN
# uplinks (guest-runner's matrix/vxlan.rs: daemon A serves the server's port,
# daemon B the client's, each with a default `kind=vxlan` uplink `up`). Both
# keep MTU 1500: full-size frames leave as 1550-byte outer packets (df
# unset), fragmented where the underlay needs it. The host judges
# uplink-mtu from both daemons' uplink counters.
#   basic  ping; CI_VXLAN_BYTES of verified TCP; siw rping -V of 50 4 KiB
#          pings (rping before the stream: after it the 7.3 siw once
#          stalled at its first RDMA READ)
#   rdma   over rxe: ibv_rc_pingpong -c; SMC-Rv2 (UEID) one verified stream
#          each way; then daemon A's uplink drops 2 % and reorders 5 % of
#          RoCEv2 (rules asked for through ci_ctl) and ibv_rc_pingpong -c
#          must still complete
cell_vxlan() {
    net_up
    if [ "$1" = basic ]; then
        if [ "$ROLE" = client ]; then
            _t0=$(now)
            ping -c 5 -W 5 "$PEER" >"$CI_LOGDIR/ping.log" 2>&1
            _rc=$?
            _st=PASS
            [ $_rc = 0 ] || _st=FAIL
            result ping $_st $(($(now) - _t0)) "" "$(rc_str $_rc); $(grep -E 'transmitted|rtt' "$CI_LOGDIR/ping.log" | tr '\n' ' ')"
        fi
        rdma_dev_up siw siw0 || { echo "CI-ABORT reason=link-add"; exit 0; }
        RPING_COUNT=50 tool_test rping-siw cm 7174 \
            "rping -s -a $SELF -p 7174 -S 4096 -C 50 -v -V" \
            "rping -c -a $PEER -p 7174 -S 4096 -C 50 -v -V" check_rping
        rdma link delete siw0
        smc_stream tcp-stream tcp "$CI_VXLAN_BYTES" 1 c2s 5201
    else
        smc_setup yes
        gidx=$(roce_gid_index rxe0 "$SELF") || gidx=1
        tool_test ibv_rc_pingpong tcp 18515 "ibv_rc_pingpong -d rxe0 -g $gidx -p 18515 -n 500 -c" \
            "ibv_rc_pingpong -d rxe0 -g $gidx -p 18515 -n 500 -c $PEER" check_pingpong
        smc_stream smc-c2s smcr 64M 1 c2s 7781
        smc_stream smc-s2c smcr 64M 1 s2c 7782
        if [ "$ROLE" = server ]; then
            ci_ctl faults add --port up --dir both --proto udp --dst-port 4791 --action drop --prob 0.02 --seed 17
            ci_ctl faults add --port up --dir both --proto udp --dst-port 4791 --action reorder --prob 0.05 \
                --window 4 --hold-ms 20 --seed 18
        fi
        CI_TOOL_TIMEOUT=420 tool_test faults-rc tcp 18516 "ibv_rc_pingpong -d rxe0 -g $gidx -p 18516 -n 200 -c" \
            "ibv_rc_pingpong -d rxe0 -g $gidx -p 18516 -n 200 -c $PEER" check_pingpong
        [ "$ROLE" = server ] && ci_ctl faults list
        diag rxe0
    fi
    say "cell done"
}

# cell_iperf: iperf3 between the guests (guest-runner bench-fabric, on the
# daemon's path and on QEMU's own): for -P 1 and -P 4 the server serves one
# test, the client runs -t CI_IPERF_SECS and keeps iperf3's JSON in
# /job/iperf-PN.json (the host reads the receiver's rate from it).
cell_iperf() {
    net_up
    for _p in 1 4; do
        _t0=$(now)
        if [ "$ROLE" = server ]; then
            iperf3 -s -1 -p 5201 >"$CI_LOGDIR/iperf-server-P$_p.log" 2>&1 &
            srv_pid=$!
            wait_listen tcp 5201
            barrier "iperf3 -P $_p listening"
            wait "$srv_pid"
            _rc=$?
            srv_pid=
        else
            barrier "iperf3 -P $_p listening"
            # bounded: a stalled data path must not hang the whole benchmark
            timeout $((CI_IPERF_SECS + 60)) iperf3 -c "$PEER" -p 5201 -t "$CI_IPERF_SECS" -P $_p -J \
                >"$CI_LOGDIR/iperf-P$_p.json" 2>"$CI_LOGDIR/iperf-P$_p.err"
            _rc=$?
        fi
        _st=PASS
        [ $_rc = 0 ] || _st=FAIL
        result "iperf3-P$_p" $_st $(($(now) - _t0)) "" "$(rc_str $_rc)"
        barrier "iperf3 -P $_p done"
    done
    say "cell done"
}

# cell_uplink: one guest (MTU 1450: the VXLAN path leaves 50 bytes of the
# underlay's 1500 to the tunnel) behind the daemon's uplinks (guest-runner's
# matrix/uplinks.rs): client A (CI_UPLINK_A) behind its VXLAN uplink, B
# (CI_UPLINK_B) behind its TAP. Per client: ping it (guest-NAME-ping), then
# CI_UPLINK_BYTES of TCP to its server while it streams as many to ours
# (guest-NAME-tcp, both verified here). The host adds the clients' halves.
cell_uplink() {
    ip link set eth0 mtu 1450
    net_up
    for _path in "vxlan $CI_UPLINK_A 5311 5321" "tap $CI_UPLINK_B 5312 5322"; do
        # shellcheck disable=SC2086 # four words
        set -- $_path
        _pn=$1 _peer=$2 _t0=$(now)
        smc-guest-tests stream server --proto tcp --addr "$SELF" --port "$4" --bytes "$CI_UPLINK_BYTES" \
            --seed 17 --once --accept-timeout 600 --io-timeout 300 >"$CI_LOGDIR/$_pn-in.log" 2>&1 &
        _srv=$!
        _i=0
        until ping -c 1 -W 2 "$_peer" >/dev/null 2>&1; do _i=$((_i + 1)); [ $_i -ge 90 ] && break; sleep 1; done
        ping -c 5 -i 0.5 -W 5 "$_peer" >"$CI_LOGDIR/$_pn-ping.log" 2>&1
        _rc=$?
        _st=PASS
        [ $_rc = 0 ] || _st=FAIL
        result "guest-$_pn-ping" $_st $(($(now) - _t0)) "" "$(rc_str $_rc); $(grep -E 'transmitted|rtt' "$CI_LOGDIR/$_pn-ping.log" | tr '\n' ' ')"
        _t0=$(now)
        smc-guest-tests stream client --proto tcp --addr "$_peer" --port "$3" --bytes "$CI_UPLINK_BYTES" \
            --seed 17 --connect-timeout 300 --io-timeout 300 >"$CI_LOGDIR/$_pn-out.log" 2>&1
        _rc=$?
        wait $_srv
        _rc_in=$?
        _out=$(grep STREAM-RESULT "$CI_LOGDIR/$_pn-out.log" | tail -n 1)
        _in=$(grep STREAM-RESULT "$CI_LOGDIR/$_pn-in.log" | tail -n 1)
        _st=FAIL
        case "$_rc $_rc_in $_out $_in" in
            "0 0 "*verified=1*status=pass*verified=1*status=pass*) _st=PASS ;;
        esac
        result "guest-$_pn-tcp" $_st $(($(now) - _t0)) "" "to the client: $(rc_str $_rc) ${_out:-no STREAM-RESULT}; from it: $(rc_str $_rc_in) ${_in:-no STREAM-RESULT}"
    done
    ip -s link show eth0
    say "cell done"
}

# RDMA devices in network namespaces (Documentation/infiniband/core_devices:
# "rdma system set netns shared|exclusive"). cell_netns MODE, both roles on
# their erdma function (CI_RDMA=erdma). The server sets the mode (only
# possible while no other namespace exists), moves eth0 into a new
# namespace "vr" (and, in exclusive mode, erdma_0 with it), checks where the
# device is visible, then runs the tools from inside "vr": barriers, rdma_cm
# and the GID of eth0's address all live there. The client stays in its
# initial namespace.
#   rdma-netns-mode      `rdma system show` reports MODE after the set
#   rdma-netns-visible   shared: erdma_0 listed in the initial namespace and
#                        in vr; exclusive: listed in vr only
#   ibv_rc_pingpong, rping, ib_write_bw   run inside vr (server role)
cell_netns() {
    _mode=$1
    net_up
    if [ "$ROLE" = server ]; then
        _t0=$(now)
        _log=$CI_LOGDIR/netns-mode.$ROLE.log
        rdma system set netns "$_mode" >"$_log" 2>&1
        rdma system show >>"$_log" 2>&1
        if grep -q "netns $_mode" "$_log"; then
            result rdma-netns-mode PASS $(($(now) - _t0)) "" "$(grep netns "$_log")"
        else
            result rdma-netns-mode FAIL $(($(now) - _t0)) "" "$(tr '\n' ' ' <"$_log")"
        fi
    fi
    if ! rdma_dev_up "$CI_RDMA" "$CI_RDMA_DEV"; then
        echo "CI-ABORT reason=link-add"
        exit 0
    fi
    if [ "$ROLE" != server ]; then
        netns_tools
        say "cell done"
        return
    fi
    _t0=$(now)
    _log=$CI_LOGDIR/netns-move.$ROLE.log
    {
        ip netns add vr &&
            ip link set eth0 netns vr &&
            ip -n vr link set lo up &&
            ip -n vr addr add "$SELF/24" dev eth0 &&
            ip -n vr link set eth0 up &&
            if [ "$_mode" = exclusive ]; then rdma dev set "$CI_RDMA_DEV" netns vr; fi
    } >"$_log" 2>&1
    _moved=$?
    _init=$(rdma dev show 2>&1 | grep -c " $CI_RDMA_DEV:")
    _in_ns=$(ip netns exec vr rdma dev show 2>&1 | grep -c " $CI_RDMA_DEV:")
    _seen="initial namespace lists $CI_RDMA_DEV: $_init, namespace vr: $_in_ns; $(ip netns exec vr rdma link show 2>&1 | tr '\n' ' ')"
    if [ "$_mode" = exclusive ]; then _want="0 1"; else _want="1 1"; fi
    if [ $_moved = 0 ] && [ "$_init $_in_ns" = "$_want" ]; then
        result rdma-netns-visible PASS $(($(now) - _t0)) "" "$_seen"
    else
        result rdma-netns-visible FAIL $(($(now) - _t0)) "" "move rc=$_moved ($(tr '\n' ' ' <"$_log")); $_seen; want $_want"
    fi
    # the rest runs inside vr: a new shell that continues the barrier count
    ip netns exec vr env CI_NO_KALLSYMS=1 sh -c ". /opt/vr/ci/ci-lib.sh; ci_barrier_n=$ci_barrier_n; netns_tools"
    say "cell done"
}

# netns_tools: the tools of the netns cells (RoCE v2 GID of SELF on CI_RDMA_DEV).
netns_tools() {
    gidx=$(roce_gid_index "$CI_RDMA_DEV" "$SELF") || {
        say "no RoCE v2 GID for $SELF on $CI_RDMA_DEV"
        gidx=1
    }
    say "RoCE v2 GID index of $SELF on $CI_RDMA_DEV: $gidx ($(ip -o -4 addr show eth0 2>&1))"
    tool_test ibv_rc_pingpong tcp 18601 \
        "ibv_rc_pingpong -d $CI_RDMA_DEV -g $gidx -p 18601 -n 200" \
        "ibv_rc_pingpong -d $CI_RDMA_DEV -g $gidx -p 18601 -n 200 $PEER" check_pingpong
    RPING_COUNT=10 tool_test rping cm 18602 \
        "rping -s -a $SELF -p 18602 -C 10 -v -V" \
        "rping -c -a $PEER -p 18602 -C 10 -v -V" check_rping
    tool_test ib_write_bw tcp 18611 \
        "ib_write_bw -d $CI_RDMA_DEV -x $gidx -n $CI_PERFTEST_ITERS -p 18611" \
        "ib_write_bw -d $CI_RDMA_DEV -x $gidx -n $CI_PERFTEST_ITERS -p 18611 $PEER" check_perftest
    diag "$CI_RDMA_DEV"
}

# cell_upstream_rdma: rdma-core's own test suite (pyverbs `tests/`, as
# packaged with the guest's rdma-core in /opt/rdma-core-tests, unmodified) on
# this guest's RDMA device alone: the server guest's erdma_0, the client
# guest's rxe0 as baseline. No barrier: each suite needs only its device (its
# QPs talk to each other through the device's loopback).
#
# The suite runs in one python3 process (importing pyverbs costs seconds
# under TCG), resumed after a case that kills it (signal) or goes silent for
# CI_UPSTREAM_SILENCE s: the next round runs the cases that had not started,
# the case that was running first (once more, alone in a fresh process:
# python3 also dies while collecting an earlier case's objects). unittest
# prints tracebacks only at the end of a process, so failures of a round
# that died are run once more at the end ("detail" round) for theirs.
# Everything unittest prints goes to /job/rdma-core.ROLE.log; the host judges
# every case against ci/upstream/rdma-core-DEVICE.expect. A process death is
# marked in the log by "UPSTREAM-KILLED id=CASE rc=RC why=WHY".
# Test "rdma-core-suite": every listed case started.
CI_UPSTREAM_SILENCE=${CI_UPSTREAM_SILENCE:-150}

# upstream_round NAME IDS_FILE: run the cases in IDS_FILE in one python3
# process under the silence watchdog, append its output to $_log; sets _rc,
# _why ("" when it ended by itself) and /tmp/upstream.started.
upstream_round() {
    echo "UPSTREAM-ROUND $1 cases=$(wc -l <"$2")" >>"$_log"
    : >"$_part"
    # shellcheck disable=SC2046 # one argument per case id
    PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 python3 run_tests.py --dev "$CI_RDMA_DEV" -v $(cat "$2") >"$_part" 2>&1 &
    _pid=$!
    _size=-1 _quiet=0 _why=""
    while kill -0 $_pid 2>/dev/null; do
        sleep 5
        _s=$(wc -c <"$_part")
        if [ "$_s" = "$_size" ]; then _quiet=$((_quiet + 5)); else _quiet=0 _size=$_s; fi
        if [ $_quiet -ge "$CI_UPSTREAM_SILENCE" ]; then
            _why="silent for ${CI_UPSTREAM_SILENCE}s"
            kill -9 $_pid 2>/dev/null
            break
        fi
    done
    wait $_pid
    _rc=$?
    cat "$_part" >>"$_log"
    printf "\nUPSTREAM-END %s rc=%s\n" "$1" "$_rc" >>"$_log"
    # started cases: unittest -v prints "name (id) ... " before running
    # one (the " ... " goes after the docstring's line if it has one)
    sed -n 's/^[^ ]* (\(tests\.[^) ]*\))\( \.\.\. .*\)\{0,1\}$/\1/p' "$_part" >/tmp/upstream.started
    if ! grep -q '^Ran [0-9]* tests\? in' "$_part"; then
        [ -n "$_why" ] || _why="python3 exited $_rc"
        _last=$(tail -n 1 /tmp/upstream.started)
        echo "UPSTREAM-KILLED id=${_last:-none} rc=$_rc why=$_why" >>"$_log"
        say "rdma-core suite round $1 stopped at ${_last:-?} ($_why)"
        dmesg | tail -n 20 | sed 's/^/DMESG /' >>"$_log"
        # failed cases whose tracebacks died with the process
        awk '/^[^ ]* \(tests\.[^) ]*\)/ { id = $2; gsub(/[()]/, "", id) }
             / \.\.\. (ERROR|FAIL)$/ || /^(ERROR|FAIL)$/ { if (id != "") print id }' "$_part" >>/tmp/upstream.detail
    fi
}

cell_upstream_rdma() {
    net_up
    if ! rdma_dev_up "$CI_RDMA" "$CI_RDMA_DEV"; then
        echo "CI-ABORT reason=link-add"
        exit 0
    fi
    _t0=$(now)
    rm -f /tmp/upstream.retried /tmp/upstream.detail
    # 2 MiB pages for the suite's huge-page cases (64 MiB of the guest's 512)
    echo 32 >/proc/sys/vm/nr_hugepages 2>/dev/null
    say "huge pages: $(cat /proc/sys/vm/nr_hugepages 2>&1)"
    _log=$CI_LOGDIR/rdma-core.$ROLE.log _part=/tmp/upstream.part
    _all=$CI_LOGDIR/rdma-core-cases.$ROLE _todo=/tmp/upstream.todo
    : >"$_log"
    if ! cd /opt/rdma-core-tests 2>/dev/null; then
        result rdma-core-suite FAIL 0 "" "no /opt/rdma-core-tests in the guest image (python3-pyverbs)"
        return
    fi
    # --list-tests prints the ids, then "NO TESTS RAN" (exit 5 on Python >= 3.12)
    python3 run_tests.py --dev "$CI_RDMA_DEV" --list-tests 2>"$_part" | grep '^tests\.' >"$_all"
    if [ ! -s "$_all" ]; then
        result rdma-core-suite FAIL $(($(now) - _t0)) "" "--list-tests failed: $(tail -n 3 "$_part")"
        return
    fi
    echo "UPSTREAM-CASES $(wc -l <"$_all")" >>"$_log"
    cp "$_all" "$_todo"
    _round=0
    while [ -s "$_todo" ] && [ $_round -lt 40 ]; do
        _round=$((_round + 1))
        upstream_round $_round "$_todo"
        [ -n "$_why" ] || break
        [ -s /tmp/upstream.started ] || break  # no progress: the next round would do the same
        # The case that was running gets one more try, first in a fresh
        # process (seen with rxe: "Failed to dealloc PD. Errno: 9", then
        # SIGSEGV in libibverbs while garbage-collecting, in whichever case
        # runs then). A case that dies again on its own is killed for good.
        if [ -n "$_last" ] && ! grep -qxF "$_last" /tmp/upstream.retried 2>/dev/null; then
            echo "$_last" >>/tmp/upstream.retried
            { echo "$_last"; grep -vxF -f /tmp/upstream.started "$_todo"; } >/tmp/upstream.left
        else
            grep -vxF -f /tmp/upstream.started "$_todo" >/tmp/upstream.left
        fi
        mv /tmp/upstream.left "$_todo"
    done
    if [ -s /tmp/upstream.detail ]; then
        sort -u /tmp/upstream.detail >/tmp/upstream.detail.ids
        upstream_round detail /tmp/upstream.detail.ids
    fi
    _ran=$(sed -n 's/^[^ ]* (\(tests\.[^) ]*\))\( \.\.\. .*\)\{0,1\}$/\1/p' "$_log" | sort -u | wc -l)
    _n=$(wc -l <"$_all")
    _sum="$(grep -E '^(Ran [0-9]+ test|OK|FAILED)' "$_log" | tr '\n' ' ')$(grep -c '^UPSTREAM-KILLED' "$_log") process deaths"
    cd /
    upstream_repro_query_qp
    if [ "$_ran" -ge "$_n" ]; then
        result rdma-core-suite PASS $(($(now) - _t0)) "" "$_n cases on $CI_RDMA_DEV in $_round round(s): $_sum"
    else
        result rdma-core-suite FAIL $(($(now) - _t0)) "" "$_ran of $_n cases started on $CI_RDMA_DEV in $_round round(s): $_sum"
    fi
}

# Test "repro-query-qp-uninit" (docs/upstream-suites.md): the erdma driver's
# query_qp leaves qp_attr->timeout unset, so user space gets what the
# kernel's slab held (ci/guest/repro/query_qp_uninit.py). Expected: erdma
# echoes a value from an earlier modify (the driver bug, reproduced); rxe,
# which writes the field, never does.
upstream_repro_query_qp() {
    _t1=$(now)
    _out=$CI_LOGDIR/repro-query-qp-uninit.$ROLE.log
    timeout 120 python3 /opt/vr/ci/repro/query_qp_uninit.py "$CI_RDMA_DEV" >"$_out" 2>&1
    _e=$(sed -n 's/^RESULT .* echoed=\([0-9]*\)\/.*/\1/p' "$_out")
    _line=$(grep '^RESULT' "$_out")
    if [ -z "$_e" ]; then
        result repro-query-qp-uninit FAIL $(($(now) - _t1)) "" "no RESULT line: $(tail -n 3 "$_out")"
    elif [ "$CI_RDMA" = erdma ] && [ "$_e" -gt 0 ]; then
        result repro-query-qp-uninit PASS $(($(now) - _t1)) "" "driver bug reproduced: $_line (query_qp returned the scratch modify's timeout)"
    elif [ "$CI_RDMA" = erdma ]; then
        result repro-query-qp-uninit FAIL $(($(now) - _t1)) "" "not reproduced ($_line): a fixed driver? update docs/upstream-suites.md"
    elif [ "$_e" = 0 ]; then
        result repro-query-qp-uninit PASS $(($(now) - _t1)) "" "baseline: $_line (the driver writes timeout)"
    else
        result repro-query-qp-uninit FAIL $(($(now) - _t1)) "" "baseline echoed: $_line"
    fi
}

# cell_upstream_nic: the kernel's NIC driver selftests (drivers/net/*.py and
# drivers/net/hw/*.py of the guest kernel's own source, unmodified; tree from
# scripts/build-nic-selftests.sh in /opt/vr/nic-selftests) in HW mode, with
# NETIF = this guest's NIC under test (CI_NIC: gve = the daemon's emulated
# gVNIC, virtio = eth0, the baseline) and the remote end a network namespace
# holding eth1 (a second virtio-net port on the same fabric): REMOTE_TYPE=netns.
# Each file runs in its own python3 process (timeout CI_NIC_FILE_TIMEOUT s);
# its KTAP output goes to /job/nic.ROLE.log between "UPSTREAM-FILE F" and
# "UPSTREAM-FILE-END F rc=RC" lines; the host judges every case against
# ci/upstream/nic-NIC.expect. On gve, stats.py is not run: its link-down
# queue-stats dump oopses the 7.3 gve driver (docs/upstream-suites.md);
# repro-gve-qstats-oops shows that bug with a short script, last.
# Tests: "nic-setup", "nic-suite" (every file ran to its end or its timeout).
CI_NIC_FILE_TIMEOUT=${CI_NIC_FILE_TIMEOUT:-300}

# nic_env_restore: before each file, the endpoint as the suite expects it:
# NETIF and the remote up at MTU 1500 with their addresses. A test that
# lowers the MTU below 1280 removes the IPv6 addresses, and one that fails
# half-way may leave the link down: that must not fail the next file.
nic_env_restore() {
    ip link set "$NETIF" mtu 1500 2>/dev/null
    ip link set "$NETIF" up
    [ "$NETIF" != eth0 ] && ip addr replace "$LOCAL_V4/24" dev "$NETIF"
    ip -6 addr replace "$LOCAL_V6/64" dev "$NETIF" nodad
    ip -n remote link set eth1 mtu 1500 2>/dev/null
    ip -n remote link set eth1 up
    ip -n remote addr replace "$REMOTE_V4/24" dev eth1
    ip -n remote -6 addr replace "$REMOTE_V6/64" dev eth1 nodad
}

cell_upstream_nic() {
    _t0=$(now)
    _log=$CI_LOGDIR/nic.$ROLE.log
    : >"$_log"
    if [ "$CI_NIC" = gve ]; then
        NETIF=""
        for _n in /sys/class/net/*; do
            [ "$(basename "$(readlink -f "$_n/device/driver" 2>/dev/null)")" = gve ] && NETIF=${_n##*/}
        done
        LOCAL_V4=10.78.${CI_NIC_NET:-0}.1
    else
        NETIF=eth0
        LOCAL_V4=$SELF
    fi
    REMOTE_V4=${LOCAL_V4%.*}.$((${LOCAL_V4##*.} + 100))
    LOCAL_V6=fd77:${CI_NIC_NET:-0}::${LOCAL_V4##*.} REMOTE_V6=fd77:${CI_NIC_NET:-0}::${REMOTE_V4##*.}
    if [ -z "$NETIF" ] || [ ! -d /sys/class/net/eth1 ]; then
        result nic-setup FAIL $(($(now) - _t0)) "" "no NIC under test (CI_NIC=$CI_NIC) or no eth1: $(ls /sys/class/net | tr '\n' ' ')"
        echo "CI-ABORT reason=nic-setup"
        exit 0
    fi
    [ "$NETIF" != eth0 ] && { ip addr flush dev eth0; ip link set eth0 down; }
    # As NIC vendors' runners prepare a device under test: the gVNIC's ntuple
    # filters (flow steering) are off by default (hw_features only), and the
    # devmem, ntuple and RSS-context tests steer flows to queues.
    [ "$CI_NIC" = gve ] && ethtool -K "$NETIF" ntuple on
    ip netns add remote
    ip link set eth1 netns remote
    ip -n remote link set lo up
    ip -n remote addr add "$REMOTE_V4/24" dev eth1
    ip -n remote -6 addr add "$REMOTE_V6/64" dev eth1 nodad
    ip -n remote link set eth1 up
    [ "$NETIF" != eth0 ] && ip addr add "$LOCAL_V4/24" dev "$NETIF"
    ip -6 addr add "$LOCAL_V6/64" dev "$NETIF" nodad
    ip link set "$NETIF" up
    _i=0
    until ping -c 1 -W 2 "$REMOTE_V4" >/dev/null 2>&1; do
        _i=$((_i + 1))
        if [ $_i -ge 30 ]; then
            result nic-setup FAIL $(($(now) - _t0)) "" "$NETIF ($LOCAL_V4) cannot ping the namespace's eth1 ($REMOTE_V4): $(ip -br addr | tr '\n' ' ')"
            echo "CI-ABORT reason=nic-setup"
            exit 0
        fi
        sleep 1
    done
    result nic-setup PASS $(($(now) - _t0)) "" "NETIF=$NETIF ($(ethtool -i "$NETIF" | sed -n 's/^driver: //p')) $LOCAL_V4 $LOCAL_V6; remote netns eth1 $REMOTE_V4 $REMOTE_V6"
    export NETIF LOCAL_V4 REMOTE_V4 LOCAL_V6 REMOTE_V6
    REMOTE_TYPE=netns REMOTE_ARGS=remote
    export REMOTE_TYPE REMOTE_ARGS
    # a writable copy: the suites write next to themselves (pyc, helpers)
    cp -a /opt/vr/nic-selftests /tmp/ksrc
    cd /tmp/ksrc/tools/testing/selftests/drivers/net || return
    _files=$(ls ./*.py hw/*.py | sed 's|^\./||' | grep -v '_lib\.py$')
    # CI_NIC_FILES (space separated, e.g. "gro.py hw/gro_hw.py"): only these
    [ -n "${CI_NIC_FILES:-}" ] && _files=$CI_NIC_FILES
    _t1=$(now) _nf=0 _late=0
    for _f in $_files; do
        if [ "$CI_NIC" = gve ] && [ "$_f" = stats.py ]; then
            echo "UPSTREAM-FILE-NOT-RUN $_f why=its link-down qstats dump oopses the 7.3 gve driver (repro-gve-qstats-oops)" >>"$_log"
            continue
        fi
        _nf=$((_nf + 1))
        nic_env_restore
        echo "UPSTREAM-FILE $_f" >>"$_log"
        say "nic suite: $_f"
        _tf=$(now)
        timeout -k 10 "$CI_NIC_FILE_TIMEOUT" python3 "$_f" >>"$_log" 2>&1
        _rc=$?
        _tf=$(($(now) - _tf))
        printf "\nUPSTREAM-FILE-END %s rc=%s secs=%s\n" "$_f" "$_rc" "$_tf" >>"$_log"
        echo "$_tf $_f" >>/tmp/nic-file-secs
        [ $_rc = 124 ] || [ $_rc = 137 ] && _late=$((_late + 1))
    done
    # the slowest files, so a slow suite shows where its minutes went
    _slow=$(sort -rn /tmp/nic-file-secs 2>/dev/null | head -n 4 | awk '{ printf "%s%s %ss", (NR > 1 ? ", " : ""), $2, $1 }')
    result nic-suite PASS $(($(now) - _t1)) "" "$_nf files on $NETIF, $_late stopped by the ${CI_NIC_FILE_TIMEOUT}s timeout; slowest: $_slow"
    cd /
    [ "$CI_NIC" = gve ] && repro_gve_qstats_oops
}

# Test "repro-gve-qstats-oops" (docs/upstream-suites.md): with the link down
# the 7.3 gve driver has freed its rings, and a netdev queue-stats dump (what
# drivers/net/stats.py does) calls gve_get_rx_queue_stats, which dereferences
# priv->rx = NULL. Expected: the dump dies and the kernel logs the oops in
# gve_get_[rt]x_queue_stats (the driver bug, reproduced; fixed upstream).
repro_gve_qstats_oops() {
    _t1=$(now)
    _out=$CI_LOGDIR/repro-gve-qstats-oops.$ROLE.log
    ip link set "$NETIF" down
    timeout 60 python3 /opt/vr/ci/repro/qstats_dump.py "$NETIF" >"$_out" 2>&1
    _rc=$?
    sleep 2
    dmesg | grep -A 30 -E 'BUG: kernel NULL pointer dereference|Oops' | head -n 40 >>"$_out"
    _where=$(grep -m 1 -oE 'RIP: 0010:gve_get_[rt]x_queue_stats[^ ]*' "$_out")
    if [ -n "$_where" ] && [ $_rc != 0 ]; then
        result repro-gve-qstats-oops PASS $(($(now) - _t1)) "" "driver bug reproduced: the dump died (rc=$_rc), kernel oops at $_where"
    else
        result repro-gve-qstats-oops FAIL $(($(now) - _t1)) "" "not reproduced (dump rc=$_rc, $(tail -n 1 "$_out")): a fixed driver? update docs/upstream-suites.md"
    fi
}

# ---------------------------------------------------------------------------
# Device-fault cells (issue 25, docs/driver-bench.md): gve-faults, erdma-faults.
# The server guest's device is faulted through the daemon's control socket:
# ci_ctl asks the host (guest-runner ctl-broker, started by the matrix) to run `vhost-rdma ctl ARGS`.
# Every case prints one line from the server,
#     CI-TEST test=fault-CASE role=server status=.. reason="hits=N recovered=yes|no ... evidence: ..."
# (status FAIL only when the case could not be run: a ctl command failed);
# the host judges it against the cell's fault cases (guest-runner/src/cells.rs).
CI_FAULT_BYTES=${CI_FAULT_BYTES:-4M}

# ci_ctl ARGS...: `vhost-rdma ctl ARGS` run by the host against this cell's
# daemon; prints its output, returns its exit status (99: no answer in 60 s)
# (the request number lives in a file: ci_ctl often runs inside $(...), a subshell)
ci_ctl() {
    ci_ctl_n=$(($(cat /job/ctl-seq 2>/dev/null || echo 0) + 1))
    echo "$ci_ctl_n" >/job/ctl-seq
    _cq=/job/ctl-req.$ci_ctl_n
    printf '%s\n' "$@" >"$_cq.tmp" && mv "$_cq.tmp" "$_cq"
    _ci=0
    while [ ! -e "/job/ctl-rep.$ci_ctl_n" ]; do
        _ci=$((_ci + 1))
        if [ $_ci -ge 300 ]; then
            echo "ci_ctl: no answer from the host for: ctl $*"
            return 99
        fi
        sleep 0.2
    done
    _crc=$(head -n 1 "/job/ctl-rep.$ci_ctl_n" | sed -n 's/^rc=//p')
    tail -n +2 "/job/ctl-rep.$ci_ctl_n"
    return "${_crc:-98}"
}

# fault_add ID KIND [KEY=VALUE...] [--count N]: a device-fault rule on $FPORT;
# a failure is noted in $_fwhy (the case then reports FAIL)
fault_add() {
    _fa=$1 _fk=$2
    shift 2
    echo "+ ctl device-fault add --port $FPORT --kind $_fk --id $_fa $*" >>"$_flog"
    _fout=$(ci_ctl device-fault add --port "$FPORT" --kind "$_fk" --id "$_fa" "$@" 2>&1)
    _frc=$?
    echo "$_fout" >>"$_flog"
    [ $_frc = 0 ] || _fwhy="$_fwhy ctl device-fault add --kind $_fk $*: rc=$_frc $(echo "$_fout" | tail -n 2 | tr '\n' ' ');"
    return $_frc
}

# fault_clear ID: clear the rule (lasting faults end: stall over, link back up)
fault_clear() {
    echo "+ ctl device-fault clear $1 --port $FPORT" >>"$_flog"
    ci_ctl device-fault clear "$1" --port "$FPORT" >>"$_flog" 2>&1 || _fwhy="$_fwhy ctl device-fault clear $1 failed;"
}

# fault_hits ID: the rule's hit counter in `ctl --json device-fault list` ("?" if not listed)
fault_hits() {
    ci_ctl --json device-fault list 2>/dev/null | python3 -c '
import json, sys
want = sys.argv[1]
def walk(x):
    if isinstance(x, dict):
        if str(x.get("id")) == want and "hits" in x:
            return x["hits"]
        for v in x.values():
            r = walk(v)
            if r is not None:
                return r
    elif isinstance(x, list):
        for v in x:
            r = walk(v)
            if r is not None:
                return r
    return None
try:
    h = walk(json.load(sys.stdin))
except ValueError:
    h = None
print("?" if h is None else h)' "$1"
}

# wait_hits ID SECS: until the rule has fired (sets _hits)
wait_hits() {
    _wi=0
    while :; do
        _hits=$(fault_hits "$1")
        case "$_hits" in ''|'?'|0) ;; *) return 0 ;; esac
        _wi=$((_wi + 1))
        [ $_wi -ge "$2" ] && return 1
        sleep 1
    done
}

dmesg_mark() { _dm0=$(dmesg | wc -l); }
# dmesg_new REGEX: kernel lines since dmesg_mark matching REGEX, without timestamps, at most 3, one line
dmesg_new() {
    dmesg | tail -n +$((_dm0 + 1)) | grep -E "$1" | sed 's/^\[[^]]*\] *//' | head -n 3 | tr '\n' '/' | sed 's/\/$//'
}
# wait_dmesg PATTERN SECS [CMD...]: until a new dmesg line matches (CMD, if
# given, runs each round: something the driver must see before it logs)
wait_dmesg() {
    _wi=0 _wp=$1 _ws=$2
    shift 2
    while [ -z "$(dmesg_new "$_wp")" ]; do
        _wi=$((_wi + 1))
        [ $_wi -ge $((_ws * 2)) ] && return 1
        [ $# -gt 0 ] && "$@" >/dev/null 2>&1
        sleep 0.5
    done
}

# fault_result CASE: the server's line for a case (longer reason than result())
fault_result() {
    _st=PASS
    [ -n "$_fwhy" ] && _st=FAIL
    _r=$(printf '%s' "hits=$_hits recovered=$_rec during=$_during after=$_after${_fwhy:+ problems:$_fwhy} evidence: $_ev" |
        tr '\n"' "  " | cut -c1-900)
    echo "CI-TEST test=fault-$1 role=$ROLE status=$_st secs=$(($(now) - _ft0)) reason=\"$_r\""
    [ "$_st" = PASS ] || show_log "$_flog" 30
}

# ---- gve: the emulated gVNIC as a new user starts it (the README's port
# line, its defaults: no queues=) on the server, against the client's
# virtio-net. The host checks the device's side of header-split, rss, ntuple
# and devmem-rx in the status snapshots the server takes through ci_ctl
# (/job/status-live.json, /job/status-devmem.json).

# gve_stream NAME BYTES DIRECTION PORT: a verified TCP stream over the
# gVNIC's subnet (the server listens on 10.78.0.1; c2s is gve RX)
gve_stream() {
    _gs=$SELF _gp=$PEER
    SELF=$GVE_SRV PEER=$GVE_SRV
    smc_stream "$1" tcp "$2" 1 "$3" "$4"
    SELF=$_gs PEER=$_gp
}
# gstat_eth NAME: one `ethtool -S` counter of the gVNIC
gstat_eth() { ethtool -S "$GVE_IF" | sed -n "s/^ *$1: //p" | head -n 1; }

cell_gve() {
    gve_up
    _t0=$(now)
    if [ "$ROLE" = server ]; then
        _drv=$(ethtool -i "$GVE_IF" 2>/dev/null | sed -n 's/^driver: //p')
        if dmesg | grep -q 'DQO RDA queue format' && [ "$_drv" = gve ]; then
            result probe PASS 0 "" "driver $_drv, DQO RDA queue format"
        else
            result probe FAIL 0 "" "driver '$_drv': $(dmesg | grep -i gve | tail -n 3 | tr '\n' ' ')"
        fi
        _ch() { ethtool -l "$GVE_IF" | awk -v s="$1" '$0 ~ s { p = 1 } p && /^RX:/ { print $2; exit }'; }
        _max=$(_ch Pre-set) _boot=$(_ch Current)
        ethtool -L "$GVE_IF" rx 2 tx 2
        _rc=$? _cur=$(_ch Current)
        if [ $_rc = 0 ] && [ "$_max" = 2 ] && [ "$_boot" = 2 ] && [ "$_cur" = 2 ]; then
            result channels PASS 0 "" "max rx 2, rx 2 at boot and after ethtool -L rx 2 tx 2"
        else
            result channels FAIL 0 "" "ethtool -L rc=$_rc; max rx '$_max', at boot '$_boot', now '$_cur' (want 2, 2, 2)"
        fi
        ethtool -G "$GVE_IF" tcp-data-split on
        _hsrc=$? _hs0=$(gstat_eth rx_hsplit_pkt)
    fi
    gve_stream tcp-gve-tx "$CI_GVE_BYTES" s2c 5201
    gve_stream tcp-gve-rx "$CI_GVE_BYTES" c2s 5202
    if [ "$ROLE" = server ]; then
        _hs=$(($(gstat_eth rx_hsplit_pkt) - ${_hs0:-0}))
        if [ $_hsrc = 0 ] && [ $_hs -gt 1000 ]; then
            result header-split PASS 0 "" "ethtool -G tcp-data-split on; $_hs packets split (rx_hsplit_pkt)"
        else
            result header-split FAIL 0 "" "ethtool -G rc=$_hsrc; $_hs packets split (rx_hsplit_pkt), want > 1000"
        fi
        ethtool -x "$GVE_IF" | sed 's/^/    /'
        _n=$(ethtool -x "$GVE_IF" | grep -cE '^ *[0-9]+: ')
        _kl=$(ethtool -x "$GVE_IF" | sed -n '/RSS hash key/{n;p}' | tr ':' '\n' | grep -c .)
        ethtool -X "$GVE_IF" weight 2 1
        _rc=$?
        if [ $_rc = 0 ] && [ "$_n" -ge 16 ]; then
            result rss PASS 0 "" "ethtool -x: $_n table rows, a $_kl-byte key; ethtool -X weight 2 1"
        else
            result rss FAIL 0 "" "ethtool -X weight 2 1 rc=$_rc; ethtool -x: $_n table rows (want >= 16), $_kl-byte key"
        fi
        ethtool -N "$GVE_IF" flow-type tcp4 dst-port 5203 action 1
        _nrc=$? _q1=$(gstat_eth 'rx_bytes\[1\]')
    fi
    gve_stream ntuple-flow 16M c2s 5203
    if [ "$ROLE" = server ]; then
        _d1=$(($(gstat_eth 'rx_bytes\[1\]') - ${_q1:-0}))
        ci_ctl --json status >/job/status-live.json
        if [ $_nrc = 0 ] && [ $_d1 -ge 16000000 ]; then
            result ntuple PASS 0 "" "ethtool -N flow-type tcp4 dst-port 5203 action 1: queue 1 took $_d1 bytes"
        else
            result ntuple FAIL 0 "" "ethtool -N rc=$_nrc; queue 1 took $_d1 bytes of the 16 MiB flow"
        fi
        ethtool -N "$GVE_IF" delete 63 2>/dev/null
        # without -s/-c ncdevmem checks the devmem API: an empty queue list
        # refused, a bind with header split off refused, with it on done,
        # shrinking channels under a bound queue refused
        ncdevmem -f "$GVE_IF" >"$CI_LOGDIR/devmem-selfcheck.log" 2>&1
        _rc=$?
        if [ $_rc = 0 ]; then
            result devmem-selfcheck PASS 0 "" "ncdevmem -f $GVE_IF: $(grep -c 'got dmabuf id' "$CI_LOGDIR/devmem-selfcheck.log") bind(s)"
        else
            result devmem-selfcheck FAIL 0 "" "ncdevmem -f $GVE_IF rc=$_rc: $(tail -n 3 "$CI_LOGDIR/devmem-selfcheck.log" | tr '\n' ' ')"
        fi
    fi
    # devmem-rx: 64 MiB from the client into a udmabuf bound to the last
    # queue, every byte validated (-v 7); ncdevmem -c matches the client's
    # source port too, so the sender binds it
    barrier "devmem-rx start"
    _t1=$(now)
    if [ "$ROLE" = server ]; then
        ncdevmem -l -f "$GVE_IF" -s "$GVE_SRV" -c 10.78.0.2 -p 5204 -v 7 >/tmp/rx.out 2>"$CI_LOGDIR/devmem-rx.log"
        _rc=$?
        _tot=$(sed -n 's/^total_received=//p' "$CI_LOGDIR/devmem-rx.log" | tail -n 1)
        _bad=$(grep -c 'Failed validation' "$CI_LOGDIR/devmem-rx.log")
        ci_ctl --json status >/job/status-devmem.json
        if [ $_rc = 0 ] && [ "$_tot" = 67108864 ] && [ "$_bad" = 0 ]; then
            result devmem-rx PASS $(($(now) - _t1)) "" "total_received=$_tot validated frags $(grep -c 'Validated buffer' /tmp/rx.out), 0 failed; $(grep -m1 'using queues' "$CI_LOGDIR/devmem-rx.log")"
        else
            result devmem-rx FAIL $(($(now) - _t1)) "" "ncdevmem rc=$_rc total_received=$_tot failed validations $_bad: $(grep -vE '^(recvmsg ret|received frag|total_received)' "$CI_LOGDIR/devmem-rx.log" | tail -n 3 | tr '\n' ' ')"
        fi
    else
        smc-guest-tests devmem-send --to "$GVE_SRV:5204" --bind 10.78.0.2:5204 --bytes 64M --pattern-mod 7 \
            --connect-timeout 300 >"$CI_LOGDIR/devmem-rx.log" 2>&1
        _rc=$?
        [ $_rc = 0 ] && _st=PASS || _st=FAIL
        result devmem-rx $_st $(($(now) - _t1)) "" "devmem-send rc=$_rc: $(tail -n 1 "$CI_LOGDIR/devmem-rx.log")"
    fi
    barrier "devmem-rx done"
    # the queue takes ordinary pages again
    gve_stream devmem-after 16M c2s 5206
    if [ "$ROLE" = server ]; then
        ethtool -G "$GVE_IF" tcp-data-split off
        ncdevmem -l -n -f "$GVE_IF" -s "$GVE_SRV" -p 5205 -t 1 -q 1 >"$CI_LOGDIR/devmem-hds-off.log" 2>&1
        _rc=$?
        if [ $_rc != 0 ] && grep -q "tcp-data-split is disabled" "$CI_LOGDIR/devmem-hds-off.log"; then
            result devmem-hds-off PASS 0 "" "refused: $(grep -o 'Kernel error: .*' "$CI_LOGDIR/devmem-hds-off.log" | head -n 1)"
        else
            result devmem-hds-off FAIL 0 "" "with header split off ncdevmem rc=$_rc: $(tail -n 3 "$CI_LOGDIR/devmem-hds-off.log" | tr '\n' ' ')"
        fi
        ethtool -S "$GVE_IF" | grep -E '^ *(rx_packets|rx_hsplit_pkt|tx_packets|rx_bytes\[|rx_hsplit_bytes\[)' | sed 's/^/    /'
    fi
    say "cell done"
}

# ---- gve-faults: the server's gVNIC (GVE_IF, 10.78.0.1/24, one queue pair)
# against the client's virtio eth0 (10.78.0.2/24 added); both guests answer
# ARP only on the interface that holds the address (else the server's eth0
# would answer for 10.78.0.1 and the traffic would bypass the gVNIC).
GVE_SRV=10.78.0.1
GVE_STATS="rx_desc_err_dropped_pkt tx_dropped tx_timeouts reset_cnt"

gstat() { ethtool -S "$GVE_IF" 2>/dev/null | sed -n "s/^ *$1: //p" | head -n 1; }
stat_mark() {
    for _k in $GVE_STATS; do eval "_s0_$_k=\$(gstat $_k)"; done
}
# stat_delta: "name +d" for every counter in GVE_STATS since stat_mark
stat_delta() {
    _sd=
    for _k in $GVE_STATS; do
        eval "_b=\${_s0_$_k:-0}"
        _a=$(gstat "$_k")
        _d=$((${_a:-0} - ${_b:-0}))
        [ $_d -ge 0 ] && _d="+$_d"
        _sd="$_sd $_k $_d"
    done
    echo "${_sd# }"
}
carrier() { cat "/sys/class/net/$GVE_IF/carrier" 2>/dev/null || echo '?'; }
# wait_carrier V SECS
wait_carrier() {
    _wi=0
    while [ "$(carrier)" != "$1" ]; do
        _wi=$((_wi + 1))
        [ $_wi -ge $(($2 * 2)) ] && return 1
        sleep 0.5
    done
}

# ftcp NAME DIRECTION BYTES PORT [IO_TIMEOUT] [CONNS]: one verified TCP stream
# (BYTES per connection) over the gVNIC's subnet (server side 10.78.0.1);
# sets _tok=pass|fail, log in /job/NAME.ROLE.log
ftcp() {
    _tl=$CI_LOGDIR/$1.$ROLE.log
    _tc="--proto tcp --port $4 --bytes $3 --direction $2 --seed 25 --io-timeout ${5:-60} --conns ${6:-1}"
    if [ "$ROLE" = server ]; then
        _tcmd="smc-guest-tests stream server --addr $GVE_SRV $_tc --once --accept-timeout 90"
    else
        _tcmd="smc-guest-tests stream client --addr $GVE_SRV $_tc --connect-timeout 60"
    fi
    echo "+ $_tcmd" >"$_tl"
    # shellcheck disable=SC2086
    timeout -k 5 240 $_tcmd >>"$_tl" 2>&1
    _trc=$?
    echo "rc=$_trc" >>"$_tl"
    _tok=fail
    [ $_trc = 0 ] && grep '^STREAM-RESULT' "$_tl" | tail -n 1 | grep 'verified=1' | grep -q 'status=pass' && _tok=pass
}

# gve_case CASE DURING [BYTES]: one fault case. DURING = c2s|s2c: a verified
# stream (BYTES, default CI_FAULT_BYTES) runs while the fault is armed (in the background on the server, whose
# gve_ev_CASE collects the evidence meanwhile), none: no stream. Then the
# rule is cleared (gve_undo_CASE undoes what the case did besides) and a
# verified 4 MiB stream both ways must pass ("recovered").
gve_case() {
    _case=$1 _dur=$2 _fbytes=${3:-$CI_FAULT_BYTES} _fconns=${4:-1}
    _fn=$(echo "$_case" | tr - _)
    _flog=$CI_LOGDIR/fault-$_case.$ROLE.log
    : >"$_flog"
    _fwhy= _ev= _hits='?' _during=- _after=- _rec=no _fid=$((_fid_n += 1))
    gport=$((gport + 2))
    barrier "$_case start"
    _ft0=$(now)
    if [ "$ROLE" = server ]; then
        dmesg_mark
        stat_mark
        say "fault case $_case: arming"
        "gve_arm_$_fn"
    fi
    barrier "$_case armed"
    if [ "$_dur" != none ]; then
        if [ "$ROLE" = server ]; then
            (ftcp "fault-$_case-during" "$_dur" "$_fbytes" "$gport" 90 "$_fconns"; echo "$_tok" >"$CI_LOGDIR/fault-$_case-during.tok") &
            _bgp=$!
            "gve_ev_$_fn"
            [ "$_hits" = '?' ] && _hits=$(fault_hits "$_fid")
            fault_clear "$_fid"
            "gve_undo_$_fn"
            wait "$_bgp"
            _during=$(cat "$CI_LOGDIR/fault-$_case-during.tok" 2>/dev/null || echo fail)
        else
            ftcp "fault-$_case-during" "$_dur" "$_fbytes" "$gport" 90 "$_fconns"
            _during=$_tok
        fi
    elif [ "$ROLE" = server ]; then
        "gve_ev_$_fn"
        [ "$_hits" = '?' ] && _hits=$(fault_hits "$_fid")
        fault_clear "$_fid"
        "gve_undo_$_fn"
    fi
    [ "$ROLE" = server ] && { wait_carrier 1 30 || say "$_case: no carrier 30 s after the clear"; }
    barrier "$_case cleared"
    ftcp "fault-$_case-after" both 4M $((gport + 1))
    _after=$_tok
    if [ "$ROLE" = server ]; then
        [ "$_after" = pass ] && _rec=yes
        _ev="$_ev; stats: $(stat_delta)"
        if [ "$_rec" = no ]; then
            # later cases need a working NIC: the driver's own full reset (ethtool --reset all)
            ethtool --reset "$GVE_IF" all >>"$_flog" 2>&1
            wait_carrier 1 30
            _ev="$_ev; repair: ethtool --reset $GVE_IF all, carrier $(carrier)"
        fi
        fault_result "$_case"
    fi
    barrier "$_case done"
}

# link-down: the device clears LINK_STATUS and raises the management interrupt
gve_arm_link_down() { fault_add "$_fid" link-down; }
gve_ev_link_down() {
    wait_carrier 0 20
    _ev="carrier_during=$(carrier); dmesg: $(dmesg_new 'link is|Device')"
    _hits=$(fault_hits "$_fid")
}
gve_undo_link_down() {
    wait_carrier 1 20 && return
    _ev="$_ev; the clear did not bring the carrier back: link-up added"
    fault_add $((_fid + 100)) link-up
}

# link-up: the port taken down with `ctl link` (fabric port and device), then the device's link-up alone
gve_arm_link_up() {
    echo "+ ctl link --port $FPORT down" >>"$_flog"
    ci_ctl link --port "$FPORT" down >>"$_flog" 2>&1 || _fwhy="$_fwhy ctl link --port $FPORT down failed;"
    wait_carrier 0 20
    _cdown=$(carrier)
    dmesg_mark
    fault_add "$_fid" link-up
}
gve_ev_link_up() {
    wait_carrier 1 20
    _ev="carrier_ctl_down=$_cdown carrier_during=$(carrier); dmesg: $(dmesg_new 'link is|Device')"
    _hits=$(fault_hits "$_fid")
}
gve_undo_link_up() {
    echo "+ ctl link --port $FPORT up" >>"$_flog"
    ci_ctl link --port "$FPORT" up >>"$_flog" 2>&1 || _fwhy="$_fwhy ctl link --port $FPORT up failed;"
}

# reset-request: DEVICE_STATUS reset bit + management interrupt
gve_arm_reset_request() { fault_add "$_fid" reset-request; }
gve_ev_reset_request() {
    wait_dmesg 'Performing reset' 30
    wait_carrier 1 30
    sleep 2
    _ev="dmesg: $(dmesg_new 'requested reset|Performing reset|Reset failed|link is')"
}
gve_undo_reset_request() { :; }

# adminq-status: the flow-rule command (ethtool -N) completes DEADLINE_EXCEEDED
gve_arm_adminq_status() {
    fault_add "$_fid" adminq-status "opcode=${CI_GVE_FLOW_OPCODE:-ADD_FLOW_RULE}" status=DEADLINE_EXCEEDED
}
gve_ev_adminq_status() {
    _eo=$(ethtool -N "$GVE_IF" flow-type tcp4 dst-port 5999 action 0 2>&1)
    _erc=$?
    wait_dmesg 'Performing reset' 30
    wait_carrier 1 30
    sleep 2
    _ev="ethtool -N rc=$_erc ($(echo "$_eo" | tr '\n' ' ' | cut -c1-80)); dmesg: $(dmesg_new 'AQ command|flow rule|Performing reset|Reset failed')"
    ethtool -N "$GVE_IF" delete 5999 >/dev/null 2>&1
}
gve_undo_adminq_status() { :; }

# the packet faults: wait until the rule fired, let the driver react, collect
gve_packet_ev() {
    wait_hits "$_fid" 30
    sleep "${1:-3}"
    _ev="dmesg: $(dmesg_new "${2:-gve|$GVE_IF}")"
}
gve_arm_rx_error() { fault_add "$_fid" rx-error queue=0; }
gve_ev_rx_error() { gve_packet_ev 3; }
gve_undo_rx_error() { :; }
# the NIC's own count of checksum errors (its stats report, refreshed within 1 s)
nic_csum() { ethtool -S "$GVE_IF" 2>/dev/null | sed -n 's/^ *rx_drops_invalid_checksum\[0\]: //p'; }
gve_arm_rx_bad_csum() {
    _nc0=$(nic_csum)
    fault_add "$_fid" rx-bad-csum queue=0
}
gve_ev_rx_bad_csum() {
    gve_packet_ev 3
    _nc1=$(nic_csum)
    _ev="$_ev; NIC stats report: rx_drops_invalid_checksum[0] +$((${_nc1:-0} - ${_nc0:-0}))"
}
gve_undo_rx_bad_csum() { :; }
gve_arm_rx_bad_buf_id() { fault_add "$_fid" rx-bad-buf-id queue=0; }
gve_ev_rx_bad_buf_id() { gve_packet_ev 3; }
gve_undo_rx_bad_buf_id() { :; }
gve_arm_tx_miss_reinject() { fault_add "$_fid" tx-miss queue=0 reinject=yes; }
gve_ev_tx_miss_reinject() { gve_packet_ev 4; }
gve_undo_tx_miss_reinject() { :; }
gve_arm_tx_miss_timeout() { fault_add "$_fid" tx-miss queue=0 reinject=no; }
gve_ev_tx_miss_timeout() {
    wait_hits "$_fid" 30
    # The driver looks for timed-out packets only when it cleans the TX
    # ring (gve_clean_tx_done_dqo in its NAPI poll), that is when other
    # completions arrive: once the stream is over, a ping a second keeps
    # completions coming until the timeout is found and logged.
    wait_dmesg 'No reinjection' 20 ping -c 1 -W 1 -I "$GVE_IF" 10.78.0.2
    _ev="dmesg: $(dmesg_new "gve|$GVE_IF")"
}
gve_undo_tx_miss_timeout() { :; }
# tx-stall: lasting, until cleared; armed 3 s into a stream on 8 connections,
# then 3000 UDP datagrams are queued behind it, so that the ring fills up and
# the queue is stopped: the netdev watchdog only looks at stopped queues, and
# TCP alone (a SYN-ACK, or streams whose congestion windows are less than the
# 512-entry ring) does not stop it: the stall then goes unnoticed (seen: a
# 50 s stall of one stream, and once of 8 streams on a loaded host, no
# watchdog). The watchdog (watchdog_timeo 5 s) calls gve_tx_timeout
gve_arm_tx_stall() { :; }
# udp_fill N: N datagrams of 1400 bytes to the peer at once (the socket's
# buffer forced to 16 MiB): more than the stalled ring holds, so the queue
# stops even when the TCP windows are still small (a loaded TCG host)
udp_fill() {
    python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 32, 16 << 20)  # SO_SNDBUFFORCE (root)
s.setblocking(False)
n = 0
for _ in range(int(sys.argv[1])):
    try:
        s.sendto(bytes(1400), ("10.78.0.2", 9))
        n += 1
    except OSError:
        pass
print(n)' "$1"
}
gve_ev_tx_stall() {
    sleep 3
    fault_add "$_fid" tx-stall queue=0
    sleep 1
    _queued=$(udp_fill 3000)
    wait_dmesg 'Timeout on tx queue' 45
    sleep 3
    _hits=$(fault_hits "$_fid")
    _ev="dmesg: $(dmesg_new 'WATCHDOG|Timeout on tx|Kicking|Performing reset'); ${_queued:-0} UDP datagrams queued behind the stall"
}
gve_undo_tx_stall() { :; }
# adminq-timeout: DESTROY_TX_QUEUE never completes (ip link set down); the
# driver times out after 2 s and resets the admin queue (gve_queues_stop's error path)
gve_arm_adminq_timeout() { fault_add "$_fid" adminq-timeout "opcode=${CI_GVE_TIMEOUT_OPCODE:-DESTROY_TX_QUEUE}"; }
gve_ev_adminq_timeout() {
    _t1=$(now)
    ip link set "$GVE_IF" down >>"$_flog" 2>&1
    _drc=$?
    _dsecs=$(($(now) - _t1))
    _hits=$(fault_hits "$_fid")
    sleep 2
    _ev="ip link set down rc=$_drc after ${_dsecs}s; dmesg: $(dmesg_new 'AQ command|destroy|Reset|reset|timed out')"
}
gve_undo_adminq_timeout() {
    ip link set "$GVE_IF" up >>"$_flog" 2>&1 || _fwhy="$_fwhy ip link set $GVE_IF up failed;"
    wait_carrier 1 30
    _ev="$_ev; ip link set up: carrier $(carrier)"
}

# gve_up [trace]: the server's gVNIC (GVE_IF) up on 10.78.0.1/24, the
# client's eth0 with 10.78.0.2/24 added, ARP answered only where the address
# is; row gve-setup. FPORT: the gVNIC's daemon port; with `trace`, the probe
# trace the host started on it ends here.
gve_up() {
    _t0=$(now)
    net_up
    sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 2>/dev/null ||
        { echo 1 >/proc/sys/net/ipv4/conf/all/arp_ignore; echo 2 >/proc/sys/net/ipv4/conf/all/arp_announce; }
    FPORT=ag _fid_n=0 gport=5300
    if [ "$ROLE" = server ]; then
        GVE_IF=
        for _n in /sys/class/net/*; do
            [ "$(basename "$(readlink -f "$_n/device/driver" 2>/dev/null)")" = gve ] && GVE_IF=${_n##*/}
        done
        if [ -z "$GVE_IF" ]; then
            result gve-setup FAIL $(($(now) - _t0)) "" "no gve netdev: $(ls /sys/class/net | tr '\n' ' '); $(dmesg | grep -i gve | tail -n 3 | tr '\n' ' ')"
            echo "CI-ABORT reason=gve-setup"
            exit 0
        fi
        ip addr add "$GVE_SRV/24" dev "$GVE_IF"
        ip link set "$GVE_IF" up
        ethtool -K "$GVE_IF" ntuple on 2>/dev/null
        wait_carrier 1 30
        # the probe is over and the NIC up: end the probe trace the host
        # started before boot (gve_up trace)
        _tr= _trc=0
        if [ "${1:-}" = trace ]; then
            _tr=$(ci_ctl trace stop --port "$FPORT" 2>&1)
            _trc=$?
        fi
        _who="$GVE_IF ($(ethtool -i "$GVE_IF" | sed -n 's/^driver: //p'), carrier $(carrier), $(ethtool -l "$GVE_IF" | awk '/Current/{p=1} p && /^(RX|TX):/{printf "%s%s ", $1, $2}'))"
        dmesg | grep -iE 'gve' | sed 's/^/    /' | tail -n 12
    else
        ip addr add 10.78.0.2/24 dev eth0
        _trc=0 _tr= _who="eth0 10.78.0.2"
    fi
    _i=0
    until ping -c 1 -W 2 $([ "$ROLE" = server ] && echo 10.78.0.2 || echo $GVE_SRV) >/dev/null 2>&1; do
        _i=$((_i + 1))
        [ $_i -ge 30 ] && break
        sleep 1
    done
    if [ $_i -ge 30 ]; then
        result gve-setup FAIL $(($(now) - _t0)) "" "$_who: no ping over 10.78.0.0/24: $(ip -br addr | tr '\n' ' ')"
    elif [ $_trc != 0 ]; then
        result gve-setup FAIL $(($(now) - _t0)) "" "$_who; ctl trace stop --port $FPORT: rc=$_trc $_tr"
    else
        result gve-setup PASS $(($(now) - _t0)) "" "$_who; ping over 10.78.0.0/24"
    fi
}

cell_gve_faults() {
    gve_up
    barrier "gve up"
    _ft0=$(now)
    ftcp gve-baseline both 16M 5300
    if [ "$_tok" = pass ]; then
        result gve-baseline PASS $(($(now) - _ft0)) "$(grep '^STREAM-RESULT' "$_tl" | tail -n 1 | sed -n 's/.* mibps=\([0-9.]*\).*/\1/p')" "verified TCP 16 MiB both ways over the gVNIC"
    else
        result gve-baseline FAIL $(($(now) - _ft0)) "" "rc=$_trc $(grep -E '^STREAM-RESULT|error' "$_tl" | tail -n 2 | tr '\n' ' ')"
        show_log "$_tl"
    fi
    gve_case link-down none
    gve_case link-up none
    gve_case reset-request c2s
    gve_case adminq-status none
    gve_case rx-error c2s
    gve_case rx-bad-csum c2s
    gve_case rx-bad-buf-id c2s
    gve_case tx-miss-reinject s2c
    gve_case tx-miss-timeout s2c
    gve_case tx-stall s2c 64M 8
    if [ "$ROLE" = server ]; then
        # the device's stats report (REPORT_STATS region): the NIC's own per-queue counters
        _ns=$(ethtool -S "$GVE_IF" | grep -E 'rx_(queue_drop_cnt|no_buffers_posted|drops_packet_over_mru|drops_invalid_checksum)\[' | tr -s ' ' | tr '\n' ' ')
        if echo "$_ns" | grep -qE ': [1-9]'; then
            result gve-nic-stats PASS 0 "" "NIC counters (the device's stats report): $_ns"
        else
            result gve-nic-stats FAIL 0 "" "every NIC counter is 0: $_ns"
        fi
    fi
    gve_case adminq-timeout none
    [ "$ROLE" = server ] && ethtool -S "$GVE_IF" | grep -vE ': 0$' | sed 's/^/    /' | head -n 60
    say "cell done"
}

# ---- erdma-faults: the server's erdma_0 (daemon port ar) is faulted; the
# client's erdma_0 is the peer. Recovery = rping -V (5 verified pings, new QPs).
# pp_start PORT ITERS: server: ibv_rc_pingpong in the background (_pp_pid,
# _pp_log); waits for its "local address" line and sets _qpn (decimal)
pp_start() {
    _pp_log=$CI_LOGDIR/fault-$_case-pingpong.$ROLE.log
    timeout -k 5 "${3:-90}" ibv_rc_pingpong -d erdma_0 -g "$gidx" -p "$1" -n "$2" >"$_pp_log" 2>&1 &
    _pp_pid=$!
    _qpn=
    _wi=0
    while [ $_wi -lt 60 ]; do
        # its QP as the kernel lists it (ibv_rc_pingpong's own "local address"
        # line sits in its stdout buffer until it exits)
        _qpn=$(pp_qpn)
        [ -n "$_qpn" ] && return 0
        kill -0 "$_pp_pid" 2>/dev/null || break
        _wi=$((_wi + 1))
        sleep 0.5
    done
    _fwhy="$_fwhy no ibv_rc_pingpong QP in rdma resource show qp: $(tr '\n' ' ' <"$_pp_log" | cut -c1-200);"
    return 1
}
# pp_qpn: the QP number of this guest's ibv_rc_pingpong on erdma_0
pp_qpn() {
    rdma resource show qp link erdma_0 2>/dev/null | grep 'comm ibv_rc_pingpong' |
        sed -n 's/.*lqpn \([0-9]*\).*/\1/p' | tail -n 1
}
# pp_qp_state: the state of that QP (e.g. ERR after an error completion)
pp_qp_state() {
    rdma resource show qp link erdma_0 2>/dev/null | grep "lqpn $1 " | sed -n 's/.* state \([A-Z]*\).*/\1/p' | head -n 1
}
# pp_client PORT ITERS SECS: the client's side
pp_client() {
    timeout -k 5 "$3" ibv_rc_pingpong -d erdma_0 -g "$gidx" -p "$1" -n "$2" "$PEER" \
        >"$CI_LOGDIR/fault-$_case-pingpong.$ROLE.log" 2>&1
}
pp_wait() {
    wait "$_pp_pid"
    _pp_rc=$?
}
pp_status() { grep -E 'Failed status|Couldn.t|iters in|error' "$_pp_log" | head -n 2 | tr '\n' ' '; }
# dev_counters: the faulted function's RC-engine and port counters, as the daemon counts them
dev_counters() {
    ci_ctl --json status 2>/dev/null | python3 -c '
import json, sys
try:
    st = json.load(sys.stdin)
except ValueError:
    st = {}
for d in st.get("devices", []):
    if d.get("port") == sys.argv[1]:
        c = (d.get("erdma") or {}).get("counters") or {}
        print(" ".join(f"{k}={c[k]}" for k in ("rc_retries", "rc_timeouts", "port_down_drops", "tx_frames") if k in c))' "$FPORT"
}
port_state() {
    _ps=$(ibv_devinfo -d erdma_0 2>/dev/null | sed -n 's/^[[:space:]]*state:[[:space:]]*\([A-Z_]*\).*/\1/p' | head -n 1)
    echo "${_ps:-?}/eth0-carrier-$(cat /sys/class/net/eth0/carrier 2>/dev/null)"
}

# erdma_case CASE: barriers around the server's erdma_arm_CASE (arms the rule
# when the QP exists, runs the server's side, collects the evidence, clears)
# and the client's erdma_peer_CASE; then rping -V on new QPs ("recovered")
erdma_case() {
    _case=$1
    _fn=$(echo "$_case" | tr - _)
    _flog=$CI_LOGDIR/fault-$_case.$ROLE.log
    : >"$_flog"
    _fwhy= _ev= _hits='?' _during=- _after=- _rec=no _cleared= _fid=$((_fid_n += 1))
    eport=$((eport + 3))
    barrier "$_case start"
    _ft0=$(now)
    if [ "$ROLE" = server ]; then
        dmesg_mark
        say "fault case $_case"
        "erdma_srv_$_fn"
        [ "$_hits" = '?' ] && _hits=$(fault_hits "$_fid")
        [ -n "$_cleared" ] || fault_clear "$_fid"
        "erdma_srv_undo_$_fn"
    else
        "erdma_peer_$_fn"
    fi
    barrier "$_case cleared"
    RPING_COUNT=5 CI_QUIET_RESULT=1 CI_TOOL_TIMEOUT=45 tool_test "fault-$_case-after" cm "$eport" \
        "rping -s -a $SELF -p $eport -C 5 -v -V" "rping -c -a $PEER -p $eport -C 5 -v -V" check_rping
    _after=$(echo "$_st" | tr 'A-Z' 'a-z')
    [ "$_after" = pass ] && _rec=yes
    if [ "$_case" = cmdq-timeout ]; then
        # does rebinding the PCI function (erdma_remove + erdma_probe) bring the device back?
        if [ "$ROLE" = server ]; then
            _bdf=$(ls /sys/bus/pci/drivers/erdma/ | grep -m 1 '^0000:')
            echo "$_bdf" >/sys/bus/pci/drivers/erdma/unbind 2>>"$_flog"
            echo "$_bdf" >/sys/bus/pci/drivers/erdma/bind 2>>"$_flog"
            _wi=0
            until rdma link show erdma_0/1 2>/dev/null | grep -q 'state ACTIVE'; do
                _wi=$((_wi + 1)); [ $_wi -ge 30 ] && break; sleep 1
            done
        fi
        barrier "$_case rebound"
        RPING_COUNT=5 CI_QUIET_RESULT=1 CI_TOOL_TIMEOUT=45 tool_test "fault-$_case-rebind" cm $((eport + 1)) \
            "rping -s -a $SELF -p $((eport + 1)) -C 5 -v -V" "rping -c -a $PEER -p $((eport + 1)) -C 5 -v -V" check_rping
        [ "$ROLE" = server ] && _ev="$_ev; after unbind/bind of $_bdf: erdma_0 $(rdma link show erdma_0/1 2>/dev/null | grep -o 'state [A-Z]*'), rping -V $_st; dmesg: $(dmesg_new 'erdma|destroy|failed')"
    fi
    [ "$ROLE" = server ] && fault_result "$_case"
    barrier "$_case done"
}

# cqe-status: the server's first completion (the RECV of the first ping) gets RETRY_EXC_ERR
erdma_srv_cqe_status() {
    pp_start "$eport" 10 60 || { barrier "$_case armed"; return; }
    fault_add "$_fid" cqe-status "status=${CI_ERDMA_CQE_STATUS:-RETRY_EXC_ERR}" "qpn=$_qpn"
    barrier "$_case armed"
    pp_wait
    _ev="qpn=$_qpn; ibv_rc_pingpong (server) rc=$_pp_rc: $(pp_status)"
}
erdma_peer_cqe_status() { barrier "$_case armed"; pp_client "$eport" 10 15; }
erdma_srv_undo_cqe_status() { :; }

# qp-stall: the server QP's SQ is not executed (the pong is never sent) until cleared
erdma_srv_qp_stall() {
    pp_start "$eport" 20 120 || { barrier "$_case armed"; return; }
    fault_add "$_fid" qp-stall "qpn=$_qpn"
    barrier "$_case armed"
    sleep 12
    _stalled=no
    kill -0 "$_pp_pid" 2>/dev/null && ! grep -q 'iters in' "$_pp_log" && _stalled=yes
    _hits=$(fault_hits "$_fid")
    fault_clear "$_fid"
    _cleared=1
    _tc=$(now)
    pp_wait
    _done=no
    [ "$_pp_rc" = 0 ] && grep -q 'iters in' "$_pp_log" && _done=yes
    _ev="qpn=$_qpn; stalled=$_stalled (ibv_rc_pingpong had no completion 12 s after the rule); completed_after_clear=$_done in $(($(now) - _tc)) s (rc=$_pp_rc: $(pp_status))"
}
erdma_peer_qp_stall() { barrier "$_case armed"; pp_client "$eport" 20 120; }
erdma_srv_undo_qp_stall() { :; }

# events_start SECS ARGS: ci/guest/repro/async_events.py ARGS on erdma_0 in
# the background for at most SECS (pid $_ap, output $_al), once it is
# READY (its verbs context is open: no event can slip by before), or 30 s
events_start() {
    _al=$CI_LOGDIR/fault-$_case-events.$ROLE.log
    _secs_max=$1
    shift
    timeout -k 5 "$_secs_max" python3 /opt/vr/ci/repro/async_events.py --dev erdma_0 "$@" >"$_al" 2>&1 &
    _ap=$!
    _wi=0
    until grep -q '^READY' "$_al"; do
        _wi=$((_wi + 1)); [ $_wi -ge 60 ] && break; sleep 0.5
    done
}

# aeq-qp: an AEQ entry for the QP (type CI_ERDMA_AEQ_EVENT, a remote access error by default)
erdma_srv_aeq_qp() {
    events_start 40 --qp
    _qpn=$(sed -n 's/^QPN=//p' "$_al")
    fault_add "$_fid" aeq "event=${CI_ERDMA_AEQ_EVENT:-ACC_ERR_EVENT}" "qpn=${_qpn:-0}"
    wait "$_ap"
    _ev="qpn=$_qpn; sent AEQ ${CI_ERDMA_AEQ_EVENT:-ACC_ERR_EVENT}; the QP's owner got: $(grep -E '^(ASYNC-EVENT|QP-STATE)|Error|error' "$_al" | tr '\n' ' ' | cut -c1-200); dmesg: $(dmesg_new 'erdma')"
}
erdma_peer_aeq_qp() { :; }
erdma_srv_undo_aeq_qp() { :; }

# aeq-cq: a CQ_ERR AEQ entry for the pyverbs process's CQ; its number (the
# device's, not the verbs') comes from the device trace's ring: CREATE_CQ cqn=N
erdma_srv_aeq_cq() {
    ci_ctl trace start --port "$FPORT" >>"$_flog" 2>&1 || _fwhy="$_fwhy ctl trace start failed;"
    events_start 40 --qp
    _cqn=$(ci_ctl trace show --port "$FPORT" 2>/dev/null | sed -n 's/.*CREATE_CQ cqn=\([0-9]*\).*/\1/p' | tail -n 1)
    ci_ctl trace stop --port "$FPORT" >>"$_flog" 2>&1
    [ -n "$_cqn" ] || _fwhy="$_fwhy no CREATE_CQ in the trace ring;"
    fault_add "$_fid" aeq event=CQ_ERR "cqn=${_cqn:-0}"
    wait "$_ap"
    _ev="cqn=$_cqn (from the trace); the CQ's owner got: $(grep -E '^(ASYNC-EVENT|QP-STATE)|Error|error' "$_al" | tr '\n' ' ' | cut -c1-200); dmesg: $(dmesg_new 'erdma')"
}
erdma_peer_aeq_cq() { :; }
erdma_srv_undo_aeq_cq() { :; }

# port-down / port-up: the port state the driver reports, and the port events every context gets
erdma_port_watch() { events_start "$1" --count 2; }
# port-down / port-up: the server's QP sends first (it runs ibv_rc_pingpong's
# client side against a pingpong server on the client guest; the out-of-band
# exchange goes over eth0, the virtio-net port, which stays up)
erdma_rev_pp() {
    _pp_log=$CI_LOGDIR/fault-$_case-pingpong.$ROLE.log
    timeout -k 5 "$2" ibv_rc_pingpong -d erdma_0 -g "$gidx" -p "$eport" -n "$1" "$PEER" >"$_pp_log" 2>&1
    _pp_rc=$?
}
erdma_peer_rev() {
    timeout -k 5 "$1" ibv_rc_pingpong -d erdma_0 -g "$gidx" -p "$eport" -n 5 \
        >"$CI_LOGDIR/fault-$_case-pingpong.$ROLE.log" 2>&1 &
    _rp=$!
    wait_listen tcp "$eport"
    barrier "$_case armed"
    wait "$_rp"
}
erdma_srv_port_down() {
    _pbefore=$(port_state)
    erdma_port_watch 25
    barrier "$_case armed"
    fault_add "$_fid" port-down
    _t1=$(now)
    erdma_rev_pp 5 40
    _pduring=$(port_state)
    wait "$_ap"
    _ev="port_before=$_pbefore port_during=$_pduring; async events: $(grep '^ASYNC-EVENT' "$_al" | tr '\n' ' ')none else; ibv_rc_pingpong (server QP sends first) rc=$_pp_rc after $(($(now) - _t1)) s: $(pp_status); dmesg: $(dmesg_new 'erdma|link|eth0'); device: $(dev_counters)"
}
erdma_peer_port_down() { erdma_peer_rev 15; }
erdma_srv_undo_port_down() {
    sleep 2
    _ev="$_ev; after clear: $(port_state)"
}
# port-up: the device port taken down by a port-down rule, then a port-up rule
# brings it back (not `ctl link down`: that also downs the fabric port)
erdma_srv_port_up() {
    fault_add $((_fid + 50)) port-down
    sleep 2
    _pdown=$(port_state)
    erdma_port_watch 10
    fault_add "$_fid" port-up
    barrier "$_case armed"
    erdma_rev_pp 5 40
    _pduring=$(port_state)
    wait "$_ap"
    _pu=fail
    [ "$_pp_rc" = 0 ] && grep -q 'iters in' "$_pp_log" && _pu=pass
    _ev="port_after_port_down=$_pdown port_during=$_pduring; after_port_up=$_pu (ibv_rc_pingpong, server QP sends first: $(pp_status)); async events: $(grep '^ASYNC-EVENT' "$_al" | tr '\n' ' ')none else; dmesg: $(dmesg_new 'erdma|link|eth0'); device: $(dev_counters)"
}
erdma_peer_port_up() { erdma_peer_rev 30; }
erdma_srv_undo_port_up() {
    fault_clear $((_fid + 50))
    sleep 2
    _ev="$_ev; after clear: $(port_state)"
}

# cmd-status: CREATE_QP completes with a non-zero status
erdma_srv_cmd_status() {
    fault_add "$_fid" cmd-status opcode=CREATE_QP "status=${CI_ERDMA_CMD_STATUS:-1}"
    _pp_log=$CI_LOGDIR/fault-$_case-pingpong.$ROLE.log
    timeout -k 5 30 ibv_rc_pingpong -d erdma_0 -g "$gidx" -p "$eport" -n 5 >"$_pp_log" 2>&1
    _pp_rc=$?
    _ev="ibv_rc_pingpong (server) rc=$_pp_rc: $(pp_status); dmesg: $(dmesg_new 'erdma')"
}
erdma_peer_cmd_status() { :; }
erdma_srv_undo_cmd_status() { :; }

# cmdq-timeout: CREATE_QP never completes: after 15 s the driver marks its
# command queue TIMEOUT and never issues a command again
erdma_srv_cmdq_timeout() {
    fault_add "$_fid" cmdq-timeout opcode=CREATE_QP
    _pp_log=$CI_LOGDIR/fault-$_case-pingpong.$ROLE.log
    _t1=$(now)
    timeout -k 5 60 ibv_rc_pingpong -d erdma_0 -g "$gidx" -p "$eport" -n 5 >"$_pp_log" 2>&1
    _pp_rc=$?
    sleep 2
    _ev="ibv_rc_pingpong (server) rc=$_pp_rc after $(($(now) - _t1)) s: $(pp_status); dmesg: $(dmesg_new 'erdma|destroy|failed')"
}
erdma_peer_cmdq_timeout() { :; }
erdma_srv_undo_cmdq_timeout() { :; }

cell_erdma_faults() {
    net_up
    if ! rdma_dev_up erdma erdma_0; then
        echo "CI-ABORT reason=erdma-up"
        exit 0
    fi
    FPORT=ar _fid_n=0 eport=18900
    gidx=$(roce_gid_index erdma_0 "$SELF")
    [ -n "$gidx" ] || gidx=1
    barrier "erdma up"
    # one RC QP's life in the device trace (the server's function): created,
    # moved to RTR/RTS, 5 ping-pongs, destroyed
    if [ "$ROLE" = server ]; then
        ci_ctl trace start --port "$FPORT" --file trace-erdma-rc-qp.txt >"$CI_LOGDIR/trace-start.log" 2>&1 ||
            say "ctl trace start failed: $(cat "$CI_LOGDIR/trace-start.log")"
    fi
    tool_test erdma-baseline tcp 18890 \
        "ibv_rc_pingpong -d erdma_0 -g $gidx -p 18890 -n 5" \
        "ibv_rc_pingpong -d erdma_0 -g $gidx -p 18890 -n 5 $PEER" check_pingpong
    [ "$ROLE" = server ] && { ci_ctl trace stop --port "$FPORT" >>"$CI_LOGDIR/trace-start.log" 2>&1 || say "ctl trace stop failed"; }
    for _c in cqe-status qp-stall aeq-qp aeq-cq port-down port-up cmd-status cmdq-timeout; do
        erdma_case "$_c"
    done
    diag erdma_0
    say "cell done"
}
