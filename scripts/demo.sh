#!/usr/bin/env bash
# The demo: what vhost-rdma is for, on one machine, with no RDMA hardware.
# Installs what is missing, builds the daemon and the guest tool, takes (or
# builds) a Linux 7.3 guest image and QEMU 11.1, starts the vhost-rdma
# daemon with two guest ports, an emulated erdma RDMA function and an
# emulated gVNIC (vfio-user) and a virtual host vh (10.77.0.10) with RDMA
# tool services, records the fabric to a pcapng, and boots two unmodified
# guests: a (10.77.0.1: erdma_0 on its virtio-net eth0, gVNIC eth1) and
# b (10.77.0.2: siw0, then rxe0, on its virtio-net eth0). Then, step by step,
# each with its elapsed time and a verdict from verified output:
#   1 boot both guests, devices up (progress from their consoles)
#   2 rping -V b (siw) -> vh over iWARP
#   3 SMC-R v2 between the guests (erdma_0 <-> rxe0), every byte verified,
#     smc_mode=smcr, the CLC handshake seen by the daemon's checker
#   4 ibv_rc_pingpong a (erdma) -> vh and b (rxe) -> vh, echoes verified by vh
#   5 rping -V b (rxe) -> vh over RoCE (rdma_cm over the IB CM)
#   6 TCP from b to a's gVNIC with header split, every byte verified
#   7 the daemon's view: `ctl flows` (QPs, the SMC-R link group), checker
#     findings (none expected), the erdma function's counters
#   8 a tshark summary of the capture
#   9 a table of the steps with their times
# Without vfio-user-pci in QEMU, guest a uses rxe0 and step 6 is skipped.
#
#   scripts/demo.sh [--bytes SIZE] [--queues N] [--form pci|testdev] [--no-build]
#                   [--no-erdma] [--no-gve] [--keep-logs] [--logdir DIR]
#                   [--kernel PATH [--append ARGS]] ...
set -uo pipefail
HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${VHOST_RDMA_CACHE:-$HOME/.cache/vhost-rdma}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
# No incremental state: it doubles the debug target (9 GiB of it on a full
# run) and a run from a fresh checkout never reuses it.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    cat <<EOF

Options:
  --bytes SIZE       SMC-R and gVNIC streams, per direction (default 32M)
  --queues N         queue pairs of the virtio-net ports (default 1)
  --form F           virtio-net port form: pci (default) or testdev
  --no-build         do not install packages or run cargo build (use existing binaries)
  --profile P        release (default) or debug binaries
  --image DIR        guest image dir; default: scripts/build-guest-image.sh --kernel 7.3
  --kernel PATH      boot this guest kernel (a bzImage with the drivers built in) instead of
                     the image's: bring your own (docs/guest-tests.md, "Bring your own kernel")
  --append ARGS      guest kernel command-line additions (e.g. "loglevel=8 gve.debug=1")
  --qemu PATH        QEMU 11.1; default: scripts/setup-qemu.sh
  --accel A          auto (default), kvm or tcg
  --no-erdma         guest a uses rxe0 instead of the erdma function
  --no-gve           no gVNIC in guest a (step 6 skipped)
  --timeout SECS     per guest, boot to end (default 900)
  --logdir DIR       where logs and the capture go (default: a new dir under \${TMPDIR:-/tmp})
  --keep-logs        keep the logs (and the capture) when every step passed
EOF
}

bytes=32M queues=1 form=pci build=1 profile=release image="" qemu="" accel=auto timeout=900
logdir="" keep_logs=0 use_erdma=1 use_gve=1 kernel_image="" kernel_append=""
while (($#)); do
    case "$1" in
        --bytes) bytes="$2"; shift 2 ;;
        --queues) queues="$2"; shift 2 ;;
        --form) form="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --profile) profile="$2"; shift 2 ;;
        --image) image="$2"; shift 2 ;;
        --kernel) kernel_image="$2"; shift 2 ;;
        --append) kernel_append="$2"; shift 2 ;;
        --qemu) qemu="$2"; shift 2 ;;
        --accel) accel="$2"; shift 2 ;;
        --no-erdma) use_erdma=0; shift ;;
        --no-gve) use_gve=0; shift ;;
        --timeout) timeout="$2"; shift 2 ;;
        --logdir) logdir="$2"; shift 2 ;;
        --keep-logs) keep_logs=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "demo: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

T0=$SECONDS
E2E_NAME=demo
NSTEPS=9
TITLE=([1]="boot both guests, devices up"
    [2]="rping -V against the virtual host over iWARP"
    [3]="SMC-R v2 between the guests"
    [4]="ibv_rc_pingpong against the virtual host"
    [5]="rping -V against the virtual host over RoCE"
    [6]="TCP to a's gVNIC, header split"
    [7]="the daemon's view: flows, findings, erdma counters"
    [8]="tshark summary of the capture"
    [9]="summary")
CASES=()
for ((i = 1; i <= NSTEPS; i++)); do CASES+=("step $i: ${TITLE[$i]}"); done
[[ -n $logdir ]] || logdir="$(mktemp -d "${TMPDIR:-/tmp}/vhost-rdma-demo.XXXXXX")"
# shellcheck source=scripts/lib-e2e.sh
. "$HERE/lib-e2e.sh"
e2e_begin

# ---- output: steps and progress on stdout (fd 3 stays the terminal while
# e2e_run_pair's own output goes to a file)
exec 3>&1
last_out=$SECONDS
out() { printf '%s\n' "$*" >&3; last_out=$SECONDS; }
el() { echo $((SECONDS - T0)); }
prog() { out "$(printf '   [%4d s] %s' "$(el)" "$*")"; }

# ---- step bookkeeping: status, seconds and detail per step, and the table
declare -A ST=() SECS=() DETAIL=() STARTED=()
PREP=()
step_start() {  # step_start N [WHAT]: header line
    STARTED[$1]=$SECONDS
    out ""
    out "== step $1/$NSTEPS: ${2:-${TITLE[$1]}} (elapsed $(el) s)"
}
step_verdict() {  # step_verdict N PASS|FAIL|SKIP DETAIL
    local n=$1 secs=$((SECONDS - ${STARTED[$1]:-$SECONDS}))
    ST[$n]=$2 SECS[$n]=$secs DETAIL[$n]=$3
    case "$2" in
        PASS) passed=$((passed + 1)) ;;
        FAIL) failed=$((failed + 1)) ;;
        SKIP) skipped=$((skipped + 1)) ;;
    esac
    out "   => $2 (${secs} s): $3"
}
# finish (replaces lib-e2e's): the table, the logs, the exit status
finish() {
    local n total=$(($(el)))
    out ""
    out "== step $NSTEPS/$NSTEPS: ${TITLE[$NSTEPS]} (elapsed $total s)"
    out "$(printf '   %-4s %-52s %-6s %6s' step what result secs)"
    local p
    for p in "${PREP[@]}"; do
        out "$(printf '   %-4s %-52s %-6s %6s' "-" "${p#*|}" "done" "${p%%|*}")"
    done
    for ((n = 1; n < NSTEPS; n++)); do
        if [[ -z ${ST[$n]:-} ]]; then
            ST[$n]=FAIL SECS[$n]=0 DETAIL[$n]="${setup_error:-not reached}"
            failed=$((failed + 1))
        fi
        out "$(printf '   %-4s %-52s %-6s %6s' "$n" "${TITLE[$n]}" "${ST[$n]}" "${SECS[$n]}")"
    done
    out "$(printf '   %-4s %-52s %-6s %6s' "" "total (wall time of the demo)" "" "$total")"
    for ((n = 1; n < NSTEPS; n++)); do
        [[ ${ST[$n]} == PASS ]] || out "   step $n ${ST[$n]}: ${DETAIL[$n]}"
    done
    out "   $passed passed, $failed failed, $skipped skipped"
    if ((failed)) || ((keep_logs)); then
        out "   logs: $logdir (daemon.log, ga/ and gb/: consoles and tool logs${cap:+, $(basename "$cap")})"
    else
        rm -rf "$logdir"
        out "   logs removed (--keep-logs keeps them, with the capture for Wireshark)"
    fi
    ((failed == 0))
    exit $?
}
# fail_all (replaces lib-e2e's): setup broke, no step ran
fail_all() {
    setup_error="$1"
    say "$1"
    stop_image_build
    finish
}

# ---- preparation (visible: a cold run builds for many minutes); each
# phase's seconds go into the table (PREP: "secs|what"), so a cold run shows
# where its minutes went
prep_done() { PREP+=("$((SECONDS - $1))|$2"); }  # prep_done START WHAT
e2e_check_kernel  # a bad --kernel fails before anything is built
if ((build)); then
    t=$SECONDS
    say "installing missing prerequisites (scripts/install-deps.sh)"
    "$HERE/install-deps.sh" || fail_all "scripts/install-deps.sh failed"
    prep_done $t "prerequisites (scripts/install-deps.sh)"
fi
# The guest image (on a cold run that is the kernel build, most of the
# demo's minutes) and QEMU are made in the background while cargo builds:
# each uses the cores the other leaves idle (downloads, linking). The image
# script's own progress
# goes to image.log and is shown once the build is done.
# It runs in its own session (setsid), so that a failed build or Ctrl-C
# stops the whole kernel build (stop_image_build), not just its shell.
img_pid="" t_img=$SECONDS
stop_image_build() {
    [[ -n $img_pid ]] && kill -TERM -- "-$img_pid" 2>/dev/null
    img_pid=""
}
trap 'stop_image_build; stop_daemon; exit 130' INT TERM
trap 'stop_image_build; stop_daemon' EXIT
if [[ -z $image ]]; then
    say "guest image: Linux 7.3 + Debian userland (scripts/build-guest-image.sh --kernel 7.3), beside the build"
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c '"$1" --kernel 7.3 >"$2/image.out" 2>"$2/image.log" &&
        { [[ -n $3 ]] || "$4" >"$2/qemu.out" 2>"$2/qemu.log"; }' _ \
        "$HERE/build-guest-image.sh" "$logdir" "$qemu" "$HERE/setup-qemu.sh" &
    img_pid=$!
fi
if ((build)); then
    t=$SECONDS
    say "building vhost-rdma and smc-guest-tests ($profile)"
    bflag=()
    [[ $profile == debug ]] || bflag=(--profile "$profile")
    (cd "$ROOT" && cargo build "${bflag[@]}" -p vhost-rdma -p smc-guest-tests) || fail_all "cargo build failed"
    prep_done $t "cargo build ($profile)"
    build=0
fi
if [[ -n $img_pid ]]; then
    say "waiting for the guest image (and QEMU); its progress:"
    tail -n +1 -f --pid="$img_pid" "$logdir/image.log" 2>/dev/null | sed 's/^/   /' &
    tail_pid=$!
    wait "$img_pid"; img_rc=$?
    img_pid=""
    wait "$tail_pid" 2>/dev/null
    image="$(tail -n 1 "$logdir/image.out" 2>/dev/null)"
    ((img_rc == 0)) || { tail -5 "$logdir/qemu.log" 2>/dev/null; image=""; }
    [[ -n $qemu ]] || qemu="$(tail -n 1 "$logdir/qemu.out" 2>/dev/null)"
    prep_done $t_img "guest kernel, root and QEMU (beside the build)"
fi
if [[ -z $qemu ]]; then
    t=$SECONDS
    say "QEMU 11.1 (scripts/setup-qemu.sh)"
    qemu="$("$HERE/setup-qemu.sh" | tail -n 1)" || qemu=""
    prep_done $t "QEMU (scripts/setup-qemu.sh)"
fi
e2e_prepare
SGT="${CARGO_TARGET_DIR:-$ROOT/target}/$profile/smc-guest-tests"
[[ -x $SGT ]] || fail_all "no guest tool $SGT (run without --no-build)"
if ((use_erdma || use_gve)) && ! "$qemu" -machine none -device help 2>/dev/null | grep -q '"vfio-user-pci"'; then
    say "NOTE: $qemu has no vfio-user-pci (QEMU >= 10.1): no erdma function (guest a uses rxe0), no gVNIC (step 6 skipped)"
    use_erdma=0 use_gve=0
fi
((use_gve)) || TITLE[6]="TCP to a's gVNIC (no gVNIC: skipped)"
DEVA=erdma_0
((use_erdma)) || { DEVA=rxe0; TITLE[7]="the daemon's view: flows, findings, ports"; }

d="$logdir"
A=10.77.0.1 B=10.77.0.2 VH=10.77.0.10 MACA=52:54:00:77:00:01 MACB=52:54:00:77:00:02 MACG=52:54:00:77:00:11
C() { "$DAEMON" ctl --control "$d/ctl.sock" "$@"; }

# ---- the facts the steps judge, read from the daemon's JSON replies and
# tshark's output (guest-results demo-view)
# (the shim rebuilds it once here if its sources changed, even with --no-build)
"$HERE/guest-results" --version >/dev/null || fail_all "scripts/guest-results could not be built"
GR="${CARGO_TARGET_DIR:-$ROOT/target}/release/guest-results"
V() { "$GR" demo-view "$@"; }

# ---- the daemon: ports a, b (virtio-net), r (erdma on a), g (gVNIC) and
# the virtual host with its services (config file: two pingpong servers)
cat >"$d/demo.toml" <<EOF
[[host]]
name = "vh"
address = "$VH/24"
[[host.service]]
kind = "pingpong-server"   # guest a (erdma_0)
port = 18515
iters = 1000
[[host.service]]
kind = "pingpong-server"   # guest b (rxe0)
port = 18516
iters = 1000
[[host.service]]
kind = "rping-server-roce" # port 7174, IB CM over RoCE
[[host.service]]
kind = "rping-server"      # port 7174, iWARP (TCP)
EOF
serve=(--config "$d/demo.toml"
    --port "a=$d/a.sock,mac=$MACA,queues=$queues,form=$form"
    --port "b=$d/b.sock,mac=$MACB,queues=$queues,form=$form")
((use_erdma)) && serve+=(--port "r=$d/r.sock,kind=erdma,netdev=a")
((use_gve)) && serve+=(--port "g=$d/g.sock,kind=gve,queues=1,mac=$MACG")
serve+=(--control "$d/ctl.sock" --capture-dir "$d")
say "starting the daemon: vhost-rdma serve ${serve[*]//$d\//}"
say "  (files in $d; virtual host vh $VH: pingpong-server :18515 and :18516, rping-server-roce and rping-server :7174)"
start_daemon "$d/ctl.sock" "$d/a.sock" "$d/b.sock" -- "${serve[@]}"
cap="$d/demo.pcapng"
rm -f "$cap"
if C capture start --file "$cap" --snaplen 512 >"$d/capture-start.txt" 2>&1; then
    say "recording every port to $(basename "$cap") (ctl capture start --snaplen 512)"
else
    say "capture did not start: $(tail -n 1 "$d/capture-start.txt")"
fi

# ---- the guests' jobs (scripts/demo-guest.sh in /opt/vr)
vrbin="$d/vrbin"
mkdir -p "$vrbin/bin"
cp -f "$SGT" "$vrbin/bin/smc-guest-tests"
cp -f "$HERE/demo-guest.sh" "$vrbin/demo-guest.sh"
cp -f "$HERE/guest/rdma-lib.sh" "$vrbin/rdma-lib.sh"
for g in a b; do
    cat >"$d/$g.sh" <<EOF
export DEMO_BYTES=$bytes DEMO_ERDMA=$use_erdma DEMO_GVE=$use_gve DEMO_QUEUES=$queues DEMO_WAIT=$timeout
exec sh /opt/vr/demo-guest.sh $g
EOF
done
va="" 
((use_erdma)) && va+=",vfio=$d/r.sock"
((use_gve)) && va+=",vfio=$d/g.sock"
RG_A=(--net vhost-user --form "$form" --queues "$queues" --guest "a,ip=$A/24,sock=$d/a.sock,mac=$MACA$va,cmd=$d/a.sh")
RG_B=(--net vhost-user --form "$form" --queues "$queues" --guest "b,ip=$B/24,sock=$d/b.sock,mac=$MACB,cmd=$d/b.sh")
ja="$d/ga/a.job" jb="$d/gb/b.job"
rm -rf "$d/ga" "$d/gb"

# ---- judging a step from the guests' files and the daemon
endrc() { sed -n 's/^rc=\([0-9]*\).*/\1/p' "$1/end-$2" 2>/dev/null; }
result_of() { grep -h '^STREAM-RESULT' "$1" 2>/dev/null | tail -n 1; }
stream_ok() {  # stream_ok LOG RC [smcr]: rc 0, status=pass, verified=1 (and smc_mode=smcr)
    local r
    r="$(result_of "$1")"
    [[ $2 == 0 && $r == *status=pass* && $r == *verified=1* ]] || return 1
    [[ -z ${3:-} || $r == *smc_mode=smcr* ]]
}
field() { grep -oE "(^| )$1=[^ ]*" <<<"$2" | head -n 1 | cut -d= -f2; }
judge() {
    local n=$1 why=() ok=1 r s x
    C --json hosts >"$d/hosts.json" 2>/dev/null
    case "$n" in
        1)
            for g in a b; do
                local j=$ja; [[ $g == b ]] && j=$jb
                [[ $(endrc "$j" 1) == 0 ]] || why+=("guest $g: device setup failed ($(cut -d' ' -f2- "$j/end-1" 2>/dev/null))")
            done
            if ((${#why[@]} == 0)); then
                step_verdict 1 PASS "a: $(cut -d' ' -f2- "$ja/end-1"); b: $(cut -d' ' -f2- "$jb/end-1"); SMC UEID set on both"
            else
                step_verdict 1 FAIL "$(IFS=';'; echo "${why[*]}")"
            fi ;;
        3)
            for g in a b; do
                local j=$ja; [[ $g == b ]] && j=$jb
                stream_ok "$j/smcr.$g.log" "$(endrc "$j" 3)" smcr ||
                    why+=("guest $g: rc=$(endrc "$j" 3) $(result_of "$j/smcr.$g.log" | grep -oE 'status=[^ ]*|verified=[^ ]*|smc_mode=[^ ]*' | tr '\n' ' ')")
            done
            C --json flows >"$d/flows-smc.json" 2>/dev/null
            read -r x s <<<"$(V smc "$d/flows-smc.json")"
            ((${x:-0} >= 1)) || why+=("the checker saw no confirmed SMC-R v2 handshake ($s)")
            r="$(result_of "$ja/smcr.a.log")"
            if ((${#why[@]} == 0)); then
                step_verdict 3 PASS "$bytes each way verified on both sides, smc_mode=smcr, $(field mibps "$r") MiB/s; checker: $s"
            else
                step_verdict 3 FAIL "$(IFS=';'; echo "${why[*]}")"
            fi ;;
        4)
            local ok_ f it ver err
            for t in "a 18515 $ja" "b 18516 $jb"; do
                read -r g p j <<<"$t"
                grep -q '^1000 iters in' "$j/pingpong.$g.log" 2>/dev/null && [[ $(endrc "$j" 4) == 0 ]] ||
                    why+=("guest $g: rc=$(endrc "$j" 4), $(tail -n 1 "$j/pingpong.$g.log" 2>/dev/null)")
                read -r ok_ f it ver err <<<"$(V svc "$d/hosts.json" pingpong-server "$p")"
                ((ok_ >= 1 && ver == 999)) || why+=("vh :$p: $ok_ sessions ok, $ver of 999 echoes verified ($err)")
            done
            if ((${#why[@]} == 0)); then
                step_verdict 4 PASS "a ($DEVA): $(grep '^1000 iters' "$ja/pingpong.a.log"); b (rxe0): $(grep '^1000 iters' "$jb/pingpong.b.log"); vh verified 999 echoes of each"
            else
                step_verdict 4 FAIL "$(IFS=';'; echo "${why[*]}")"
            fi ;;
        2|5)
            local log=$jb/rping-roce.b.log kind=rping-server-roce what="RoCE, rxe0" ok_ f it ver err cnt
            ((n == 2)) && log=$jb/rping-iwarp.b.log kind=rping-server what="iWARP, siw0"
            cnt="$(grep -c '^ping data: rdma-ping-' "$log" 2>/dev/null)"
            ((${cnt:-0} >= 10)) || why+=("guest b: ${cnt:-0} of 10 verified pings")
            grep -qi 'data mismatch' "$log" 2>/dev/null && why+=("guest b: $(grep -i -m1 'data mismatch' "$log")")
            [[ $(endrc "$jb" "$n") == 0 ]] || why+=("guest b: rc=$(endrc "$jb" "$n")")
            read -r ok_ f it ver err <<<"$(V svc "$d/hosts.json" "$kind" 7174)"
            ((ok_ >= 1 && it == 10 && ver == 10)) || why+=("vh $kind: $ok_ sessions ok, $it pings, $ver verified ($err)")
            if ((${#why[@]} == 0)); then
                step_verdict "$n" PASS "b ($what): $cnt pings, each echo compared (-V); vh $kind verified $ver of $it"
            else
                step_verdict "$n" FAIL "$(IFS=';'; echo "${why[*]}")"
            fi ;;
        6)
            if [[ $(cut -d' ' -f2 "$ja/end-6" 2>/dev/null) == skip ]]; then
                step_verdict 6 SKIP "no gVNIC (--no-gve or QEMU without vfio-user-pci)"
                return
            fi
            for g in a b; do
                local j=$ja; [[ $g == b ]] && j=$jb
                stream_ok "$j/gve.$g.log" "$(endrc "$j" 6)" ||
                    why+=("guest $g: rc=$(endrc "$j" 6) $(result_of "$j/gve.$g.log" | grep -oE 'status=[^ ]*|verified=[^ ]*' | tr '\n' ' ')")
            done
            C --json status >"$d/status-gve.json" 2>/dev/null
            local hs hb pb pk
            read -r hs hb pb pk <<<"$(V gve "$d/status-gve.json")"
            ((hs > 1000)) || why+=("the gVNIC split only $hs packets")
            r="$(result_of "$ja/gve.a.log")"
            if ((${#why[@]} == 0)); then
                step_verdict 6 PASS "$bytes each way verified, $(field mibps "$r") MiB/s; gVNIC RX: $pk packets, $hs header-split ($hb header + $pb payload bytes)"
            else
                step_verdict 6 FAIL "$(IFS=';'; echo "${why[*]}")"
            fi ;;
    esac
}

# step 7, the daemon's view (host only; the guests wait until it is done)
daemon_view() {
    step_start 7
    local why=() rc smcl iw v2 tot
    out "   \$ vhost-rdma ctl flows"
    C flows >"$d/flows.txt" 2>&1
    sed 's/^/     /' "$d/flows.txt" >&3
    C --json flows >"$d/flows.json" 2>/dev/null
    read -r rc smcl iw v2 <<<"$(V flows "$d/flows.json")"
    out "   \$ vhost-rdma ctl findings"
    C findings 2>&1 | sed 's/^/     /' >&3
    C --json findings >"$d/findings.json" 2>/dev/null
    tot="$(V findings "$d/findings.json")"
    out "   \$ vhost-rdma ctl status   (ports, checker, erdma function; full output in status.txt)"
    C status >"$d/status.txt" 2>&1
    C --json status >"$d/status.json" 2>/dev/null
    sed -n '1,/^checker /p' "$d/status.txt" | sed 's/^/     /' >&3
    if ((use_erdma)); then V erdma "$d/status.json" | sed 's/^/     /' >&3; fi
    C hosts >"$d/hosts.txt" 2>&1
    grep -E '^  service ' "$d/hosts.txt" | sed 's/^  /     vh /' >&3
    [[ $tot == 0 ]] || why+=("$tot checker finding(s)")
    ((${v2:-0} >= 1)) || why+=("no confirmed SMC-R v2 session in flows")
    ((${smcl:-0} >= 1)) || why+=("no RoCE connection carrying an SMC-R link in flows")
    ((${rc:-0} >= 4)) || why+=("only ${rc:-0} RC connections in flows (SMC-R link, 2 pingpongs, rping)")
    ((${iw:-0} >= 1)) || why+=("no iWARP connection in flows")
    if ((${#why[@]} == 0)); then
        step_verdict 7 PASS "$rc RoCE RC connections ($smcl carrying the SMC-R link group), $iw iWARP, $v2 SMC-R v2 session(s); 0 findings"
    else
        step_verdict 7 FAIL "$(IFS=';'; echo "${why[*]}")"
    fi
}

# ---- the pair's tick (every second): progress, step starts and ends
cur=1 view_done=0 ticks=0 base_json="$d/status-base.json"
declare -A NLINES=() STAGE=()
: >"$d/events-seen.json"
boot_stages() {  # boot_stages G: console milestones of guest G, once each
    local g=$1 con=$d/g$1/$1.console.log t
    if [[ -z ${STAGE[$g.q]:-} ]] && grep -q 'accel:' "$d/run-$g.log" 2>/dev/null; then
        STAGE[$g.q]=1; prog "$g: QEMU $(sed -n 's/^run-guests: accel: \([a-z]*\).*/\1/p' "$d/run-$g.log" | head -n 1 | tr a-z A-Z), 1 vCPU, 512 MiB"
    fi
    [[ -s $con ]] || return 0
    if [[ -z ${STAGE[$g.k]:-} ]] && grep -q 'Linux version' "$con"; then
        STAGE[$g.k]=1; prog "$g: kernel $(grep -m1 -oE 'Linux version [^ ]+' "$con" | cut -d' ' -f3) booting"
    fi
    if [[ -z ${STAGE[$g.i]:-} ]] && grep -q 'Run /sbin/vr-init' "$con"; then
        t="$(grep -m1 'Run /sbin/vr-init' "$con" | grep -oE '^\[ *[0-9.]+' | tr -d '[ ')"
        STAGE[$g.i]=1; prog "$g: kernel up after ${t:-?} s (guest clock), init running"
    fi
}
guest_lines() {  # guest_lines G: new "DEMO: " lines of guest G
    local g=$1 f=$d/g$1/$1.job/out.log n total
    [[ -f $f ]] || return 0
    total=$(wc -l <"$f")
    n=${NLINES[$g]:-0}
    ((total > n)) || return 0
    NLINES[$g]=$total
    plines "$g: " "$(sed -n "$((n + 1)),${total}p" "$f" | sed -n 's/^DEMO: //p')"
}
plines() {  # plines PREFIX TEXT: a progress line per line of TEXT
    local l
    [[ -n $2 ]] || return 0
    while IFS= read -r l; do prog "$1$l"; done <<<"$2"
}
host_events() {  # the virtual host's new events (sessions started, finished)
    C --json hosts >"$d/hosts-live.json" 2>/dev/null &&
        plines "" "$(V events "$d/hosts-live.json" "$d/events-seen.json")"
}
e2e_tick() {
    ticks=$((ticks + 1))
    ((cur == 1)) && { boot_stages a; boot_stages b; }
    guest_lines a
    guest_lines b
    ((ticks % 2 == 0)) && host_events
    # a guest whose run ended releases the other from its waits
    [[ -e $d/ga/summary.json && -d $jb ]] && : >"$jb/abort"
    [[ -e $d/gb/summary.json && -d $ja ]] && : >"$ja/abort"
    if ((cur <= 7)); then
        if [[ -z ${STARTED[$cur]:-} ]]; then
            if [[ -e $ja/ready-$cur && -e $jb/ready-$cur ]]; then
                if ((cur == 7)); then
                    daemon_view; view_done=1
                else
                    step_start "$cur" "$(step_what "$cur")"
                    C --json status >"$base_json" 2>/dev/null
                fi
                : >"$ja/go-$cur"; : >"$jb/go-$cur"
                ((cur == 7)) && cur=8
            fi
        elif [[ -e $ja/end-$cur && -e $jb/end-$cur ]]; then
            guest_lines a; guest_lines b; host_events
            judge "$cur"
            cur=$((cur + 1))
        fi
    fi
    if ((SECONDS - last_out >= 8)); then
        local what
        if ((cur == 1)); then
            what="booting: a: $(tail -n 1 "$d/ga/a.console.log" 2>/dev/null | cut -c1-50), b: $(tail -n 1 "$d/gb/b.console.log" 2>/dev/null | cut -c1-50)"
        elif [[ -n ${STARTED[$cur]:-} ]]; then
            C --json status >"$d/status-live.json" 2>/dev/null
            what="step $cur, $((SECONDS - STARTED[$cur])) s in: $(V rates "$d/status-live.json" "$base_json")"
        else
            what="waiting for the guests to reach step $cur"
        fi
        prog "$what"
    fi
}
step_what() {
    case "$1" in
        2) echo "rping -V: b (siw0) -> vh:7174 over iWARP, 10 pings" ;;
        3) echo "SMC-R v2 between the guests: a ($DEVA) server, b (rxe0, replacing siw0) client, $bytes each way" ;;
        4) echo "ibv_rc_pingpong: a ($DEVA) -> vh:18515 and b (rxe0) -> vh:18516, 1000 x 4 KiB" ;;
        5) echo "rping -V: b (rxe0) -> vh:7174 over RoCE, 10 pings" ;;
        6) ((use_gve)) && echo "TCP: b -> a's gVNIC (10.77.1.1, header split), $bytes each way" || echo "${TITLE[6]}" ;;
        *) echo "${TITLE[$1]}" ;;
    esac
}

# ---- run
step_start 1 "boot both guests (TCG unless KVM boots them), bring up their devices"
STARTED[1]=$SECONDS
e2e_run_pair >"$d/run-pair.txt"
# steps the guests never finished
for ((n = cur; n <= 6; n++)); do
    if [[ -n ${STARTED[$n]:-} ]]; then
        judge "$n"
    else
        ST[$n]=FAIL SECS[$n]=0 DETAIL[$n]="not reached (guest a: run-guests exit $ra, b: $rb; see $d/ga/a.console.log, $d/gb/b.console.log)"
        failed=$((failed + 1))
    fi
done
((view_done)) || daemon_view

# ---- step 8: the capture
step_start 8
C capture stop >"$d/capture-stop.txt" 2>&1
stop_daemon
if grep -q panicked "$d/daemon.log"; then
    out "   daemon panicked:"; grep panicked "$d/daemon.log" | tail -n 3 | sed 's/^/     /' >&3
fi
if ! command -v tshark >/dev/null; then
    step_verdict 8 SKIP "tshark is not installed (apt-get install tshark); the capture is $cap"
    keep_logs=1
elif [[ ! -s $cap ]]; then
    step_verdict 8 FAIL "no capture file ($(tail -n 1 "$d/capture-start.txt"))"
else
    out "   $(basename "$cap"): $(du -h "$cap" | cut -f1); $(grep -iE 'frames|dropped' "$d/capture-stop.txt" | head -n 2 | tr -s ' ' | tr '\n' ' ')"
    # tshark's RPC-over-RDMA and Thrift guesses misread SMC-R LLC messages and TCP data: off
    topts=(--disable-heuristic rpcrdma_infiniband --disable-heuristic thrift_tcp)
    out "   \$ tshark -r $(basename "$cap") -q -z io,phs   (inbound frames only: each frame as its sender sent it)"
    phs_run() {
        tshark -r "$cap" -q "$@" -z "io,phs,frame.packet_flags_direction == 1" >"$d/tshark-phs.txt" 2>"$d/tshark.err" &
        local tp=$!
        while kill -0 "$tp" 2>/dev/null; do
            sleep 1
            ((SECONDS - last_out >= 10)) && prog "tshark still reading the capture"
        done
        wait "$tp"
    }
    phs_run "${topts[@]}"; trc=$?
    if [[ $trc != 0 ]] && grep -qi 'heuristic\|no such protocol' "$d/tshark.err"; then
        phs_run; trc=$?   # an older or newer tshark without those heuristic names
    fi
    # the hierarchy without the banner, at most 24 lines
    grep -E '^ *[a-z_0-9.-]+ +frames:[0-9]+' "$d/tshark-phs.txt" | head -n 24 | sed 's/^/     /' >&3
    read -r roce smcr clc iwarp malformed <<<"$(V phs "$d/tshark-phs.txt")"
    tw=()
    [[ $trc == 0 ]] || tw+=("tshark exit $trc: $(grep -v dangerous "$d/tshark.err" | tail -n 1)")
    ((${roce:-0} > 0)) || tw+=("no RoCEv2 (InfiniBand over UDP 4791) frames decoded")
    ((${iwarp:-0} > 0)) || tw+=("no iWARP (MPA) decoded")
    if ((${#tw[@]} == 0)); then
        step_verdict 8 PASS "RoCEv2 $roce frames ($smcr carry SMC-R), SMC CLC $clc, iWARP $iwarp; tshark calls ${malformed:-0} malformed; open $(basename "$cap") in Wireshark"
    else
        step_verdict 8 FAIL "$(IFS=';'; echo "${tw[*]}")"
    fi
fi
finish
