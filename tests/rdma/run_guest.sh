#!/usr/bin/env bash
# Runs a script inside a throw-away QEMU guest with real RDMA verbs over Soft-RoCE (rdma_rxe).
#
#   run_guest.sh --cache DIR [--timeout S] [--smp N] [--mem MB] [--file PATH]... SCRIPT [ARGS...]
#
# The guest boots Debian 12's own kernel (linux-image-amd64: it ships rdma_rxe) from an initramfs
# made of Debian packages that are downloaded (apt-get download) and unpacked under DIR, never
# installed on the host. In the guest one rxe device, rxe0, sits on dummy0 (10.77.0.1): every
# process in the guest uses it, and rxe loops RoCE v2 traffic between them. (Two rxe devices on a
# veth pair do not work on 6.1.) The files given with --file (programs: their shared libraries
# come along, resolved with ldd) and SCRIPT are copied to /opt/test, and `sh SCRIPT ARGS` runs
# there as root. Its exit code becomes this script's, through a marker on the serial console.
#
# Exit codes: the script's own; 77 when the guest cannot be run here (no qemu-system-x86_64, no
# dpkg-deb, packages cannot be downloaded), with the reason on stderr; 125 when the guest gave no
# exit code (no boot, panic, timeout).
#
# Downloads, the unpacked packages, the kernel and the base image stay under DIR, so reruns only
# rebuild the small per-run image. The guest runs under TCG (software emulation; the nested
# /dev/kvm of our machines cannot run a stock kernel): times measured in it are not performance
# figures.
set -euo pipefail

cache="" timeout=600 smp=2 mem=1536
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cache) cache=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    --) shift; break ;;
    -*) echo "run_guest.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] && [ -n "$cache" ] || { sed -n '2,4p' "$0" >&2; exit 2; }
script=$1
shift

log() { echo "[rdma guest $(date +%T)] $*" >&2; }
skip() { echo "SKIP: $*" >&2; exit 77; }

for tool in qemu-system-x86_64 dpkg-deb apt-get gzip; do
  command -v "$tool" > /dev/null || skip "$tool is not installed (tools/bootstrap.sh installs it)"
done

debs=$cache/debs root=$cache/root kmod=$cache/kmod build=$cache/build
mkdir -p "$debs" "$root" "$kmod" "$build"

# Userspace for the guest: busybox, the verbs library with the rxe provider, and rdma(8) from
# iproute2 to create the rxe device.
packages=(busybox-static libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 iproute2
  libmnl0 libbsd0 libmd0 libcap2 libelf1 libbpf1 zlib1g)

kernel_version() { basename "$(dirname "$(ls -d "$root"/lib/modules/*/kernel | head -1)")"; }

unpack() {
  [ -e "$root/.unpacked" ] && return 0
  local kernel
  kernel=$(apt-cache depends linux-image-amd64 2> /dev/null |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  [ -n "$kernel" ] || skip "apt-cache does not know linux-image-amd64 (run apt-get update)"
  if [ ! -e "$debs/.done" ]; then
    log "downloading $kernel and ${#packages[@]} userspace packages into $debs"
    if ! (cd "$debs" && apt-get download -q "$kernel" "${packages[@]}" kmod > "$build/download.log" 2>&1); then
      cat "$build/download.log" >&2
      skip "apt-get download failed (no network or no package lists?)"
    fi
    touch "$debs/.done"
  fi
  for d in "$debs"/*.deb; do
    case "$d" in
      */kmod_*) dpkg-deb -x "$d" "$kmod" ;;
      *) dpkg-deb -x "$d" "$root" ;;
    esac
  done
  for n in depmod modprobe; do ln -sf kmod "$kmod/bin/$n"; done
  # The package ships no modules.dep: make it, for modprobe --show-depends below.
  "$kmod/bin/depmod" -b "$root" "$(kernel_version)"
  touch "$root/.unpacked"
}

# Copies the shared libraries of the given programs into STAGE (the unpacked Debian packages
# first, then the host's: both are Debian 12).
copy_libs() {
  local stage=$1 f line name path
  shift
  for f in "$@"; do
    while read -r line; do
      case "$line" in
        *"not found"*) log "$f: $line"; return 1 ;;
        *" => /"*) name=${line%% =>*}; path=${line#*=> }; path=${path%% (*} ;;
        /*ld-linux*) name=ld-linux-x86-64.so.2; path=${line%% (*} ;;
        *) continue ;;
      esac
      [ -e "$stage/usr/lib/x86_64-linux-gnu/$name" ] || cp -L "$path" "$stage/usr/lib/x86_64-linux-gnu/$name"
    done < <(LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu" ldd "$f" 2>&1)
  done
}

cpio_gz() {  # cpio_gz STAGE OUT: busybox's cpio, so the host needs none
  (cd "$1" && find . -mindepth 1 | LC_ALL=C sort | "$root/bin/busybox" cpio -o -H newc 2> /dev/null) |
    gzip -1 > "$2"
}

build_base() {
  local kver=$1 st=$build/base base=$build/base.cpio.gz
  if [ -e "$base" ] && [ "$base" -nt "$0" ] && [ "$base" -nt "$root/.unpacked" ]; then return 0; fi
  log "building the base image for kernel $kver"
  rm -rf "$st"
  mkdir -p "$st"/{usr/bin,usr/lib/x86_64-linux-gnu/libibverbs,usr/lib/modules/$kver,etc/libibverbs.d,proc,sys,dev,tmp,opt/test,root}
  ln -s usr/bin "$st/bin"
  ln -s usr/bin "$st/sbin"
  ln -s usr/lib "$st/lib"
  ln -s usr/lib "$st/lib64"
  ln -s x86_64-linux-gnu/ld-linux-x86-64.so.2 "$st/usr/lib/ld-linux-x86-64.so.2"
  cp "$root/bin/busybox" "$st/usr/bin/"
  for a in $("$root/bin/busybox" --list); do [ -e "$st/usr/bin/$a" ] || ln -s busybox "$st/usr/bin/$a"; done
  # rdma_rxe and what it needs, in load order; crc32_generic for the RoCE v2 checksum (rxe asks
  # the crypto API for it when the device is created); ib_uverbs for user-space verbs; dummy for
  # the netdev under rxe0.
  local m ko
  for m in crc32_generic rdma_rxe ib_uverbs dummy; do
    "$kmod/bin/modprobe" -d "$root" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    cp "$ko" "$st/usr/lib/modules/$kver/"
    basename "$ko" >> "$st/etc/modules-order"
  done
  cp "$root/bin/ip" "$st/usr/bin/ip2"
  cp "$root/usr/bin/rdma" "$st/usr/bin/rdma"
  cp "$root"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-*.so "$st/usr/lib/x86_64-linux-gnu/libibverbs/"
  cp "$root/etc/libibverbs.d/rxe.driver" "$st/etc/libibverbs.d/"
  cp -L "$root/usr/lib/x86_64-linux-gnu/libibverbs.so.1" "$st/usr/lib/x86_64-linux-gnu/"
  copy_libs "$st" "$st/usr/bin/rdma" "$st/usr/bin/ip2" "$st"/usr/lib/x86_64-linux-gnu/libibverbs/*.so \
    "$st/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
  echo "root:x:0:0:root:/root:/bin/sh" > "$st/etc/passwd"
  echo "root:x:0:" > "$st/etc/group"
  printf '127.0.0.1 localhost\n10.77.0.1 guest\n' > "$st/etc/hosts"
  echo guest > "$st/etc/hostname"
  cat > "$st/init" << 'INIT'
#!/bin/sh
export PATH=/usr/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/shm /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
hostname guest
finish() { echo; echo "GUEST_EXIT_CODE=$1"; sync; poweroff -f; sleep 5; }
echo "GUEST: init after $(cut -d' ' -f1 /proc/uptime) s"
kv=$(uname -r)
while read -r ko; do
  args=
  [ "$ko" = dummy.ko ] && args=numdummies=1
  insmod "/lib/modules/$kv/$ko" $args || { echo "GUEST: insmod $ko failed"; finish 126; }
done < /etc/modules-order
ip link set lo up
ip addr add 10.77.0.1/24 dev dummy0
ip link set dummy0 up
rdma link add rxe0 type rxe netdev dummy0 || { echo "GUEST: cannot create rxe0"; finish 126; }
echo "GUEST: rxe0 ready after $(cut -d' ' -f1 /proc/uptime) s"
cd /opt/test
rc=0
sh ./run.sh || rc=$?
echo "GUEST: done after $(cut -d' ' -f1 /proc/uptime) s"
finish $rc
INIT
  chmod 755 "$st/init"
  cpio_gz "$st" "$base"
}

kernel_image() {  # the uncompressed vmlinux (PVH boot skips the decompressor: seconds under TCG)
  local kver=$1 vmlinuz=$root/boot/vmlinuz-$1 out=$build/vmlinux
  if [ ! -s "$out" ] || [ "$out" -ot "$vmlinuz" ]; then
    local off
    off=$(LC_ALL=C grep -m1 -aboP '\xfd7zXZ\x00' "$vmlinuz" | head -1 | cut -d: -f1)
    if [ -n "$off" ] && command -v xz > /dev/null &&
      { tail -c +$((off + 1)) "$vmlinuz" | xz -dc --single-stream > "$out.tmp"; } 2> /dev/null; then
      mv "$out.tmp" "$out"
    else
      rm -f "$out.tmp"
      echo "$vmlinuz"
      return
    fi
  fi
  echo "$out"
}

t0=$(date +%s.%N)
unpack
kver=$(kernel_version)
build_base "$kver"
kernel=$(kernel_image "$kver")

# The per-run image: the files under test and the script, appended to the base image (the
# kernel unpacks concatenated archives in order).
st=$build/run.$$
rm -rf "$st"
mkdir -p "$st/opt/test" "$st/usr/lib/x86_64-linux-gnu"
for f in "${files[@]+"${files[@]}"}"; do
  cp -L "$f" "$st/opt/test/"
  if head -c 4 "$f" | grep -q ELF; then copy_libs "$st" "$f"; fi
done
for f in "$st"/usr/lib/x86_64-linux-gnu/*; do
  [ -e "$f" ] && [ -e "$build/base/usr/lib/x86_64-linux-gnu/${f##*/}" ] && rm -f "$f"
done
cp "$script" "$st/opt/test/$(basename "$script")"
{
  printf 'exec sh ./%q' "$(basename "$script")"
  printf ' %q' "$@"
  echo
} > "$st/opt/test/run.sh"
cpio_gz "$st" "$build/run.cpio.gz"
rm -rf "$st"
cat "$build/base.cpio.gz" "$build/run.cpio.gz" > "$build/initrd.img"

console=$build/console.log
: > "$console"
log "booting under TCG ($smp vCPUs, ${mem} MiB), console in $console"
t1=$(date +%s.%N)
qemu-system-x86_64 -accel tcg -cpu max -m "$mem" -smp "$smp" -nodefaults -no-user-config \
  -display none -no-reboot -kernel "$kernel" -initrd "$build/initrd.img" \
  -append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=3" \
  -serial "file:$console" < /dev/null > "$build/qemu.log" 2>&1 &
qemu=$!
tail -s 0.2 -n +1 -f --pid=$qemu "$console" 2> /dev/null | tr -d '\r' &
tailer=$!
waited=0
while kill -0 $qemu 2> /dev/null; do
  if [ $waited -ge $((timeout * 10)) ]; then
    log "no result after $timeout s: stopping the guest"
    kill $qemu
    break
  fi
  sleep 0.1
  waited=$((waited + 1))
done
wait $qemu || true
wait $tailer 2> /dev/null || true
cat "$build/qemu.log" >&2
rc=$(tr -d '\r' < "$console" | sed -n 's/^GUEST_EXIT_CODE=\([0-9]*\)$/\1/p' | tail -1)
log "guest ran $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t1}") s; whole run $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}") s"
if [ -z "$rc" ]; then
  log "the guest gave no exit code (boot failure, panic or timeout)"
  exit 125
fi
log "guest exit code $rc"
exit "$rc"
