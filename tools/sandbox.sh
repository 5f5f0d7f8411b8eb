#!/usr/bin/env bash
# The local sandbox hosts: Debian rootfs booted with systemd-nspawn (a real systemd, no docker),
# for `ansible-playbook deploy.yml` and testinfra. The sandbox fleet is three of them, all on the
# machine's own network (loopback), each with its own sshd port:
#   k26-sandbox    ssh 127.0.0.1:2222   GPU-host stand-in 1 (service on :30000)
#   k26-sandbox-2  ssh 127.0.0.1:2223   GPU-host stand-in 2 (service on :30001)
#   k26-gateway    ssh 127.0.0.1:2224   the gateway host (smg on :30080)
#
#   tools/sandbox.sh up       build (cached) and boot; idempotent: a running sandbox is left as it is
#   tools/sandbox.sh down     orderly poweroff by PID, cgroup leftovers removed
#   tools/sandbox.sh reset    down, then forget the sandbox's disk (the cached rootfs tarball stays)
#   tools/sandbox.sh status   running or not, and the PIDs
#   tools/sandbox.sh exec CMD run CMD inside the guest (nsenter)
#   tools/sandbox.sh fleet up|down|status|stage SRC NAME   the same for all three (stage: the two servers)
# One host is chosen with K26_SANDBOX_HOST=k26-sandbox|k26-sandbox-2|k26-gateway (default k26-sandbox).
#
# The rootfs tarball is cached outside the repository, keyed by the suite and package list.
# docs/sandbox.md says why each flag is there.
set -euo pipefail

CACHE="${K26_CACHE:-$HOME/.cache/k26-ddtree}"
MAIN="${K26_SANDBOX_DIR:-$CACHE/sandbox}"    # the first host's folder; it holds the fleet's key and ssh config
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-venv,python3-apt,openssh-server,sudo,iproute2,ca-certificates,procps,util-linux,curl
FLEET=(k26-sandbox k26-sandbox-2 k26-gateway)
SERVERS=(k26-sandbox k26-sandbox-2)
# one row per host: nspawn machine name, folder suffix, ssh port, ssh aliases
host_row() {
    case "$1" in
        k26-sandbox)   echo "k26sandbox  .   ${K26_SANDBOX_SSH_PORT:-2222} k26-sandbox sandbox 127.0.0.1" ;;
        k26-sandbox-2) echo "k26sandbox2 -2  2223 k26-sandbox-2" ;;
        k26-gateway)   echo "k26gateway  -gw 2224 k26-gateway" ;;
        *) return 1 ;;
    esac
}
HOST="${K26_SANDBOX_HOST:-k26-sandbox}"
if ! ROW=$(host_row "$HOST"); then
    printf 'sandbox: K26_SANDBOX_HOST=%s is not a sandbox host: use one of %s\n' "$HOST" "${FLEET[*]}" >&2; exit 2
fi
read -r MACHINE SUFFIX SSH_PORT _ <<<"$ROW"
STATE="$MAIN${SUFFIX#.}"
KEY_ID=$(printf '%s %s v1' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
TARBALL="$CACHE/rootfs-$SUITE-$KEY_ID.tar.zst"
ROOTFS="$STATE/rootfs"
NSPAWN_PID="$STATE/nspawn.pid"
SUPERVISOR_PID="$STATE/supervisor.pid"
LOG="$STATE/nspawn.log"

log() { printf '>> sandbox: %s\n' "$*" >&2; }
die() { printf 'sandbox: %s\n' "$*" >&2; exit 1; }

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

mirror() {
    # the Debian mirror this machine's own apt sources use (never hard-coded here)
    local url
    url=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list \
          | grep -v security | head -1 | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' | awk '{print $1}')
    [[ -n "$url" ]] || die "no Debian mirror found in /etc/apt/sources*: configure apt first"
    echo "$url"
}

need_tools() {
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
    command -v zstd >/dev/null || missing+=(zstd)
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

build_tarball() {
    [[ -f "$TARBALL" ]] && return
    local tmp="$CACHE/rootfs-build.$$"
    log "debootstrap $SUITE into $tmp (cached as $TARBALL)"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "$(mirror)" >"$CACHE/debootstrap.log" 2>&1 \
        || die "debootstrap failed: see $CACHE/debootstrap.log"
    chroot "$tmp" apt-get clean
    tar -C "$tmp" --numeric-owner -cf - . | zstd -q -T0 -o "$TARBALL.tmp"
    mv "$TARBALL.tmp" "$TARBALL"
    rm -rf "$tmp"
}

prepare_rootfs() {
    [[ -d "$ROOTFS/etc" ]] && return
    log "unpacking rootfs into $ROOTFS"
    mkdir -p "$ROOTFS"
    zstd -q -dc "$TARBALL" | tar -C "$ROOTFS" --numeric-owner -xf -
    mkdir -p "$MAIN"
    [[ -f "$MAIN/id_ed25519" ]] || ssh-keygen -q -t ed25519 -N '' -C k26-sandbox -f "$MAIN/id_ed25519"
    install -d -m 0700 "$ROOTFS/root/.ssh"
    install -m 0600 "$MAIN/id_ed25519.pub" "$ROOTFS/root/.ssh/authorized_keys"
    cat >"$ROOTFS/etc/ssh/sshd_config.d/k26-sandbox.conf" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
PermitRootLogin prohibit-password
PasswordAuthentication no
EOF
    echo "$MACHINE" >"$ROOTFS/etc/hostname"
    # the shared host network: no networkd/resolved inside, the host's resolver file is enough
    rm -f "$ROOTFS/etc/resolv.conf"
    cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
}

write_ssh_config() {
    # one file for the whole fleet, in the first host's folder (the inventory and the tests read it)
    mkdir -p "$MAIN"
    local name port aliases
    : >"$MAIN/ssh_config.tmp"
    for name in "${FLEET[@]}"; do
        read -r _ _ port aliases <<<"$(host_row "$name")"
        cat >>"$MAIN/ssh_config.tmp" <<EOF
Host $aliases
    HostName 127.0.0.1
    Port $port
    User root
    IdentityFile $MAIN/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
EOF
    done
    mv "$MAIN/ssh_config.tmp" "$MAIN/ssh_config"
}

guest_init() { pgrep -P "$(cat "$NSPAWN_PID")" | head -1; }

boot() {
    mkdir -p /run/systemd
    rm -f "$STATE/stop"
    # supervisor: re-run nspawn when the guest reboots (exit code 133 with --keep-unit)
    # each host's nspawn runs in a cgroup of its own name (/sys/fs/cgroup/{systemd,unified}/NAME), so
    # the fleet's containers do not collide in nspawn's payload/ and supervisor/ folders
    setsid bash -c '
        while :; do
            unshare --mount --propagation private bash -c "
                mount -t tmpfs tmpfs /run/systemd
                for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
                    [ -d \$h ] || continue
                    mkdir -p \$h/$3 && echo \$\$ > \$h/$3/cgroup.procs
                done
                echo \$\$ > \"$1\"
                exec systemd-nspawn --boot -D \"$2\" -M \"$3\" --register=no --keep-unit --console=read-only"
            rc=$?
            [[ $rc -eq 133 && ! -f "$4" ]] || exit $rc
        done' supervisor "$NSPAWN_PID" "$ROOTFS" "$MACHINE" "$STATE/stop" </dev/null >"$LOG" 2>&1 &
    echo $! >"$SUPERVISOR_PID"
    local i
    for i in $(seq 1 150); do
        if alive "$NSPAWN_PID" && [[ -n "$(guest_init || true)" ]]; then
            local st
            st=$(nsenter -t "$(guest_init)" -a systemctl is-system-running --wait 2>/dev/null || true)
            if [[ "$st" == running || "$st" == degraded ]]; then
                break
            fi
        fi
        alive "$SUPERVISOR_PID" || die "nspawn exited: $(tail -5 "$LOG")"
        sleep 0.2
    done
    for i in $(seq 1 100); do
        if ssh -F "$MAIN/ssh_config" -o ConnectTimeout=2 "$HOST" true 2>/dev/null; then
            log "up: ssh -F $MAIN/ssh_config $HOST (nspawn PID $(cat "$NSPAWN_PID"))"
            return
        fi
        sleep 0.2
    done
    die "guest $HOST booted but ssh on 127.0.0.1:$SSH_PORT does not answer; see $LOG"
}

cleanup_cgroups() {
    local root
    for root in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified /sys/fs/cgroup; do
        [[ -d "$root" ]] || continue
        find "$root" -depth -mindepth 1 -type d \( -name payload -o -name supervisor -o -path '*/payload/*' \) \
            -exec rmdir {} + 2>/dev/null || true
        [[ -d "$root/$MACHINE" ]] && rmdir "$root/$MACHINE" 2>/dev/null || true
    done
}

up() {
    mkdir -p "$CACHE" "$STATE"
    if alive "$NSPAWN_PID"; then
        write_ssh_config
        log "already running (nspawn PID $(cat "$NSPAWN_PID"))"
        return
    fi
    need_tools
    build_tarball
    prepare_rootfs
    write_ssh_config
    cleanup_cgroups
    boot
}

down() {
    if ! alive "$NSPAWN_PID"; then
        log "not running"
        cleanup_cgroups
        return
    fi
    touch "$STATE/stop"
    local pid
    pid=$(cat "$NSPAWN_PID")
    log "powering off (SIGTERM to nspawn PID $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "still running after 30 s: SIGKILL to $pid"
        kill -KILL "$pid"
    fi
    if alive "$SUPERVISOR_PID"; then
        wait "$(cat "$SUPERVISOR_PID")" 2>/dev/null || true
    fi
    rm -f "$NSPAWN_PID" "$SUPERVISOR_PID"
    cleanup_cgroups
}

fleet() {
    local action="${1:-}" name rc=0
    shift || true
    case "$action" in
        up|down|status) for name in "${FLEET[@]}"; do K26_SANDBOX_HOST="$name" "$0" "$action" || rc=$?; done ;;
        stage) for name in "${SERVERS[@]}"; do K26_SANDBOX_HOST="$name" "$0" stage "$@" || rc=$?; done ;;
        *) die "usage: $0 fleet up|down|status|stage SRC NAME" ;;
    esac
    return $rc
}

case "${1:-}" in
    fleet) shift; fleet "$@" ;;
    up) up ;;
    down) down ;;
    reset) down; rm -rf "$ROOTFS"; log "disk forgotten" ;;
    status)
        if alive "$NSPAWN_PID"; then echo "$HOST running nspawn=$(cat "$NSPAWN_PID") init=$(guest_init)"; else echo "$HOST stopped"; exit 3; fi ;;
    exec) shift; alive "$NSPAWN_PID" || die "not running"; nsenter -t "$(guest_init)" -a "$@" ;;
    ssh-config) echo "$MAIN/ssh_config" ;;
    stage)  # stage SRC NAME: copy a model directory to /srv/models/NAME inside the guest (as production pre-stages weights)
        [[ -d "${2:-}" && -n "${3:-}" ]] || die "usage: $0 stage SRC_DIR NAME"
        mkdir -p "$ROOTFS/srv/models"
        if ! diff -rq "$2" "$ROOTFS/srv/models/$3" >/dev/null 2>&1; then
            rm -rf "$ROOTFS/srv/models/$3"
            cp -a "$2" "$ROOTFS/srv/models/$3"
            chmod -R a+rX "$ROOTFS/srv/models/$3"
            log "staged $2 as /srv/models/$3"
        fi ;;
    *) die "usage: $0 up|down|reset|status|exec CMD|ssh-config|stage SRC NAME|fleet up|down|status|stage SRC NAME" ;;
esac
