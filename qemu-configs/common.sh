# shellcheck shell=bash
# Shared pieces of the qemu-configs snippets (sourced). Knobs (environment):
#   IMAGE    dir with bzImage + rootfs.ext4 (scripts/build-guest-image.sh prints one)  [required]
#   QEMU     qemu-system-x86_64 (default: PATH; `scripts/setup-qemu.sh` prints the 11.1 wrapper,
#            needed for FORM=testdev)
#   DAEMON   vhost-rdma binary (default: target/release/vhost-rdma of this checkout);
#            DAEMON=none when you run the daemon yourself (sockets must be $DIR/NAME.sock)
#   DIR      sockets, job dirs and console logs (default /tmp/vr-qemu)
#   MEM (512)  SMP (1)  ACCEL (tcg | kvm; default tcg)
#   QUEUES   queue pairs per port (default 1; gve ports: unset gives the
#            daemon's default, 2, the least devmem TCP runs with)
#   CONFIG_SIZE (24)  testdev: bytes of virtio_net_config the daemon serves
#   JOB      file run in every guest as /job/run.sh (default: per snippet)
#   PRINT=1  print the daemon and QEMU command lines instead of running them
set -euo pipefail
VR_QUEUES_GIVEN="${QUEUES:+1}"
VR_CONFIGS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VR_ROOT="$(cd "$VR_CONFIGS/.." && pwd)"
: "${IMAGE:?set IMAGE to a dir with bzImage and rootfs.ext4 (scripts/build-guest-image.sh prints one)}"
QEMU="${QEMU:-qemu-system-x86_64}"
DAEMON="${DAEMON:-$VR_ROOT/target/release/vhost-rdma}"
DIR="${DIR:-/tmp/vr-qemu}"
MEM="${MEM:-512}" SMP="${SMP:-1}" QUEUES="${QUEUES:-1}" ACCEL="${ACCEL:-tcg}"
CONFIG_SIZE="${CONFIG_SIZE:-24}" PRINT="${PRINT:-0}"
FORM="${FORM:-pci}"
VR_QEMU_MAJOR="$("$QEMU" --version 2>/dev/null | sed -n '1s/.*version \([0-9]*\)\..*/\1/p')"
VR_QEMU_MAJOR="${VR_QEMU_MAJOR:-99}"
mkdir -p "$DIR"

vr_pids=() vr_guest_pids=()
vr_cleanup() {
    local p
    for p in "${vr_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap vr_cleanup EXIT
trap 'exit 130' INT TERM

# vr_show ARGV...: print a command line, one option (with its value) per line
vr_show() {
    local a q out="" first=1
    for a in "$@"; do
        if [[ $a =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then q=$a; else q="'${a//\'/\'\\\'\'}'"; fi
        if ((first)); then out=$q; first=0
        elif [[ $a == -* ]]; then out+=$' \\\n    '$q
        else out+=" $q"; fi
    done
    printf '%s\n' "$out"
}

# vr_mac INDEX -> 52:54:00:77:00:XX (guest 0 -> :0a, 1 -> :0b, ...)
vr_mac() { printf '52:54:00:77:00:%02x' $((10 + $1)); }
vr_ip() { echo "10.77.0.$((1 + $1))"; }

# vr_daemon NAME... : start one daemon serving one port per guest name
# vr_daemon NAME[:gve|:erdma]...: a port per guest; NAME:gve serves guest
# NAME an emulated gVNIC over vfio-user instead of virtio-net; NAME:erdma adds
# an erdma function (RoCEv2, QPs run by the daemon) beside its virtio-net.
vr_daemon() {
    local args=(serve) i=0 spec n kind socks=()
    for spec in "$@"; do
        n=${spec%%:*} kind=${spec#"$n"}
        case "$kind" in
            :gve) args+=(--port "$n=$DIR/$n.sock,kind=gve,mac=$(vr_mac $i)${VR_QUEUES_GIVEN:+,queues=$QUEUES}") ;;
            :erdma) args+=(--port "$n=$DIR/$n.sock,mac=$(vr_mac $i),queues=$QUEUES,form=$FORM"
                           --port "$n-rdma=$DIR/$n-rdma.sock,kind=erdma,netdev=$n")
                    socks+=("$n-rdma") ;;
            *) args+=(--port "$n=$DIR/$n.sock,mac=$(vr_mac $i),queues=$QUEUES,form=$FORM") ;;
        esac
        socks+=("$n")
        i=$((i + 1))
    done
    args+=(--control "$DIR/ctl.sock")
    echo "# daemon"
    vr_show "$DAEMON" "${args[@]}"
    ((PRINT)) && return 0
    [[ $DAEMON == none ]] && return 0
    for n in "${socks[@]}"; do rm -f "$DIR/$n.sock"; done
    "$DAEMON" "${args[@]}" >"$DIR/daemon.log" 2>&1 &
    vr_pids+=($!)
    for n in "${socks[@]}"; do
        for _ in $(seq 100); do [[ -S $DIR/$n.sock ]] && break; sleep 0.1; done
        [[ -S $DIR/$n.sock ]] || { echo "daemon did not create $DIR/$n.sock (see $DIR/daemon.log)" >&2; exit 1; }
    done
}

# vr_qemu_args NAME INDEX [virtio|gve|erdma] -> array QARGS: one guest on
# socket $DIR/NAME.sock (gve: the NIC is an emulated gVNIC, -device
# vfio-user-pci; erdma: virtio-net plus an erdma function on NAME-rdma.sock)
vr_qemu_args() {
    local name=$1 i=$2 nic=${3:-virtio}
    QARGS=("$QEMU")
    if [[ $ACCEL == kvm ]]; then QARGS+=(-accel kvm -cpu host); else QARGS+=(-accel tcg,tb-size=256 -cpu max); fi
    QARGS+=(
        # vhost-user: guest RAM must be shareable with the daemon
        -object "memory-backend-memfd,id=mem,size=${MEM}M,share=on" -machine pc,memory-backend=mem
        -m "${MEM}M" -smp "$SMP" -display none -nodefaults -no-reboot
        -kernel "$IMAGE/bzImage"
        -append "root=/dev/vda ro init=/sbin/vr-init console=ttyS0 panic=-1 vr.name=$name vr.ip=$(vr_ip "$i")/24"
        -drive "file=$IMAGE/rootfs.ext4,if=virtio,format=raw,snapshot=on"
        -fsdev "local,id=fsjob,path=$DIR/$name.job,security_model=none"
        -device virtio-9p-pci,fsdev=fsjob,mount_tag=job
    )
    if [[ $nic == gve ]]; then
        # vfio-user (QEMU >= 10.1): the daemon serves the whole PCI function
        QARGS+=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$DIR/$name.sock\"}}")
        return 0
    fi
    if [[ $nic == erdma ]]; then
        QARGS+=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$DIR/$name-rdma.sock\"}}")
    fi
    QARGS+=(-chardev "socket,id=c0,path=$DIR/$name.sock")
    if [[ $FORM == testdev ]]; then
        QARGS+=(-device "vhost-user-test-device-pci,chardev=c0,virtio-id=1,num_vqs=$((2 * QUEUES + 1)),vq_size=256,config_size=$CONFIG_SIZE")
    else
        local dev="virtio-net-pci,netdev=n0,mac=$(vr_mac "$i"),romfile="
        if ((VR_QEMU_MAJOR < 8)) && [[ $ACCEL != kvm ]]; then
            # QEMU 7.2 under TCG segfaults in vhost_net_start with MSI-X: use INTx
            dev+=",vectors=0"
            ((QUEUES > 1)) && dev+=",mq=on"
        elif ((QUEUES > 1)); then
            dev+=",mq=on,vectors=$((2 * QUEUES + 2))"
        fi
        QARGS+=(-netdev "vhost-user,id=n0,chardev=c0,queues=$QUEUES" -device "$dev")
    fi
}

# vr_job NAME SCRIPT_TEXT: the guest's /job/run.sh
vr_job() {
    mkdir -p "$DIR/$1.job"
    if [[ -n ${JOB:-} ]]; then cp "$JOB" "$DIR/$1.job/run.sh"; else printf '%s\n' "$2" >"$DIR/$1.job/run.sh"; fi
}

# vr_guest_fg NAME INDEX [NIC]: console on this terminal (Ctrl-A X quits QEMU)
vr_guest_fg() {
    vr_qemu_args "$1" "$2" "${3:-}"
    QARGS+=(-serial mon:stdio)
    echo "# guest $1"
    vr_show "${QARGS[@]}"
    ((PRINT)) && return 0
    "${QARGS[@]}"
}

# vr_guest_bg NAME INDEX [NIC]: console to $DIR/NAME.console.log
vr_guest_bg() {
    vr_qemu_args "$1" "$2" "${3:-}"
    QARGS+=(-serial "file:$DIR/$1.console.log")
    echo "# guest $1 (console: $DIR/$1.console.log)"
    vr_show "${QARGS[@]}"
    ((PRINT)) && return 0
    "${QARGS[@]}" </dev/null &
    vr_pids+=($!) vr_guest_pids+=($!)
}

# vr_wait_guests NAME...: wait for the background guests, print their VR-RESULT
vr_wait_guests() {
    ((PRINT)) && return 0
    local n rc=0 p
    for p in "${vr_guest_pids[@]}"; do wait "$p" || true; done
    for n in "$@"; do
        local r
        r="$(grep -a -o 'VR-RESULT name=[^ ]* rc=-\?[0-9]*' "$DIR/$n.console.log" | tail -n 1)"
        echo "${r:-$n: no VR-RESULT (see $DIR/$n.console.log)}"
        [[ $r == *rc=0 ]] || rc=1
    done
    return $rc
}

# A job that pings every other guest of the set, then exits.
vr_ping_job() {  # vr_ping_job N -> text
    local n=$1 k s=''
    s+='i=0; while [ "$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ] && [ $i -lt 30 ]; do i=$((i+1)); sleep 1; done'$'\n'
    s+='rc=0'$'\n'
    for ((k = 0; k < n; k++)); do
        s+="[ \"\$VR_IP\" = $(vr_ip $k) ] || { j=0; until ping -c 1 -W 2 $(vr_ip $k) >/dev/null 2>&1 || [ \$j -ge 60 ]; do j=\$((j+1)); sleep 1; done; ping -c 3 -W 5 $(vr_ip $k) || rc=1; }"$'\n'
    done
    s+='exit $rc'
    echo "$s"
}
