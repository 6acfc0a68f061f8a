#!/usr/bin/env bash
# Build the tiny QEMU guest used by tests/interop: a Debian cloud kernel plus a
# busybox initramfs whose /init exercises the virtio disk (see scripts/guest/init).
#
# Usage: scripts/guest/build.sh [OUTDIR]      (default: <repo>/.cache/guest)
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
out=${1:-$repo/.cache/guest}
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

# Newest 6.1 cloud kernel package known to apt. apt-cache needs lists: update once if empty.
pick_kernel() {
	apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-cloud-amd64$' 2>/dev/null |
		awk '{print $1}' | sort -V | tail -1
}
kpkg=$(pick_kernel)
if [ -z "$kpkg" ]; then
	[ "$(id -u)" = 0 ] && apt-get update -q >/dev/null
	kpkg=$(pick_kernel)
fi
[ -n "$kpkg" ] || { echo "build.sh: no linux-image-6.1.0-*-cloud-amd64 in apt" >&2; exit 1; }

stamp="kernel=$kpkg init=$(sha256sum "$here/init" | cut -c1-16) script=$(sha256sum "$0" | cut -c1-16)"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] &&
	[ -s "$out/vmlinuz" ] && [ -s "$out/initramfs.gz" ] && [ -s "$out/pattern.bin" ]; then
	echo "guest up to date in $out ($kpkg)"
	exit 0
fi

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
modpath() { find "$moddir" -name "$1.ko" -o -name "$1.ko.xz" -o -name "$1.ko.zst" | head -1; }
add_mod() {
	local m=$1 p deps d
	[ -n "${seen[$m]:-}" ] && return 0
	seen[$m]=1
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
cp "$here/init" "$r/init"
chmod 755 "$r/init"
head -c $((4 << 20)) /dev/urandom >"$work/pattern.bin"
cp "$work/pattern.bin" "$r/pattern.bin"
(cd "$r" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -6 >"$work/initramfs.gz"

mv "$work/vmlinuz" "$out/vmlinuz"
mv "$work/initramfs.gz" "$out/initramfs.gz"
mv "$work/pattern.bin" "$out/pattern.bin"
echo "$stamp" >"$out/stamp"
echo "guest built in $out ($kpkg, modules: ${order[*]##*/})"
