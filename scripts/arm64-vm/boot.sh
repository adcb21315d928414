#!/usr/bin/env bash
# boot.sh - boot Debian trixie's arm64 kernel under qemu-system-aarch64 (TCG,
# no KVM needed) with an initramfs-only root and run a payload inside it.
#
# Usage: scripts/arm64-vm/boot.sh PAYLOAD_DIR        (run as root)
#   PAYLOAD_DIR is copied to /payload in the guest (owned by root) and
#   PAYLOAD_DIR/run, which must be executable, is run there as root with
#   cwd /payload and stdout+stderr on the serial console. Mounted first:
#   proc, sysfs, devtmpfs, tracefs, debugfs, bpffs, cgroup2.
#   The console is streamed to stdout. The exit status is run's, read from
#   the "GPUMEM-ARM64-EXIT <rc>" line /init prints last; 125 (with a message
#   on stderr) if that line never came: boot failure, panic or timeout.
#
# Runs prepare.sh first; kernel Image and root cpios (base, python3.11) are cached in
# $ARM64_VM_CACHE (default: <repo>/target/arm64-vm), see prepare.sh.
# Per boot, only a small overlay cpio (/init + /payload) is made, in a temp
# dir that is removed at exit. Env: ARM64_VM_TIMEOUT (seconds for the whole
# boot, default 600), ARM64_VM_MEM (MiB, default 2048), ARM64_VM_SMP (2),
# ARM64_VM_CROSS_PYTHONS (CPythons cross-built into /opt, e.g. "3.10 3.12").
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ARM64_VM_CACHE:-$REPO/target/arm64-vm}
TIMEOUT=${ARM64_VM_TIMEOUT:-600}
MARK=GPUMEM-ARM64-EXIT

die() { echo "arm64-vm: $*" >&2; exit 125; }

[ $# -eq 1 ] || die "usage: $0 PAYLOAD_DIR"
PAYLOAD=$1
[ -d "$PAYLOAD" ] || die "$PAYLOAD is not a directory"
[ -f "$PAYLOAD/run" ] && [ -x "$PAYLOAD/run" ] || die "$PAYLOAD/run is missing or not executable"

# prepare.sh's chatter goes to stderr so stdout is only the guest console.
"$HERE/prepare.sh" >&2
CACHE=$(cd "$CACHE" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/arm64-vm.XXXXXX")
finished=
cleanup() {
    # Only if we are leaving early (signal, error): don't leave qemu behind.
    if [ -z "$finished" ] && [ -s "$work/qemu.pid" ]; then
        kill "$(cat "$work/qemu.pid")" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Overlay: /init and /payload, unpacked by the kernel on top of the base root.
mkdir -p "$work/ovl/payload"
cp -a "$PAYLOAD/." "$work/ovl/payload/"
cat > "$work/ovl/init" <<INIT
#!/bin/busybox sh
# PID 1 of the test VM (made by scripts/arm64-vm/boot.sh). Busybox applets
# by full path: nothing else is set up yet.
bb=/bin/busybox
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
\$bb mount -t proc proc /proc
\$bb mount -t sysfs sysfs /sys
\$bb mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
\$bb mkdir -p /dev/pts /dev/shm
\$bb mount -t devpts devpts /dev/pts
\$bb mount -t tmpfs tmpfs /dev/shm
\$bb mount -t tmpfs tmpfs /run
\$bb mount -t tracefs tracefs /sys/kernel/tracing
\$bb mount -t debugfs debugfs /sys/kernel/debug
\$bb mount -t bpf bpf /sys/fs/bpf
\$bb mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo 1 > /proc/sys/kernel/sysrq
cd /payload
./run
rc=\$?
# Leading newline: the payload's last line may lack one.
echo
echo "$MARK \$rc"
sync
# Let the UART drain, then power off (qemu exits thanks to -no-reboot).
# sysrq-o powers off asynchronously; poweroff -f is only a fallback (if
# PID 1 exited instead, the panic would also end qemu, via panic=-1).
\$bb sleep 0.3
echo o > /proc/sysrq-trigger
\$bb sleep 10
\$bb poweroff -f
INIT
chmod 755 "$work/ovl" "$work/ovl/init"
# zstd like the base: the kernel unpacks concatenated compressed cpio
# archives in order, later entries winning.
(cd "$work/ovl" && find . -mindepth 1 | LC_ALL=C sort |
    cpio -o -H newc -R 0:0 --quiet | zstd -q) > "$work/overlay.cpio.zst"
cpios=("$CACHE/base.cpio.zst" "$CACHE/py311.cpio.zst")
for v in ${ARM64_VM_CROSS_PYTHONS:-}; do cpios+=("$CACHE/py${v/./}.cpio.zst"); done
cat "${cpios[@]}" "$work/overlay.cpio.zst" > "$work/initrd"

# Backgrounded + wait so the INT/TERM traps run at once (and kill qemu via
# its pidfile) instead of after qemu exits. sed strips the console's \r.
# -nic none: no network needed, and the default NIC wants an iPXE ROM.
timeout -k 10 "$TIMEOUT" qemu-system-aarch64 \
    -M virt -cpu max,pauth-impdef=on -smp "${ARM64_VM_SMP:-2}" -m "${ARM64_VM_MEM:-2048}" \
    -nographic -monitor none -no-reboot -pidfile "$work/qemu.pid" \
    -nic none \
    -kernel "$CACHE/Image" -initrd "$work/initrd" \
    -append "console=ttyAMA0 rdinit=/init panic=-1 quiet" \
    </dev/null 2>&1 | sed -u 's/\r$//' | tee "$work/console.log" &
wait $! || true
finished=1

rc=$(grep -ao "$MARK [0-9]\+" "$work/console.log" | tail -n1 | cut -d' ' -f2 || true)
[ -n "$rc" ] || die "no '$MARK <rc>' line from the guest: boot failure or timeout (${TIMEOUT}s)"
exit "$rc"
