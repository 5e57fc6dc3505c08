#!/usr/bin/env bash
# cgroup2-vm.sh [GO_TEST_FLAGS...] — runs the sandbox integration suite
# (./sandbox) on a cgroup v2 host: a KVM guest booted with
# cgroup_no_v1=all, whose root filesystem is this host's own (shared read-only
# over 9p, with a RAM overlay for writes), so the guest runs the same pinned
# containerd, runc, kiln-init and cached sandbox images as the host.
#
# Why a guest: a controller (memory, pids, ...) can be in a cgroup v1 or a v2
# hierarchy, never both, and leaves v1 only when its v1 hierarchy has no child
# cgroup left anywhere on the host. On a host whose init keeps its own v1
# cgroups (this test VM's does), the suite cannot switch the host; a guest
# kernel has hierarchies of its own.
#
# The guest has no network device: only its own loopback. Needs root, a usable
# /dev/kvm and apt (qemu-system-x86, busybox-static, kmod and Debian's kernel
# package are fetched when missing). Exits with the test binary's status.
#
# Environment (all optional):
#   KILN_VM_CACHE     kernel and initramfs cache; default /var/cache/kiln/vm
#   KILN_VM_MEMORY    guest memory; default 12G (a 10 GB allocation must pass the
#                     kernel's overcommit check and meet the cgroup limit instead)
#   KILN_VM_CPUS      guest CPUs; default: the host's
#   KILN_VM_TIMEOUT   seconds before the guest is killed; default 1800
#
# A guest that stops answering (its heartbeat stops for 150 s) is dumped
# (each CPU's registers, the kernel's view of every task), killed and booted
# again, once; every failure prints what the guest left. A failed test is
# never run again.
#   KILN_VM_IMAGES    images the guest imports from the host's build cache;
#                     default "python python-slim"
#   KILN_VM_KEEP      1: keep the output dir (test log, console log)
set -euo pipefail

die() {
  echo "cgroup2-vm.sh: $*" >&2
  exit 1
}

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${KILN_VM_CACHE:-/var/cache/kiln/vm}
memory=${KILN_VM_MEMORY:-12G}
cpus=${KILN_VM_CPUS:-$(nproc)}
timeout_s=${KILN_VM_TIMEOUT:-1800}
accel=${KILN_VM_ACCEL:-tcg}
images=${KILN_VM_IMAGES:-python python-slim}
export PATH=$PATH:/usr/local/go/bin

[ "$(id -u)" -eq 0 ] || die "must run as root (KVM, and the guest runs containerd as root)"

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
# The initramfs holds busybox alone: it must be the static build.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
command -v depmod >/dev/null || need+=(kmod)
if [ ${#need[@]} -gt 0 ]; then
  echo "cgroup2-vm.sh: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } ||
    die "apt-get install ${need[*]} failed"
fi

# The guest kernel: Debian's current one (the package linux-image-amd64 points
# at), unpacked, never installed on the host. Cached by package name.
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$pkg" ]; then
  apt-get update -qq
  pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
[ -n "$pkg" ] || die "cannot tell which kernel package linux-image-amd64 depends on"
kver=${pkg#linux-image-}
kdir=$cache/$pkg
if [ ! -f "$kdir/ready" ]; then
  echo "cgroup2-vm.sh: fetching $pkg"
  rm -rf "$kdir" && mkdir -p "$kdir/deb"
  (cd "$kdir/deb" && apt-get download "$pkg" 2>&1 | grep -v 'unsandboxed' || true)
  ls "$kdir"/deb/*.deb >/dev/null 2>&1 || die "apt-get download $pkg failed"
  dpkg-deb -x "$kdir"/deb/*.deb "$kdir/root"
  rm -rf "$kdir/deb"
  depmod -b "$kdir/root" "$kver"
  touch "$kdir/ready"
fi
vmlinuz=$kdir/root/boot/vmlinuz-$kver
moddir=$kdir/root/lib/modules/$kver
[ -f "$vmlinuz" ] || die "$vmlinuz missing"

# The initramfs: busybox, the modules that reach the host's files (virtio-pci,
# 9p) and overlayfs, and an init that mounts the host's root read-only under
# a RAM overlay and switches to it.
initrd=$kdir/initrd-$(sha256sum "$here/cgroup2-vm.sh" | cut -c1-12).cpio.gz
if [ ! -f "$initrd" ]; then
  stage=$(mktemp -d)
  mkdir -p "$stage"/{bin,mods,proc,sys,dev,lower,rw,newroot}
  cp /usr/bin/busybox "$stage/bin/busybox"
  # Each module after the ones it depends on (modules.dep lists them).
  added=" "
  add_module() {
    local rel=$1 dep
    case $added in *" $rel "*) return ;; esac
    for dep in $(awk -v m="$rel:" '$1 == m { $1 = ""; print }' "$moddir/modules.dep"); do
      add_module "$dep"
    done
    cp "$moddir/$rel" "$stage/mods/"
    basename "$rel" >>"$stage/mods/order"
    added="$added$rel "
  }
  for m in virtio_pci 9pnet_virtio 9p overlay; do
    rel=$(cd "$moddir" && find kernel -name "$m.ko*" | head -n1)
    [ -n "$rel" ] || die "module $m not in $pkg"
    add_module "$rel"
  done
  cat >"$stage/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m || echo "init: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=1048576,cache=loose hostroot /lower || { echo "init: mounting the host root failed"; poweroff -f; }
mount -t tmpfs -o mode=755 rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot || { echo "init: overlay failed"; poweroff -f; }
mkdir -p /newroot/kilnout
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 kilnout /newroot/kilnout || { echo "init: mounting the output dir failed"; poweroff -f; }
umount /proc /sys /dev
exec switch_root /newroot /bin/bash /kilnout/guest.sh
INIT
  chmod 755 "$stage/init"
  (cd "$stage" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$stage"
fi
flock -u 9

# The test binary, kiln-init and the jail library, built here: the guest
# sees this checkout, but compiling under emulation would take minutes.
out=$(mktemp -d /var/tmp/kiln-cgroup2-vm.XXXXXX)
[ "${KILN_VM_KEEP:-}" = 1 ] || trap 'rm -rf "$out"' EXIT
echo "cgroup2-vm.sh: building the sandbox test binary"
(cd "$repo" && go test -c -o "$out/sandbox.test" ./sandbox/ &&
  CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -buildid=' -o "$out/kiln-init" ./cmd/kiln-init &&
  bash sandbox/jail/csrc/build.sh "$out/libkilnjail.so")

# Arguments for the test binary, one per line (spaces in -run patterns stay).
: >"$out/args"
for a in "$@"; do printf '%s\n' "$a" >>"$out/args"; done

cat >"$out/guest.sh" <<GUEST
#!/bin/bash
# Runs in the guest as its init (pid 1), on the overlay root.
set -u
export PATH=/usr/local/lib/kiln:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root KILN_INTEGRATION=require GOTRACEBACK=all KILN_TEST_INIT=/kilnout/kiln-init KILN_TEST_JAIL=/kilnout/libkilnjail.so
finish() { echo "\$1" >/kilnout/rc; sync; echo o >/proc/sysrq-trigger; sleep 10; }
mount -t proc proc /proc
# Every sysrq function, for the host's dump of a guest that stopped
# answering (sendkey through qemu's monitor).
echo 1 >/proc/sys/kernel/sysrq
# The kernel's symbols (text, no modules), once per kernel: with nokaslr
# they name the addresses qemu reports of a stuck guest's CPUs (Debian's
# System.map is a placeholder).
[ -e /kilnout/need-kallsyms ] && grep -v '\[' /proc/kallsyms | grep ' [tT] ' >/kilnout/kallsyms
mount -t sysfs sys /sys
# A heartbeat the host watches: a guest whose kernel stops running it is
# dumped and killed (and booted again, once) without waiting for the timeout.
( while :; do cut -d' ' -f1 /proc/uptime >/kilnout/alive; sleep 10; done ) &
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t mqueue mqueue /dev/mqueue
mount -t cgroup2 cgroup2 /sys/fs/cgroup || { echo "guest: mounting cgroup2 failed"; finish 90; }
echo "guest: cgroup2 controllers: \$(cat /sys/fs/cgroup/cgroup.controllers)"
for c in \$(cat /sys/fs/cgroup/cgroup.controllers); do echo "+\$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; done
echo "guest: enabled for children: \$(cat /sys/fs/cgroup/cgroup.subtree_control)"
# Directories containerd and the sandboxes write to must not be on the overlay
# (the overlayfs snapshotter cannot stack on it). The checkout may live under
# one of them (a CI clone in /tmp): it is kept aside and bound back.
mkdir -p /kilnrepo && mount --bind $repo /kilnrepo
for d in /run /tmp /var/tmp /var/lib/containerd /var/lib/kiln /var/log/kiln; do
  mkdir -p "\$d" && mount -t tmpfs -o mode=755 tmpfs "\$d"
done
[ -d $repo/sandbox ] || { mkdir -p $repo && mount --bind /kilnrepo $repo; }
chmod 1777 /tmp /var/tmp
mkdir -p /lib/modules/$kver && mount --bind $moddir /lib/modules/$kver
ip link set lo up
hostname kiln-cgroup2
echo "guest: kernel \$(uname -r), \$(nproc) CPUs, \$(awk '/MemTotal/{print \$2}' /proc/meminfo) kB"
cd $repo
bash deploy/local/containerd.sh || finish 91
for img in $images; do bash deploy/images/build.sh "\$img" || finish 92; done
mapfile -t args </kilnout/args
cd $repo/sandbox
# The test binary's own timeout (which prints every goroutine's stack) must
# fire well before the host dumps and kills the guest (45 s before its time
# is up): what is left of the guest's time after boot and imports, less two
# minutes (writing the stacks out over 9p took 36 s here).
left=\$(( $timeout_s - \$(cut -d. -f1 /proc/uptime) - 120 ))
echo "guest: tests start, \${left}s before their timeout"
# Half a minute before the tests' timeout, what the guest's processes are
# doing goes to the console (not over 9p, which a stuck guest may not
# serve), then containerd's goroutines (SIGUSR1 writes them to its log) to
# the output dir. A run that ends in time never gets there.
( sleep \$((left - 30))
  { echo "guest: the tests are about to time out; processes:"
    ps -eo pid,ppid,user,stat,pcpu,wchan:32,args | cut -c1-200; } >/dev/console 2>&1
  pkill -USR1 -x containerd; sleep 5; tail -n 3000 /var/log/kiln/containerd.log >/kilnout/containerd.log; sync ) &
/kilnout/sandbox.test -test.count=1 -test.timeout=\${left}s "\${args[@]}" >/kilnout/test.log 2>&1
finish \$?
GUEST
chmod 755 "$out/guest.sh"

case $accel in
  kvm) machine="-machine q35,accel=kvm -cpu host,-arch-capabilities" ;;
  tcg) machine="-machine q35 -accel tcg,thread=multi,tb-size=512 -cpu max" ;;
  *) die "KILN_VM_ACCEL must be kvm or tcg" ;;
esac
# What a guest that stopped answering or neared its timeout left: the
# console from the guest's own report of its processes on (with the
# kernel's, if the host asked for it), where its CPUs were, and
# containerd's goroutines.
print_hang() {
  local from
  from=$(grep -a -n -m1 -e 'guest: the tests are about to time out' -e 'sysrq: Changing Loglevel' "$out/console.log" | cut -d: -f1) || true
  if [ -n "$from" ]; then
    echo "cgroup2-vm.sh: the guest's console from its report on:" >&2
    tail -n "+$from" "$out/console.log" | head -n 6000 >&2 || true
  fi
  # Where each CPU was, three times a second apart (qemu's view; the kernel
  # is booted without address randomization, so its symbol list, kept from
  # an earlier boot, names the function).
  if grep -aq '^RIP=' "$out/monitor.log" 2>/dev/null; then
    echo "cgroup2-vm.sh: the guest's CPUs (RIP, privilege level, kernel function):" >&2
    local map rip cpl sym
    map=$kdir/kallsyms
    grep -ao '^RIP=[0-9a-f]* .*CPL=[0-9]' "$out/monitor.log" | sed 's/^RIP=\([0-9a-f]*\) .*CPL=\([0-9]\)$/\1 \2/' |
      while read -r rip cpl; do
        # Fixed-width lowercase hex: text order is address order.
        sym=""
        if [ -s "$map" ]; then
          sym=$({ cat "$map"; echo "$rip ~ ~rip"; } | LC_ALL=C sort | grep -B1 -m1 ' ~ ~rip$' | head -n1) || true
        fi
        if [ "$cpl" = 0 ] && [ -n "$sym" ]; then
          printf '  %s CPL=%s %s+0x%x\n' "$rip" "$cpl" "${sym##* }" $((16#$rip - 16#${sym%% *})) >&2
        else
          printf '  %s CPL=%s\n' "$rip" "$cpl" >&2
        fi
      done
  fi
  if [ -s "$out/containerd.log" ]; then
    echo "cgroup2-vm.sh: containerd's log in the guest, with its goroutines:" >&2
    grep -v '^$' "$out/containerd.log" | tail -n 1500 >&2 || true
  fi
  return 0
}
# qemu's monitor is on a pair of pipes. When the guest stops answering (no
# heartbeat for $stall_s seconds), or 45 seconds before its time is up, the
# host reads every CPU's registers from qemu and has the guest's kernel
# print what every CPU runs, its blocked tasks and every task's stack to
# the console (magic sysrq keys): nothing of the guest's own processes is
# needed. A guest that stopped answering is booted again, once: an emulated
# machine that wedged (seen here under host load; its state is printed in
# full) is not a test's failure. A failed test, or tests that outlive their
# timeout in a live guest, are never run again.
stall_s=150
[ -s "$kdir/kallsyms" ] || : >"$out/need-kallsyms"
mkfifo "$out/monitor.in" "$out/monitor.out" "$out/idle"
exec 9<>"$out/monitor.in" 8<>"$out/idle"
# Waits are reads of a pipe nobody writes (no sleep is left behind holding
# this script's output open).
pause() { read -r -t "$1" -u 8 _ || true; }
dump_guest() {
  for _ in 1 2 3; do
    echo "info registers -a" >&9
    pause 1
  done
  for k in 9 l w t; do
    echo "sendkey alt-sysrq-$k" >&9
    pause 3
  done
}
attempt=1
while :; do
  rm -f "$out/rc" "$out/test.log" "$out/alive" "$out/containerd.log"
  cat "$out/monitor.out" >"$out/monitor.log" 2>/dev/null </dev/null &
  drain=$!
  echo "cgroup2-vm.sh: booting $pkg with cgroup_no_v1=all ($cpus CPUs, $memory); console in $out/console.log"
  qemu-system-x86_64 \
    $machine -smp "$cpus" -m "$memory" \
    -nodefaults -nographic -no-reboot -nic none \
    -serial "file:$out/console.log" \
    -kernel "$vmlinuz" -initrd "$initrd" \
    -append "console=ttyS0 panic=-1 nokaslr cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 quiet" \
    -fsdev local,id=hostroot,path=/,security_model=passthrough,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev local,id=kilnout,path="$out",security_model=passthrough,multidevs=remap \
    -device virtio-9p-pci,fsdev=kilnout,mount_tag=kilnout \
    -device virtio-rng-pci \
    -monitor "pipe:$out/monitor" </dev/null &
  qpid=$!
  began=$SECONDS
  ended=""
  while kill -0 "$qpid" 2>/dev/null; do
    pause 5
    if ((SECONDS - began >= timeout_s - 45)); then
      ended=timeout
    elif [ -e "$out/alive" ] && [ ! -e "$out/rc" ] && (($(date +%s) - $(stat -c %Y "$out/alive" 2>/dev/null || date +%s) > stall_s)); then
      ended=stalled
    fi
    if [ -n "$ended" ]; then
      kill -0 "$qpid" 2>/dev/null && dump_guest
      kill -KILL "$qpid" 2>/dev/null || true
      break
    fi
  done
  set +e
  wait "$qpid"
  qrc=$?
  set -e
  kill "$drain" 2>/dev/null || true
  if [ "$ended" = stalled ] && [ ! -f "$out/rc" ] && ((attempt < 2)); then
    echo "cgroup2-vm.sh: the guest stopped answering (no heartbeat for ${stall_s}s, $((SECONDS - began))s after boot); what it left follows, then it boots again, once" >&2
    [ -f "$out/test.log" ] && cat "$out/test.log"
    tail -n 60 "$out/console.log" >&2
    print_hang
    attempt=2
    continue
  fi
  case $ended in
    stalled) echo "cgroup2-vm.sh: the guest stopped answering again (no heartbeat for ${stall_s}s)" >&2 ;;
    timeout) echo "cgroup2-vm.sh: the guest ran out of its ${timeout_s}s" >&2 ;;
  esac
  break
done
if [ -s "$out/kallsyms" ] && [ ! -s "$kdir/kallsyms" ]; then
  cp "$out/kallsyms" "$kdir/kallsyms.tmp" && mv "$kdir/kallsyms.tmp" "$kdir/kallsyms"
fi
exec 9>&- 8>&-
[ -f "$out/test.log" ] && cat "$out/test.log"
if [ ! -f "$out/rc" ]; then
  echo "cgroup2-vm.sh: the guest ended without a test status (qemu exit $qrc); its console:" >&2
  tail -n 60 "$out/console.log" >&2
  print_hang
  exit 1
fi
rc=$(cat "$out/rc")
if [ "$rc" != 0 ]; then
  echo "cgroup2-vm.sh: tests in the cgroup v2 guest exited $rc; console tail:" >&2
  tail -n 30 "$out/console.log" >&2
  print_hang
fi
exit "$rc"
