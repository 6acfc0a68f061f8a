#!/usr/bin/env bash
# Build the tiny QEMU guest used by tests/interop: a Debian cloud kernel plus a
# busybox initramfs whose /init exercises the virtio disk (see scripts/guest/init).
#
# Usage: scripts/guest/build.sh [--iscsi] [OUTDIR]
#                               (default: <repo>/.cache/guest, or
#                                <repo>/.cache/guest-iscsi with --iscsi)
#
# --iscsi builds the initiator flavour instead (used by tests/iscsiguest and
# scenario 000): the same kernel and busybox plus the SCSI, iSCSI,
# device-mapper multipath and virtio-net modules, the host's Debian binaries
# of open-iscsi (iscsiadm, iscsid), multipath-tools (multipath, multipathd,
# mpathpersist, their checker/prioritizer plugins), dmsetup, sg3-utils
# (sg_inq, sg_vpd, sg_persist, sg_rtpg, ...) and bonnie++, each with the
# libraries ldd names, and scripts/guest/init-iscsi as /init. The default
# flavour is untouched by it (a separate output directory and stamp), so the
# virtio tests keep their small, fast initramfs. The initiator packages must
# be installed on the build host (they are in the Makefile's APT_PKGS); their
# daemons are only ever started inside the guest.
#
# GUEST_KERNEL=generic takes Debian's generic kernel (linux-image-6.1.0-N-amd64,
# a 70 MB download and a slower build; it boots to the test in about 8 s
# under TCG against 6 s) instead of the
# cloud one, into <repo>/.cache/guest-generic or guest-iscsi-generic by
# default: it has CONFIG_SCSI_DH and so scsi_dh_alua, the kernel side of
# ALUA that Debian hosts run.
#
# Outputs in OUTDIR:
#   vmlinuz        the kernel (Debian linux-image-6.1.0-N-cloud-amd64, newest available)
#   initramfs.gz   gzip'd newc cpio: busybox-static, the virtio modules that the
#                  cloud kernel builds as modules, /init and /pattern.bin
#   pattern.bin    the 4 MiB random pattern the guest writes (the host test
#                  compares the exported volume against this file)
#   stamp          inputs the build was made from; when it matches, the script
#                  exits immediately (idempotent, cheap to call from `make test`)
#
# Needs: apt-get (Debian), dpkg, cpio, gzip, busybox-static. As root it installs
# missing busybox-static/cpio itself.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
flavour=default
if [ "${1:-}" = --iscsi ]; then
	flavour=iscsi
	shift
fi
kflavour=${GUEST_KERNEL:-cloud}
case "$kflavour" in
cloud) kre='-cloud-amd64' ;;
generic) kre='-amd64' ;;
*) echo "build.sh: GUEST_KERNEL must be cloud or generic" >&2; exit 1 ;;
esac
if [ "$flavour" = iscsi ]; then
	name=guest-iscsi
	init_src=$here/init-iscsi
else
	name=guest
	init_src=$here/init
fi
[ "$kflavour" = generic ] && name=$name-generic
out=${1:-$repo/.cache/$name}
mkdir -p "$out"
# Keep the cache out of git without touching the repo's .gitignore.
[ -f "$repo/.cache/.gitignore" ] || { mkdir -p "$repo/.cache" && echo '*' > "$repo/.cache/.gitignore"; }

need_pkg() { # need_pkg CMD PKG
	if ! command -v "$1" >/dev/null 2>&1 && [ ! -x "$1" ]; then
		if [ "$(id -u)" = 0 ]; then
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null
		else
			echo "build.sh: missing $1 (apt-get install $2)" >&2; exit 1
		fi
	fi
}
need_pkg cpio cpio
need_pkg /bin/busybox busybox-static
busybox=/bin/busybox
if ! file -L "$busybox" 2>/dev/null | grep -q 'statically linked'; then
	# Without `file`, trust the package: busybox-static ships /bin/busybox static.
	command -v file >/dev/null 2>&1 && { echo "build.sh: $busybox is not static (install busybox-static)" >&2; exit 1; }
fi

# Newest 6.1 kernel package of that flavour known to apt. apt-cache needs lists: update once if empty.
pick_kernel() {
	apt-cache search --names-only "^linux-image-6\\.1\\.0-[0-9]+$kre\$" 2>/dev/null |
		awk '{print $1}' | sort -V | tail -1
}
kpkg=$(pick_kernel)
if [ -z "$kpkg" ]; then
	[ "$(id -u)" = 0 ] && apt-get update -q >/dev/null
	kpkg=$(pick_kernel)
fi
[ -n "$kpkg" ] || { echo "build.sh: no linux-image-6.1.0-*$kre in apt" >&2; exit 1; }

# Host programs the iSCSI flavour copies (see iscsi_files below).
ISCSI_BINS="iscsiadm iscsid multipath multipathd mpathpersist dmsetup sg_inq sg_vpd sg_persist sg_rtpg sg_turs sg_readcap sg_luns sg_reset bonnie++"
ISCSI_PKGS="open-iscsi multipath-tools sg3-utils dmsetup bonnie++"
stamp="kernel=$kpkg init=$(sha256sum "$init_src" | cut -c1-16) script=$(sha256sum "$0" | cut -c1-16)"
if [ "$flavour" = iscsi ]; then
	for b in $ISCSI_BINS; do
		command -v "$b" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$b" >/dev/null 2>&1 ||
			{ echo "build.sh: --iscsi needs $b on the host (apt-get install $ISCSI_PKGS)" >&2; exit 1; }
	done
	# The copied binaries are part of the input: a package upgrade rebuilds.
	stamp="$stamp flavour=iscsi pkgs=$(dpkg-query -W -f='${Package}=${Version},' $ISCSI_PKGS 2>/dev/null | sha256sum | cut -c1-16)"
fi
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] &&
	[ -s "$out/vmlinuz" ] && [ -s "$out/initramfs.gz" ] && [ -s "$out/pattern.bin" ]; then
	echo "guest up to date in $out ($kpkg)"
	exit 0
fi

# iscsi_files ROOT: copy the initiator programs, the libraries ldd names for
# them and for the plugins they dlopen, the dynamic loader, and the
# configuration skeleton into ROOT. Files keep their host paths so that the
# loader's default search path finds them.
iscsi_files() {
	local r=$1 b p f libs
	mkdir -p "$r/sbin" "$r/etc/iscsi" "$r/run/lock/iscsi" "$r/var/lib" "$r/etc/multipath" "$r/var/tmp"
	libs=()
	for b in $ISCSI_BINS; do
		p=$(PATH=$PATH:/usr/sbin:/sbin command -v "$b")
		p=$(readlink -f "$p")
		cp "$p" "$r/sbin/$b"
		libs+=("$p")
	done
	# multipath-tools' path checkers and prioritizers are dlopen'd plugins.
	for d in /lib/multipath /usr/lib/multipath /lib/x86_64-linux-gnu/multipath /usr/lib/x86_64-linux-gnu/multipath; do
		[ -d "$d" ] || continue
		mkdir -p "$r/lib/multipath"
		for f in "$d"/*.so; do
			cp "$f" "$r/lib/multipath/"
			libs+=("$f")
		done
		break
	done
	for f in $(ldd "${libs[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }' | sort -u); do
		mkdir -p "$r$(dirname "$f")"
		cp -L "$f" "$r$f"
	done
	# iscsid authorizes iscsiadm by the peer's user name (getpwuid), so
	# root must resolve: a passwd file and the files NSS module.
	printf 'root:x:0:0:root:/:/bin/sh\n' >"$r/etc/passwd"
	printf 'root:x:0:\n' >"$r/etc/group"
	printf 'passwd: files\ngroup: files\nhosts: files\n' >"$r/etc/nsswitch.conf"
	for f in /lib/x86_64-linux-gnu/libnss_files.so.2 /usr/lib/x86_64-linux-gnu/libnss_files.so.2; do
		[ -e "$f" ] || continue
		mkdir -p "$r$(dirname "$f")"
		cp -L "$f" "$r$f"
		break
	done
	# The loader also where the ELF interpreter field points.
	mkdir -p "$r/lib64"
	[ -e "$r/lib64/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$r/lib64/"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/vmsan-guest.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q "$kpkg" >/dev/null 2>&1) ||
	{ [ "$(id -u)" = 0 ] && apt-get update -q >/dev/null && (cd "$work" && apt-get download -q "$kpkg"); }
dpkg -x "$work"/"$kpkg"_*.deb "$work/k"
kver=${kpkg#linux-image-}
cp "$work/k/boot/vmlinuz-$kver" "$work/vmlinuz"
config="$work/k/boot/config-$kver"
moddir="$work/k/lib/modules/$kver/kernel"

# Modules: what the disk needs. Anything built in (=y) needs nothing; for =m we
# copy the .ko and its dependencies (read from the module's .modinfo
# "depends=" string, since depmod output is not in the package and kmod may
# be absent), in dependency order, to /modules/NN-name.ko.
mkdir -p "$work/root/modules"
declare -A seen=()
order=()
modpath() { # module names use _ or - interchangeably; files may use either
	local a=${1//_/-} b=${1//-/_}
	find "$moddir" \( -name "$a.ko" -o -name "$b.ko" -o -name "$a.ko.xz" -o -name "$b.ko.xz" -o -name "$a.ko.zst" -o -name "$b.ko.zst" \) | head -1
}
add_mod() {
	local m=$1 p deps d
	[ -n "${seen[${m//-/_}]:-}" ] && return 0
	seen[${m//-/_}]=1
	p=$(modpath "$m")
	[ -n "$p" ] || { echo "build.sh: module $m not found" >&2; exit 1; }
	case "$p" in *.ko) ;; *) echo "build.sh: compressed module $p unsupported (busybox insmod)" >&2; exit 1;; esac
	deps=$(tr '\0' '\n' <"$p" | grep -a '^depends=' | head -1 | cut -d= -f2 | tr ',' ' ')
	for d in $deps; do add_mod "$d"; done
	order+=("$p")
}
for sym in VIRTIO VIRTIO_PCI VIRTIO_BLK; do
	case "$(grep -E "^CONFIG_$sym=" "$config" | cut -d= -f2)" in
	y) ;;
	m) case $sym in VIRTIO) add_mod virtio;; VIRTIO_PCI) add_mod virtio_pci;; VIRTIO_BLK) add_mod virtio_blk;; esac ;;
	*) echo "build.sh: CONFIG_$sym not set in $kver" >&2; exit 1;;
	esac
done
if [ "$flavour" = iscsi ]; then
	# SCSI disks and generic nodes, the iSCSI initiator, device-mapper
	# multipath with its path selectors, and the NIC QEMU's user network
	# gives the guest (-nic user,model=virtio-net-pci). CRC32C (digests) is
	# built into the cloud kernel. scsi_dh_alua only where the kernel has
	# CONFIG_SCSI_DH (the cloud kernel does not: multipath-tools then runs
	# ALUA priorities from user space, and the dm table still names the
	# handler).
	for m in sd_mod sg iscsi_tcp dm_multipath dm_round_robin dm_service_time dm_queue_length virtio_net; do
		add_mod "$m"
	done
	# iscsi_tcp asks the crypto API for "crc32c" when it sets up a
	# connection; busybox has no module autoloading, so where CRC32C is a
	# module (the generic kernel) it is loaded up front.
	if [ "$(grep -E '^CONFIG_CRYPTO_CRC32C=' "$config" | cut -d= -f2)" = m ]; then add_mod crc32c_generic; fi
	if [ -n "$(modpath scsi_dh_alua)" ]; then add_mod scsi_dh_alua; fi
fi
i=10
for p in "${order[@]}"; do
	cp "$p" "$work/root/modules/$i-$(basename "$p")"
	i=$((i + 1))
done

# initramfs tree
r="$work/root"
mkdir -p "$r/bin" "$r/sbin" "$r/dev" "$r/proc" "$r/sys" "$r/tmp"
cp "$busybox" "$r/bin/busybox"
for app in sh mount umount insmod dd cmp sync sleep cat echo poweroff ls grep sed head tr wc date mkdir seq; do
	ln -s busybox "$r/bin/$app"
done
cp "$init_src" "$r/init"
chmod 755 "$r/init"
if [ "$flavour" = iscsi ]; then
	for app in ip ifconfig route ps kill killall blkdiscard blockdev cut awk xargs stat hexdump od \
		find readlink basename dirname tail rm cp mv ln timeout env uname lsscsi mknod sort uniq expr test '[' true false printf; do
		[ -e "$r/bin/$app" ] || ln -s busybox "$r/bin/$app"
	done
	iscsi_files "$r"
fi
head -c $((4 << 20)) /dev/urandom >"$work/pattern.bin"
cp "$work/pattern.bin" "$r/pattern.bin"
(cd "$r" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -6 >"$work/initramfs.gz"

mv "$work/vmlinuz" "$out/vmlinuz"
mv "$work/initramfs.gz" "$out/initramfs.gz"
mv "$work/pattern.bin" "$out/pattern.bin"
echo "$stamp" >"$out/stamp"
echo "guest built in $out ($kpkg, modules: ${order[*]##*/})"
