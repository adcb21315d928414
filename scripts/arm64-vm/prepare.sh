#!/usr/bin/env bash
# prepare.sh - build, once, what boot.sh needs to boot a real Debian arm64
# kernel under qemu-system-aarch64 (TCG, no KVM) with an initramfs-only root.
#
# Usage: scripts/arm64-vm/prepare.sh        (run as root; idempotent)
#
# Everything lives in $ARM64_VM_CACHE (default: <repo>/target/arm64-vm):
#   Image          uncompressed arm64 kernel from Debian trixie's
#                  linux-image-6.12.*+deb13-arm64-unsigned (newest of
#                  trixie / trixie-security at the time it was made)
#   kernel.txt     "<package> <version>" of that kernel
#   kernel-config  its /boot/config-*, for reference
#   base.cpio.zst  trixie minbase root (+ python3, bpftool, busybox-static)
#                  as a zstd-compressed newc cpio, used as the whole root fs
#   py311.cpio.zst Debian bookworm's arm64 CPython 3.11 (python3.11 and its
#                  minimal and standard libraries) on top of it: a second
#                  interpreter, linked into its executable as on x86_64
# Only missing parts are made. Each part is built in a temp dir inside the
# cache and renamed into place at the end, so an interrupted run is simply
# redone next time (stale *.tmp.* dirs are removed). Delete a file to
# rebuild it. Prints the paths of the cached files at the end.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${ARM64_VM_CACHE:-$REPO/target/arm64-vm}
MIRROR=http://deb.debian.org/debian
SECURITY=http://deb.debian.org/debian-security
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

log() { echo "arm64-vm: $*" >&2; }

[ "$(id -u)" = 0 ] || { log "must run as root (apt-get, debootstrap)"; exit 1; }
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)

# Host tools. Only install what is missing, so warm runs never touch apt.
need=()
for p in debootstrap qemu-system-arm cpio zstd debian-archive-keyring; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
# --no-remove: never let this script remove host packages. On these hosts
# qemu-utils may come from bookworm-backports (qemu 10), and bookworm's
# qemu-system-common 7.2 Breaks it; then take the qemu-system-* packages
# from bookworm-backports too (only those, via an extra sources list).
apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends --no-remove "$@" >&2
}
if [ ${#need[@]} -gt 0 ]; then
    log "installing host packages: ${need[*]}"
    apt-get update -q >&2
    if ! apt_install "${need[@]}"; then
        [[ " ${need[*]} " == *" qemu-system-arm "* ]] || exit 1
        log "retrying with qemu-system-* from bookworm-backports"
        bpo=$(mktemp -d)
        echo "deb [signed-by=$KEYRING] $MIRROR bookworm-backports main" > "$bpo/bpo.list"
        apt-get -o Dir::Etc::sourcelist="$bpo/bpo.list" update -q >&2
        pkgs=()
        for p in "${need[@]}"; do
            case $p in qemu-system-arm) pkgs+=(qemu-system-arm/bookworm-backports
                qemu-system-common/bookworm-backports qemu-system-data/bookworm-backports) ;;
            *) pkgs+=("$p") ;; esac
        done
        apt_install -o Dir::Etc::sourcelist="$bpo/bpo.list" "${pkgs[@]}"
        rm -rf "$bpo"
    fi
fi

# One prepare at a time per cache (parallel boot.sh runs), then clear the
# leftovers of an interrupted earlier run.
exec 9>"$CACHE/.lock"
flock 9
rm -rf "$CACHE"/*.tmp.*

# private_apt DIR SUITE: a private, throwaway APT setup under DIR for
# Debian SUITE's arm64 packages (and its security updates), exported as
# APT_CONFIG with its indexes fetched. Call it in a subshell: APT_CONFIG
# must not leak into debootstrap.
private_apt() {
    local apt=$1/apt suite=$2
    # arm64-only indexes that never mix with the host's bookworm state.
    # Dir::Etc::parts/main/preferences point at private (empty) places so
    # the host's apt.conf.d hooks and pins don't apply.
    mkdir -p "$apt"/{state/lists/partial,cache/archives/partial,etc/apt.conf.d,etc/preferences.d}
    touch "$apt/state/status"
    cat > "$apt/etc/sources.list" <<SRC
deb [arch=arm64 signed-by=$KEYRING] $MIRROR $suite main
deb [arch=arm64 signed-by=$KEYRING] $SECURITY $suite-security main
SRC
    cat > "$apt/apt.conf" <<CONF
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
APT::Sandbox::User "root";
Dir::State "$apt/state";
Dir::State::status "$apt/state/status";
Dir::Cache "$apt/cache";
Dir::Etc::main "$apt/etc/apt.conf";
Dir::Etc::parts "$apt/etc/apt.conf.d";
Dir::Etc::sourcelist "$apt/etc/sources.list";
Dir::Etc::sourceparts "-";
Dir::Etc::preferences "$apt/etc/preferences";
Dir::Etc::preferencesparts "$apt/etc/preferences.d";
Acquire::Languages "none";
CONF
    export APT_CONFIG=$apt/apt.conf
    log "fetching $suite arm64 package indexes"
    apt-get update -q >&2
}

# Subshell body: the exported APT_CONFIG must not leak into debootstrap.
make_kernel() (
    local tmp pkg ver deb img
    tmp=$(mktemp -d "$CACHE/kernel.tmp.XXXXXX")
    private_apt "$tmp" trixie
    # Newest 6.12 ABI in trixie or trixie-security (sort -V on the names).
    pkg=$(apt-cache pkgnames linux-image-6.12. |
          grep -E '^linux-image-6\.12\.[0-9]+\+deb13-arm64-unsigned$' | sort -V | tail -n1)
    [ -n "$pkg" ] || { log "no linux-image-6.12.*+deb13-arm64-unsigned in trixie"; return 1; }
    ver=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
    log "kernel package: $pkg $ver"
    (cd "$tmp" && apt-get download -q "$pkg=$ver" >&2)
    deb=$(ls "$tmp"/*.deb)
    dpkg-deb -x "$deb" "$tmp/x"
    img=$(ls "$tmp"/x/boot/vmlinuz-*)
    # qemu -kernel wants the raw arm64 Image: check its "ARM\x64" magic at
    # offset 56 rather than trusting the file name.
    [ "$(od -An -tx1 -j56 -N4 "$img" | tr -d ' \n')" = 41524d64 ] ||
        { log "$img is not an uncompressed arm64 Image"; return 1; }
    grep -q '^CONFIG_RD_ZSTD=y' "$tmp"/x/boot/config-* ||
        { log "kernel lacks CONFIG_RD_ZSTD=y; base.cpio.zst would not unpack"; return 1; }
    cp "$tmp"/x/boot/config-* "$CACHE/kernel-config"
    echo "$pkg $ver" > "$CACHE/kernel.txt"
    mv "$img" "$CACHE/Image"   # last: Image present == kernel part done
    rm -rf "$tmp"
)

make_base() {
    local tmp root deb f
    tmp=$(mktemp -d "$CACHE/base.tmp.XXXXXX")
    root=$tmp/root
    # --foreign only downloads and unpacks the essentials: no second stage,
    # so no arm64 code ever runs on the host (no qemu-user-static needed).
    log "debootstrap (first stage) trixie arm64"
    debootstrap --arch=arm64 --foreign --variant=minbase \
        --include=python3,bpftool,busybox-static trixie "$root" "$MIRROR" >&2
    # The second stage would unpack the rest; doing it with tar is enough for
    # an initramfs root (no maintainer scripts are needed to run python3 or
    # bpftool). --keep-directory-symlink keeps the merged-/usr symlinks.
    log "unpacking $(ls "$root"/var/cache/apt/archives/*.deb | wc -l) packages"
    for deb in "$root"/var/cache/apt/archives/*.deb; do
        dpkg-deb --fsys-tarfile "$deb" |
            tar -x --keep-directory-symlink -C "$root" 2>>"$tmp/tar.log" || true
    done
    # Symlinks debootstrap already made are expected to clash; show the rest.
    grep -v -e 'Cannot create symlink to .*: File exists' \
            -e 'Exiting with failure status due to previous errors' "$tmp/tar.log" >&2 || true
    rm -f "$root"/var/cache/apt/archives/*.deb
    # Half the root is apt indexes, docs, man pages and translations: drop
    # them, since the kernel unpacks the initramfs slowly under TCG.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/{doc,man,info,locale}/*
    rm -rf "$root/debootstrap"
    # In a docker container debootstrap makes /proc a symlink to the host's
    # /proc; the guest needs real (empty) mount points.
    for f in proc sys; do
        [ -L "$root/$f" ] && rm -f "$root/$f"
        mkdir -p "$root/$f" && chmod 555 "$root/$f"
    done
    # base-passwd's postinst would make these; tools like id/whoami want them.
    [ -e "$root/etc/passwd" ] || cp "$root/usr/share/base-passwd/passwd.master" "$root/etc/passwd"
    [ -e "$root/etc/group" ] || cp "$root/usr/share/base-passwd/group.master" "$root/etc/group"
    for f in bin/busybox bin/sh usr/bin/python3 usr/sbin/bpftool; do
        [ -e "$root/$f" ] || [ -L "$root/$f" ] || { log "root lacks /$f"; return 1; }
    done
    log "packing base.cpio.zst"
    (cd "$root" && find . -print0 | LC_ALL=C sort -z |
        cpio --null -o -H newc --quiet | zstd -q -T0 -6) > "$tmp/base.cpio.zst"
    mv "$tmp/base.cpio.zst" "$CACHE/base.cpio.zst"
    rm -rf "$tmp"
}

# Bookworm's CPython 3.11 for arm64, unpacked over the trixie root (its
# libc is newer; the libraries the interpreter and ctypes need, zlib, expat
# and libffi8, are the base's). Subshell body: APT_CONFIG stays here.
make_py311() (
    local tmp root deb
    tmp=$(mktemp -d "$CACHE/py311.tmp.XXXXXX")
    root=$tmp/root
    private_apt "$tmp" bookworm
    (cd "$tmp" && apt-get download -q python3.11-minimal libpython3.11-minimal libpython3.11-stdlib >&2)
    mkdir -p "$root"
    for deb in "$tmp"/*.deb; do
        dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$root"
    done
    rm -rf "$root"/usr/share/{doc,man}
    [ -x "$root/usr/bin/python3.11" ] || { log "python3.11-minimal has no usr/bin/python3.11"; return 1; }
    (cd "$root" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
        cpio --null -o -H newc -R 0:0 --quiet | zstd -q -T0 -6) > "$tmp/py311.cpio.zst"
    mv "$tmp/py311.cpio.zst" "$CACHE/py311.cpio.zst"
    rm -rf "$tmp"
)

# CPython 3.10 and 3.12 for arm64, for the full set only (ARM64_VM_CROSS_PYTHONS
# names them): Debian has neither any more and Ubuntu's arm64 archive is not
# reachable here, so they are cross-built from the upstream sources (Ubuntu's
# orig tarballs, checked against the sums in Ubuntu's source index) with
# gcc-aarch64-linux-gnu, and installed under /opt/python3.X with the
# interpreter linked into its executable, as distributions build it. A
# cross build runs an interpreter of the same version on the host: one is
# built first. ctypes links trixie's arm64 libffi, which the base root has.
# About 4 minutes per build on 2 cores; each version's cpio is kept.
declare -A CPYTHON=(
    [3.10]="python3.10 3.10.4 80bf925f571da436b35210886cf79f6eb5fa5d6c571316b73568343451f77a19"
    [3.12]="python3.12 3.12.3 56bfef1fdfc1221ce6720e43a661e3eb41785dd914ce99698d8c7896af4bdaa1"
)
make_cpython() (
    local v=$1 name pkg ver sha tmp tarball src sysroot jobs
    [ -n "${CPYTHON[$v]:-}" ] || { log "no CPython $v to cross-build (known: ${!CPYTHON[*]})"; return 1; }
    read -r pkg ver sha <<< "${CPYTHON[$v]}"
    name=py${v/./}
    tmp=$(mktemp -d "$CACHE/$name.tmp.XXXXXX")
    jobs=$(nproc)
    tarball=$CACHE/${pkg}_$ver.orig.tar.xz
    if ! echo "$sha  $tarball" | sha256sum -c --quiet 2>/dev/null; then
        log "fetching CPython $ver's sources (Ubuntu's ${pkg}_$ver.orig.tar.xz)"
        curl -fsSL -o "$tmp/src.tar.xz" "http://archive.ubuntu.com/ubuntu/pool/main/p/$pkg/${pkg}_$ver.orig.tar.xz"
        echo "$sha  $tmp/src.tar.xz" | sha256sum -c --quiet ||
            { log "${pkg}_$ver.orig.tar.xz does not have the sum of Ubuntu's source index"; return 1; }
        mv "$tmp/src.tar.xz" "$tarball"
    fi
    tar -xJf "$tarball" -C "$tmp"
    src=$tmp/Python-$ver
    sysroot=$tmp/sysroot
    private_apt "$tmp" trixie
    (cd "$tmp" && apt-get download -q libffi-dev libffi8 >&2)
    for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$sysroot"; done
    # 3.10's setup.py looks for ffi.h where pkg-config's include directory
    # (/usr/include) says, not in Debian's multiarch directory beside it.
    cp "$sysroot"/usr/include/aarch64-linux-gnu/ffi*.h "$sysroot/usr/include/"
    log "building CPython $ver for this machine (the cross build runs it)"
    mkdir "$tmp/host"
    (cd "$tmp/host" && "$src/configure" -q --without-ensurepip >&2 && make -s -j"$jobs" >&2)
    mkdir "$tmp/bin"
    printf '#!/bin/sh\nexec %s "$@"\n' "$tmp/host/python" > "$tmp/bin/python$v"
    chmod +x "$tmp/bin/python$v"
    log "cross-building CPython $ver for aarch64"
    printf 'ac_cv_file__dev_ptmx=yes\nac_cv_file__dev_ptc=no\nac_cv_buggy_getaddrinfo=no\n' > "$tmp/config.site"
    mkdir "$tmp/cross"
    (cd "$tmp/cross" &&
        PATH=$tmp/bin:$PATH CONFIG_SITE=$tmp/config.site \
        PKG_CONFIG_LIBDIR=$sysroot/usr/lib/aarch64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$sysroot \
        "$src/configure" -q --host=aarch64-linux-gnu --build=x86_64-linux-gnu --prefix=/opt/python$v \
            --with-build-python="$tmp/bin/python$v" --without-ensurepip --enable-ipv6 \
            CPPFLAGS="-I$sysroot/usr/include -I$sysroot/usr/include/aarch64-linux-gnu" \
            LDFLAGS="-L$sysroot/usr/lib/aarch64-linux-gnu" >&2 &&
        PATH=$tmp/bin:$PATH make -s -j"$jobs" >&2 &&
        PATH=$tmp/bin:$PATH make -s install DESTDIR="$tmp/root" >&2)
    [ -x "$tmp/root/opt/python$v/bin/python$v" ] || { log "CPython $ver's cross build made no bin/python$v"; return 1; }
    aarch64-linux-gnu-readelf -d "$tmp/root/opt/python$v/lib/python$v"/lib-dynload/_ctypes.*.so 2>/dev/null | grep -q 'NEEDED.*libffi' ||
        { log "CPython $ver's cross build has no _ctypes linked with libffi"; return 1; }
    aarch64-linux-gnu-readelf -h "$tmp/root/opt/python$v/bin/python$v" | grep -q 'Machine:.*AArch64' ||
        { log "bin/python$v is not an aarch64 executable"; return 1; }
    pack_cpython "$tmp/root" "$v" "$tmp/$name.cpio.zst"
    mv "$tmp/$name.cpio.zst" "$CACHE/$name.cpio.zst"
    rm -rf "$tmp"
)

# pack_cpython ROOT V OUT: ROOT's /opt/pythonV as a cpio, without what the
# tests never run (test packages, optimized .pyc, the static library, the
# test extension modules) and without debug info: a smaller initramfs. The
# symbol tables stay (gpumem finds _PyRuntime in them).
pack_cpython() {
    local root=$1 v=$2 out=$3 lib=$1/opt/python$2/lib/python$2
    rm -rf "$lib"/{test,idlelib,tkinter,turtledemo,ensurepip,lib2to3,pydoc_data} \
        "$lib"/config-"$v"-*/libpython"$v".a "$lib"/lib-dynload/_test*.so "$lib"/lib-dynload/_xxtestfuzz*.so
    find "$root" -name '*.opt-[12].pyc' -delete
    aarch64-linux-gnu-strip --strip-debug "$root/opt/python$v/bin/python$v" "$lib"/lib-dynload/*.so
    (cd "$root" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
        cpio --null -o -H newc -R 0:0 --quiet | zstd -q -T0 -6) > "$out"
}

[ -s "$CACHE/Image" ] || make_kernel
[ -s "$CACHE/base.cpio.zst" ] || make_base
[ -s "$CACHE/py311.cpio.zst" ] || make_py311
for v in ${ARM64_VM_CROSS_PYTHONS:-}; do
    [ -s "$CACHE/py${v/./}.cpio.zst" ] || make_cpython "$v"
done

echo "KERNEL=$CACHE/Image ($(cat "$CACHE/kernel.txt"))"
echo "BASE=$CACHE/base.cpio.zst"
echo "PY311=$CACHE/py311.cpio.zst"
for v in ${ARM64_VM_CROSS_PYTHONS:-}; do echo "PY${v/./}=$CACHE/py${v/./}.cpio.zst"; done
