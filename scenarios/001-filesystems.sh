#!/usr/bin/env bash
# Scenario 001: the same VM disk (a sparse raw vmsan volume) on ext4, xfs and
# btrfs, in each cache mode (none = O_DIRECT, writethrough, writeback),
# measured with `vmsan bench --profile cdm-legacy` (CrystalDiskMark 3 rows)
# and `--profile gnome-disks --write` (GNOME Disks rows).
#
# Each filesystem is a sparse image on a loop device; one `vmsan serve` per
# filesystem exports three volumes, one per cache mode.
#
# MODE=guest (default): for each volume a QEMU TCG guest boots the busybox
# initramfs of scripts/guest/build.sh with a static vmsan binary and
# scenarios/guest/bench-init added (a second cpio archive appended to the
# first), the volume attached as a virtio disk (QEMU's NBD client,
# cache=none), and runs both profiles on /dev/vda with --direct. CPU-bound
# rows (4K at QD1 above all) then measure the emulated CPU as much as the
# disk: compare rows across filesystems and cache modes, not against the
# host.
# MODE=host: `vmsan bench` runs on the host against nbd:// (vmsan's own NBD
# client, up to 4 connections); no guest page cache or block layer, no
# virtio, bigger sizes. Quicker, and the fallback where QEMU is unusable.
#
# Sizes are shrunk so that the whole script fits in 10 minutes on 2 busy
# cores (see CDM_ARGS/GNOME_ARGS below). In host mode, buffered cache modes
# (writethrough/writeback) serve small areas from the host page cache: that
# is part of what the cache modes are.
#
# Output (scenarios/out/001-filesystems/): summary.md (one table per
# filesystem), per-run text and JSON results, and one comparison plot per
# filesystem and profile (`vmsan bench compare --plot`: bars per row, and
# for gnome-disks the rate-versus-position curves).
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"

FILESYSTEMS=${FILESYSTEMS:-ext4 xfs btrfs}
CACHES=(none writethrough writeback)
OUT=$SCEN_OUT/001-filesystems
MODE=${MODE:-guest}
VOLSIZE=${VOLSIZE:-1G}
if [ "$MODE" = guest ]; then
	CDM_ARGS=(--size 64M --passes 1 --pass-time 2s --warmup 0.3s)
	GNOME_ARGS=(--write --samples 16 --sample-size 4M --access-reads 200)
else
	CDM_ARGS=(--size 256M --passes 1 --pass-time 2s --warmup 0.5s)
	GNOME_ARGS=(--write --samples 32 --sample-size 8M --access-reads 500)
fi

need_root "loop-mounted filesystems"
need_tools curl:curl losetup:mount mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs mkfs.btrfs:btrfs-progs go:golang-go
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.json "$OUT"/*.png "$OUT"/*.log "$OUT/summary.md"
build_vmsan

case "$MODE" in
guest)
	need_tools qemu-system-x86_64:qemu-system-x86 cpio:cpio gzip:gzip
	"$SCEN_ROOT/scripts/guest/build.sh" >&2
	GUEST=$SCEN_OUT/guest
	rm -rf "$GUEST"; mkdir -p "$GUEST/root/bin"
	log "building a static vmsan for the guest"
	(cd "$SCEN_ROOT" && CGO_ENABLED=0 go build -ldflags='-s -w' -o "$GUEST/root/bin/vmsan" ./cmd/vmsan)
	install -m 755 "$SCEN_ROOT/scenarios/guest/bench-init" "$GUEST/root/init"
	# The kernel unpacks concatenated archives in order: ours replaces /init.
	(cd "$GUEST/root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -1) >"$GUEST/overlay.gz"
	cat "$SCEN_ROOT/.cache/guest/initramfs.gz" "$GUEST/overlay.gz" >"$GUEST/initrd.gz"
	;;
host) ;;
*) die "MODE must be guest or host" ;;
esac

# section NAME FILE: the lines between the guest's BEGIN and END markers.
section() {
	tr -d '\r' <"$2" | awk -v b="VMSAN-$1-BEGIN" -v e="VMSAN-$1-END" '$0 ~ e { p=0 } p { print } $0 ~ b { p=1 }'
}

# bench_guest URI FS CACHE: one guest boot, both profiles.
bench_guest() {
	local uri=$1 fs=$2 c=$3 cdm gnome
	cdm=$(IFS=,; echo "${CDM_ARGS[*]}")
	gnome=$(IFS=,; echo "${GNOME_ARGS[*]}")
	child timeout 300 qemu-system-x86_64 -accel tcg -m 512 -nographic -no-reboot -nic none \
		-kernel "$SCEN_ROOT/.cache/guest/vmlinuz" -initrd "$GUEST/initrd.gz" \
		-append "console=ttyS0 panic=-1 quiet vmsan.cdm=$cdm vmsan.gnome=$gnome" \
		-drive "file=$uri,format=raw,if=virtio,cache=none" </dev/null >"$OUT/$fs-$c-console.txt" 2>&1 ||
		die "$fs cache=$c: guest failed (see $OUT/$fs-$c-console.txt)"
	section BENCH-cdm "$OUT/$fs-$c-console.txt" >"$OUT/$fs-$c-cdm.txt"
	section BENCH-gnome "$OUT/$fs-$c-console.txt" >"$OUT/$fs-$c-gnome.txt"
	section JSON-cdm "$OUT/$fs-$c-console.txt" >"$OUT/$fs-$c-cdm.json"
	section JSON-gnome "$OUT/$fs-$c-console.txt" >"$OUT/$fs-$c-gnome.json"
	grep -q 'Sequential Read' "$OUT/$fs-$c-cdm.txt" && grep -q 'Avg Read' "$OUT/$fs-$c-gnome.txt" ||
		die "$fs cache=$c: no bench results from the guest (see $OUT/$fs-$c-console.txt)"
}

declare -A MKFS_ARGS=([ext4]="-q -F" [xfs]="-q -f" [btrfs]="-q -f")

# cdm_rows FILE: CrystalDiskMark 3 text output -> "read write" rows per test, as CrystalDiskMark's two columns.
cdm_rows() {
	awk -F' : *' '
		/Sequential Read/ { sr=$2 } /Sequential Write/ { sw=$2 }
		/Random Read 512KB/ { r5=$2 } /Random Write 512KB/ { w5=$2 }
		/Random Read 4KB \(QD=1\)/ { r4=$2 } /Random Write 4KB \(QD=1\)/ { w4=$2 }
		/Random Read 4KB \(QD=32\)/ { r32=$2 } /Random Write 4KB \(QD=32\)/ { w32=$2 }
		function v(s) { split(s, a, " "); return a[1] }
		END {
			printf "seq\t%s %s\n", v(sr), v(sw)
			printf "512k\t%s %s\n", v(r5), v(w5)
			printf "4K\t%s %s\n", v(r4), v(w4)
			printf "4K QD32\t%s %s\n", v(r32), v(w32)
		}' "$1"
}

# gnome_rows FILE: the GNOME Disks lines, "Label<TAB>value".
gnome_rows() {
	grep -E '^(Min|Max|Avg|AVG) ' "$1" | sed -E 's/: */\t/; s/ MB\/s$//'
}

start=$(date +%s)
for fs in $FILESYSTEMS; do
	workdir; w=$WORKDIR
	# shellcheck disable=SC2086
	loop_fs "mkfs.$fs" "$w/$fs.img" "$w/mnt" 8G ${MKFS_ARGS[$fs]}
	free_port; nbd=$PORT; free_port; met=$PORT
	{
		echo "data_dir: $w/mnt/data"
		echo "listen: [127.0.0.1:$nbd]"
		echo "metrics_listen: 127.0.0.1:$met"
		echo "no_default_volume: true"
		echo "volumes:"
		for c in "${CACHES[@]}"; do printf '  - name: vm-%s\n    size: %s\n    cache: %s\n' "$c" "$VOLSIZE" "$c"; done
	} >"$w/serve.yaml"
	"$VMSAN" serve --config "$w/serve.yaml" >"$OUT/$fs-serve.log" 2>&1 &
	pid=$!; _pids+=("$pid")
	wait_http "http://127.0.0.1:$met/metrics" 30 || die "$fs: vmsan serve did not start (see $OUT/$fs-serve.log)"
	log "$fs: serving on 127.0.0.1:$nbd (load $(loadavg))"
	echo "$(loadavg)" >"$OUT/$fs-load.txt"
	for c in "${CACHES[@]}"; do
		uri="nbd://127.0.0.1:$nbd/vm-$c"
		if [ "$MODE" = guest ]; then
			log "$fs cache=$c: guest boot, cdm-legacy and gnome-disks on /dev/vda"
			bench_guest "$uri" "$fs" "$c"
			continue
		fi
		log "$fs cache=$c: cdm-legacy"
		child "$VMSAN" bench -q --profile cdm-legacy "${CDM_ARGS[@]}" --force -o "$OUT/$fs-$c-cdm.json" \
			--plot "$OUT/$fs-$c-cdm.png" "$uri" >"$OUT/$fs-$c-cdm.txt" 2>&1 || die "bench failed: $OUT/$fs-$c-cdm.txt"
		log "$fs cache=$c: gnome-disks"
		child "$VMSAN" bench -q --profile gnome-disks "${GNOME_ARGS[@]}" --force -o "$OUT/$fs-$c-gnome.json" \
			--plot "$OUT/$fs-$c-gnome.png" "$uri" >"$OUT/$fs-$c-gnome.txt" 2>&1 || die "bench failed: $OUT/$fs-$c-gnome.txt"
	done
	for p in cdm gnome; do
		"$VMSAN" bench compare --plot "$OUT/$fs-$p-compare.png" \
			"$OUT/$fs-none-$p.json" "$OUT/$fs-writethrough-$p.json" "$OUT/$fs-writeback-$p.json" \
			>"$OUT/$fs-$p-compare.txt" 2>&1 || log "$fs: bench compare $p failed"
	done
	kill "$pid"; wait "$pid" 2>/dev/null || true
	umount "$w/mnt"
done

{
	echo "## 001-filesystems ($(date -u '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - start )) s)"
	echo
	if [ "$MODE" = guest ]; then
		echo "vmsan bench --direct on /dev/vda inside a QEMU TCG guest (virtio-blk, QEMU NBD client, cache=none); MB/s, CDM rows are \"read write\"; volume $VOLSIZE sparse raw on a loop-mounted 8 GiB sparse image."
	else
		echo "vmsan bench from the host against nbd:// (MB/s; CDM rows are \"read write\"); volume $VOLSIZE sparse raw on a loop-mounted 8 GiB sparse image."
	fi
	echo "cdm-legacy: ${CDM_ARGS[*]}; gnome-disks: ${GNOME_ARGS[*]}."
	for fs in $FILESYSTEMS; do
		echo
		echo "### $fs (load average at start: $(cat "$OUT/$fs-load.txt"))"
		echo
		echo "| | cache=none | cache=writethrough | cache=writeback |"
		echo "|---|---|---|---|"
		paste <(cdm_rows "$OUT/$fs-none-cdm.txt"; gnome_rows "$OUT/$fs-none-gnome.txt") \
			<(cdm_rows "$OUT/$fs-writethrough-cdm.txt"; gnome_rows "$OUT/$fs-writethrough-gnome.txt") \
			<(cdm_rows "$OUT/$fs-writeback-cdm.txt"; gnome_rows "$OUT/$fs-writeback-gnome.txt") |
			awk -F'\t' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $4, $6 }'
	done
} >"$OUT/summary.md"
cat "$OUT/summary.md"
