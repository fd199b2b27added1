#!/usr/bin/env bash
# rdma-lab.sh: Soft-RoCE (rdma_rxe) in a qemu guest, for tests over real RDMA verbs.
#
#   scripts/rdma-lab.sh setup                 install packages, cache kernel and initramfs
#   scripts/rdma-lab.sh run [--timeout S] -- CMD [ARGS...]
#                                             boot the guest, run CMD, exit with its status
#
# The guest is a Debian kernel (linux-image-amd64's versioned package, unpacked, never
# installed on the host) with a busybox initramfs. It boots under qemu's TCG: the hosts
# this project runs on have no usable KVM (a PVM /dev/kvm that cannot run a stock kernel,
# or none), so KVM is used only when A2A_LAB_ACCEL=kvm says so. In the guest:
#
#   lo up; veth pair rxenet0 (10.77.0.1/24) <-> rxenet1 (10.77.0.2/24)
#   rxe0 on rxenet0, rxe1 on rxenet1 (Soft-RoCE; RoCE v2 GIDs ::ffff:10.77.0.1 / .2)
#   policy routing: traffic from one address to the other leaves through its own veth end
#     instead of the local table, so a QP on rxe0 talking to one on rxe1 crosses the wire
#     (without it, modify QP to RTR fails: the peer's address is local)
#   the repository root shared by 9p (virtfs) at the same absolute path as on the host,
#     read-write; CMD runs there with bin/ first on PATH, HOME=/root, A2A_RDMA_LAB=1
#   every A2A_* variable of the caller's environment is passed on (except A2A_LAB_*)
#   tmpfs /tmp and /dev/shm, RLIMIT_MEMLOCK unlimited
#
# A dynamically linked cgo binary built in the checkout with a plain `go build` runs there:
# the initramfs carries glibc, libibverbs (dlopen'ed by a2a's verbs binding), the rxe
# provider with /etc/libibverbs.d/rxe.driver, libnl, iproute2's ip and rdma, ibv_devinfo,
# perftest's ib_write_bw and ib_write_lat.
#
# Cache (A2A_LAB_CACHE; default /var/cache/a2a-rdma-lab for root, else
# ${XDG_CACHE_HOME:-~/.cache}/a2a-rdma-lab): the kernel package unpacked and depmod'ed, and
# the initramfs with a stamp of its inputs (this script, the kernel version and every file
# copied in); it is rebuilt only when the stamp changes.
#
# Environment: A2A_LAB_CACHE (see above), A2A_LAB_TIMEOUT (seconds, default 600),
# A2A_LAB_MEM (MiB, default 1536), A2A_LAB_SMP (default 2), A2A_LAB_ACCEL (tcg|kvm),
# A2A_LAB_VERBOSE=1 (show the guest's boot log too), A2A_LAB_KEEP=1 (keep the run dir).
#
# Exit status: CMD's; 124 when the guest timed out, 125 when the lab itself failed (no
# packages, kernel, boot, or no exit status from the guest), 2 usage.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"

if [ -n "${A2A_LAB_CACHE:-}" ]; then
	cache=$A2A_LAB_CACHE
elif [ "$(id -u)" = 0 ]; then
	cache=/var/cache/a2a-rdma-lab
else
	cache=${XDG_CACHE_HOME:-$HOME/.cache}/a2a-rdma-lab
fi
timeout_s=${A2A_LAB_TIMEOUT:-600}
mem=${A2A_LAB_MEM:-1536}
smp=${A2A_LAB_SMP:-2}
accel=${A2A_LAB_ACCEL:-tcg}

log() { echo "rdma-lab: $*" >&2; }
die() {
	log "$*"
	exit 125
}

usage() {
	sed -n '2,5p' "$self" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# Packages: those a command proves come from deps.sh's rdma-lab table, the rest (libraries,
# a static busybox rather than any busybox) from this list, checked with dpkg.
LAB_PKGS=(busybox-static libibverbs1 ibverbs-providers libibverbs-dev)

install_packages() {
	"$here/deps.sh" rdma-lab || die "packages missing (see above)"
	local need=() p
	for p in "${LAB_PKGS[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
	done
	[ ${#need[@]} -eq 0 ] && return 0
	[ "$(id -u)" = 0 ] || die "missing packages ${need[*]}: run as root or install them with apt-get"
	log "installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# The kernel: linux-image-amd64 depends on the versioned image package; download that and
# unpack it (installing it would run initramfs and bootloader hooks for nothing). The .deb
# ships no modules.dep, hence depmod. Once cached, apt is not asked again.
kernel_dir=$cache/kernel
fetch_kernel() {
	if [ -f "$kernel_dir/version" ] && [ -f "$kernel_dir/vmlinux" ]; then
		kver=$(cat "$kernel_dir/version")
		return 0
	fi
	local kpkg tmp
	kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
	if [ -z "$kpkg" ]; then
		[ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null
		kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
	fi
	[ -n "$kpkg" ] || die "apt-cache knows no linux-image-amd64 (apt-get update as root first)"
	kver=${kpkg#linux-image-}
	log "downloading $kpkg"
	tmp=$(mktemp -d "$cache/kernel.XXXXXX")
	chmod 755 "$tmp" # apt-get download runs as _apt where it can
	local sandbox=()
	[ "$(id -u)" = 0 ] && sandbox=(-o APT::Sandbox::User=root) # _apt cannot write into a private cache
	(cd "$tmp" && apt-get download -qq "${sandbox[@]}" "$kpkg" >/dev/null) || die "apt-get download $kpkg failed"
	dpkg-deb -x "$tmp"/linux-image-*.deb "$tmp/root"
	rm -f "$tmp"/linux-image-*.deb
	/sbin/depmod -b "$tmp/root" "$kver"
	# The bzImage's own xz decompressor is slow under TCG (about 8 s of a 15 s boot): unpack
	# the ELF vmlinux once, as the kernel's scripts/extract-vmlinux does, and boot it by PVH.
	local off
	off=$(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$tmp/root/boot/vmlinuz-$kver" | head -1 | cut -d: -f1)
	if [ -n "$off" ]; then
		tail -c +$((off + 1)) "$tmp/root/boot/vmlinuz-$kver" | xz -dc >"$tmp/vmlinux" 2>/dev/null || true
	fi
	if ! head -c 4 "$tmp/vmlinux" 2>/dev/null | grep -q ELF; then
		log "no ELF vmlinux in the bzImage: booting the bzImage (slower)"
		cp "$tmp/root/boot/vmlinuz-$kver" "$tmp/vmlinux"
	fi
	echo "$kver" >"$tmp/version"
	rm -rf "$kernel_dir"
	mv "$tmp" "$kernel_dir"
}

# What the guest runs first. Reads /lab/env (REPO) and runs /lab/cmd; writes /lab/rc.
guest_init() {
	cat <<'INIT'
#!/bin/sh
export PATH=/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t tmpfs -o mode=1777 shm /dev/shm
say() { echo "rdma-lab-guest: $*"; }
halt() { sync; poweroff -f; sleep 10; }
fail() { say "FAIL: $*"; halt; }
say "kernel $(uname -r), /init at $(cut -d' ' -f1 /proc/uptime)s"
for m in virtio_pci 9pnet_virtio 9p; do modprobe $m || fail "modprobe $m"; done
mkdir -p /lab
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 lab /lab || fail "mount lab"
. /lab/env
mkdir -p "$REPO"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose repo "$REPO" || fail "mount repo $REPO"
for m in crc32_generic crc32-pclmul ib_uverbs rdma_rxe veth; do modprobe $m || fail "modprobe $m"; done
# Debian's static busybox prefers its applets to PATH, and its ip cannot make veths or rules.
ip() { /usr/bin/ip "$@"; }
ip link set lo up
# Two "hosts" in one guest: rxe0 and rxe1 on the ends of one veth pair. Their addresses are
# local to each other, so the local table would turn RoCE traffic back through lo; policy
# rules ahead of the local table send each address out of the other end of the pair.
ip link add rxenet0 type veth peer name rxenet1 || fail "veth"
for i in 0 1; do
	ip addr add 10.77.0.$((i + 1))/24 dev rxenet$i
	ip link set rxenet$i up
done
for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 >"$f"; done
for f in /proc/sys/net/ipv4/conf/*/accept_local; do echo 1 >"$f"; done
ip rule add pref 10 to 10.77.0.2 iif lo lookup 100
ip route add 10.77.0.2 dev rxenet0 src 10.77.0.1 table 100
ip rule add pref 11 to 10.77.0.1 iif lo lookup 101
ip route add 10.77.0.1 dev rxenet1 src 10.77.0.2 table 101
ip rule add pref 100 lookup local
ip rule del pref 0 lookup local
rdma link add rxe0 type rxe netdev rxenet0 || fail "rdma link add rxe0"
rdma link add rxe1 type rxe netdev rxenet1 || fail "rdma link add rxe1"
for d in rxe0 rxe1; do
	# the IPv4-mapped GID appears when the address is seen by rxe; wait for it briefly
	n=0
	until grep -q '^0000:0000:0000:0000:0000:ffff:' /sys/class/infiniband/$d/ports/1/gids/* 2>/dev/null; do
		n=$((n + 1)); [ $n -gt 50 ] && fail "$d: no IPv4-mapped GID"; sleep 0.1
	done
done
ulimit -l unlimited
export HOME=/root A2A_RDMA_LAB=1 PATH="$REPO/bin:/usr/bin:/usr/sbin"
say "ready at $(cut -d' ' -f1 /proc/uptime)s"
echo "rdma-lab-guest: ---- CMD ----"
cd "$REPO" && sh /lab/cmd </dev/null
rc=$?
echo "rdma-lab-guest: ---- END rc=$rc at $(cut -d' ' -f1 /proc/uptime)s ----"
echo $rc >/lab/rc
cd /
umount "$REPO" /lab
halt
INIT
}

# The files the initramfs carries: host path, guest path (same unless given).
lab_files() {
	local f
	echo "/bin/busybox /usr/bin/busybox"
	for f in /usr/bin/ip /sbin/ip /usr/sbin/ip; do [ -x "$f" ] && { echo "$f /usr/bin/ip"; break; }; done
	for f in /usr/bin/rdma /sbin/rdma /usr/sbin/rdma; do [ -x "$f" ] && { echo "$f /usr/bin/rdma"; break; }; done
	echo "/usr/bin/ibv_devinfo /usr/bin/ibv_devinfo"
	echo "/usr/bin/ibv_devices /usr/bin/ibv_devices"
	echo "/usr/bin/ib_write_bw /usr/bin/ib_write_bw"
	echo "/usr/bin/ib_write_lat /usr/bin/ib_write_lat"
	echo "/etc/libibverbs.d/rxe.driver /etc/libibverbs.d/rxe.driver"
	# dlopen'ed by the verbs binding and by libibverbs: ldd of a Go binary does not list them
	for f in /usr/lib/x86_64-linux-gnu/libibverbs.so.1 /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so; do
		echo "$(readlink -f "$f") $f"
	done
	# glibc for any dynamically linked (cgo) program built on the host
	for f in /lib64/ld-linux-x86-64.so.2 /usr/lib/x86_64-linux-gnu/{libc,libm,libdl,libpthread,librt,libresolv,libanl,libutil,libnss_files,libnss_dns}.so.* \
		/usr/lib/x86_64-linux-gnu/libgcc_s.so.1; do
		[ -e "$f" ] && echo "$(readlink -f "$f") $f"
	done
	# every library ldd lists for the above
	{ ldd /usr/bin/ip /usr/bin/rdma /usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/ib_write_bw /usr/bin/ib_write_lat \
		/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null || true; } |
		awk '/^\t/ { for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' | sort -u | while read -r f; do echo "$(readlink -f "$f") $f"; done
}

lab_modules="crc32_generic crc32-pclmul rdma_rxe ib_uverbs veth 9p 9pnet_virtio virtio_pci"

# module file paths (relative to the modules dir) for $lab_modules and their dependencies
lab_module_files() {
	local moddir=$1 m
	for m in $lab_modules; do
		awk -F: -v m="${m//-/_}" '{ n = $1; sub(/.*\//, "", n); sub(/\.ko.*$/, "", n); gsub(/-/, "_", n)
			if (n == m) { print $1; k = split($2, d, " "); for (i = 1; i <= k; i++) print d[i]; found = 1; exit } }
			END { if (!found) print "builtin:" m }' "$moddir/modules.dep"
	done | sort -u
}

initrd=$cache/initrd.cpio.gz
build_initrd() {
	local moddir=$kernel_dir/root/lib/modules/$kver stamp files mods
	files=$(lab_files | sort -u)
	mods=$(lab_module_files "$moddir")
	stamp=$({
		echo "$kver"
		cat "$self"
		echo "$files"
		echo "$mods"
		echo "$files" | awk '{print $1}' | xargs sha256sum
	} | sha256sum | cut -d' ' -f1)
	if [ -f "$initrd" ] && [ "$(cat "$cache/initrd.stamp" 2>/dev/null)" = "$stamp" ]; then
		return 0
	fi
	log "building initramfs ($kver)"
	local r src dst m
	r=$(mktemp -d "$cache/root.XXXXXX")
	mkdir -p "$r"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc/libibverbs.d,proc,sys,dev,tmp,run,root,lab}
	ln -s usr/bin "$r/bin"
	ln -s usr/sbin "$r/sbin"
	ln -s usr/lib "$r/lib"
	ln -s usr/lib64 "$r/lib64"
	while read -r src dst; do
		mkdir -p "$r$(dirname "$dst")"
		cp -L "$src" "$r$dst"
	done <<<"$files"
	for m in $("$r/usr/bin/busybox" --list); do
		[ -e "$r/usr/bin/$m" ] || ln -s busybox "$r/usr/bin/$m"
	done
	while read -r m; do
		case $m in
		builtin:*)
			grep -q "/${m#builtin:}.ko" "$moddir/modules.builtin" ||
				log "warning: module ${m#builtin:} neither a module nor built in"
			;;
		*)
			mkdir -p "$r/lib/modules/$kver/$(dirname "$m")"
			cp "$moddir/$m" "$r/lib/modules/$kver/$m"
			;;
		esac
	done <<<"$mods"
	cp "$moddir"/modules.{order,builtin,builtin.modinfo} "$r/lib/modules/$kver/"
	/sbin/depmod -b "$r" "$kver"
	printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
	printf 'root:x:0:\n' >"$r/etc/group"
	printf '127.0.0.1 localhost\n::1 localhost\n10.77.0.1 rxenet0\n10.77.0.2 rxenet1\n' >"$r/etc/hosts"
	printf 'hosts: files dns\n' >"$r/etc/nsswitch.conf"
	guest_init >"$r/init"
	chmod +x "$r/init"
	(cd "$r" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$initrd.tmp"
	mv "$initrd.tmp" "$initrd"
	echo "$stamp" >"$cache/initrd.stamp"
	rm -rf "$r"
	log "initramfs $(du -h "$initrd" | cut -f1)"
}

setup() {
	mkdir -p "$cache"
	install_packages
	fetch_kernel
	build_initrd
}

run() {
	[ $# -gt 0 ] || usage
	setup
	local run_dir rc start end q v
	run_dir=$(mktemp -d "${TMPDIR:-/tmp}/a2a-rdma-lab.XXXXXX")
	# shellcheck disable=SC2064
	trap "[ '${A2A_LAB_KEEP:-0}' = 1 ] && log 'kept $run_dir' || rm -rf '$run_dir'" EXIT
	printf 'REPO=%q\n' "$repo" >"$run_dir/env"
	{
		while IFS= read -r v; do
			case $v in A2A_LAB_*) continue ;; esac
			printf 'export %s=%q\n' "$v" "${!v}"
		done < <(compgen -e | grep '^A2A_' || true)
		printf 'exec'
		for q in "$@"; do printf ' %q' "$q"; done
		printf '\n'
	} >"$run_dir/cmd"
	local acc=(-accel tcg,thread=multi -cpu max)
	[ "$accel" = kvm ] && acc=(-enable-kvm -cpu host)
	start=$(date +%s.%N)
	# The serial console (the guest's output) goes to a file, shown live from the CMD marker
	# on; qemu runs in the background so that INT/TERM stop it (timeout passes them on).
	: >"$run_dir/console.log"
	timeout "$timeout_s" qemu-system-x86_64 "${acc[@]}" -m "$mem" -smp "$smp" \
		-display none -monitor none -serial "file:$run_dir/console.log" -no-reboot -nic none \
		-kernel "$kernel_dir/vmlinux" -initrd "$initrd" \
		-append "console=ttyS0 panic=-1 loglevel=3 mitigations=off" \
		-virtfs "local,path=$repo,mount_tag=repo,security_model=none,id=repo" \
		-virtfs "local,path=$run_dir,mount_tag=lab,security_model=none,id=lab" \
		</dev/null >"$run_dir/qemu.log" 2>&1 &
	local qpid=$! qrc
	trap 'kill -TERM $qpid 2>/dev/null; wait $qpid; exit 130' INT TERM
	tail -s 0.2 -n +1 -F --pid="$qpid" "$run_dir/console.log" 2>/dev/null |
		awk -v all="${A2A_LAB_VERBOSE:-0}" '
			{ sub(/\r$/, "") }
			/^rdma-lab-guest: ---- CMD ----$/ { on = 1; next }
			/^rdma-lab-guest: ---- END / { on = 0 }
			on || all == 1 { print; fflush() }' &
	local shown=$!
	set +e
	wait "$qpid"
	qrc=$?
	wait "$shown"
	set -e
	trap - INT TERM
	end=$(date +%s.%N)
	log "qemu $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s, $(grep -ao 'ready at [0-9.]*s' "$run_dir/console.log" || echo 'not ready')"
	if [ -f "$run_dir/rc" ]; then
		rc=$(cat "$run_dir/rc")
		[ "$rc" = 0 ] || log "CMD exited with status $rc"
		exit "$rc"
	fi
	if [ "$qrc" = 124 ]; then
		log "timed out after ${timeout_s}s (A2A_LAB_TIMEOUT); last lines of the guest:"
		rc=124
	else
		log "no exit status from the guest (qemu status $qrc); last lines of the guest:"
		rc=125
	fi
	sed 's/^/  qemu: /' "$run_dir/qemu.log" >&2
	tail -n 40 "$run_dir/console.log" | tr -d '\r' | sed 's/^/  | /' >&2
	exit "$rc"
}

case ${1:-} in
setup) setup ;;
run)
	shift
	while [ $# -gt 0 ]; do
		case $1 in
		--timeout)
			timeout_s=$2
			shift 2
			;;
		--) shift; break ;;
		*) usage ;;
		esac
	done
	run "$@"
	;;
*) usage ;;
esac
