#!/usr/bin/env bash
# Scenario 001: the same VM disk (a sparse raw vmsan volume) on ext4, xfs and
# btrfs, in each cache mode (none = O_DIRECT, writethrough, writeback),
# measured with `vmsan bench --profile cdm-legacy` (CrystalDiskMark 3 rows)
# and `--profile gnome-disks --write` (GNOME Disks rows).
#
# Each filesystem is a sparse image on a loop device; one `vmsan serve` per
# filesystem exports three volumes, one per cache mode. The benchmark runs on
# the host against the NBD export (nbd://), not inside a QEMU guest: a TCG
# guest on this 2-core machine would spend the 10-minute budget emulating
# the CPU. What differs from a guest: no guest page cache or guest block
# layer (no read-ahead, no request merging in the guest), and the client is
# vmsan's own NBD client with up to 4 connections instead of virtio-blk.
# The server side (engine, cache mode, filesystem, sparse file) is the same.
#
# Sizes are shrunk to fit: a 256 MiB volume, cdm-legacy over 64 MiB with one
# 1-second pass per test, gnome-disks 16 samples of 4 MiB and 200 access
# reads. Small areas partly fit in the host page cache in the buffered modes
# (writethrough/writeback): that is part of what the cache modes are.
#
# Output (scenarios/out/001-filesystems/): summary.md (one table per
# filesystem), per-run text/JSON results, bench's own plots (PNG) and one
# comparison plot per filesystem and profile.
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"

FILESYSTEMS=${FILESYSTEMS:-ext4 xfs btrfs}
CACHES=(none writethrough writeback)
OUT=$SCEN_OUT/001-filesystems
VOLSIZE=${VOLSIZE:-256M}
CDM_ARGS=(--size 64M --passes 1 --pass-time 1s --warmup 0.3s)
GNOME_ARGS=(--write --samples 16 --sample-size 4M --access-reads 200)

need_root "loop-mounted filesystems"
need_tools curl:curl losetup:mount mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs mkfs.btrfs:btrfs-progs go:golang-go
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.json "$OUT"/*.png "$OUT/summary.md"
build_vmsan

declare -A MKFS_ARGS=([ext4]="-q -F" [xfs]="-q -f" [btrfs]="-q -f")

# cdm_rows FILE: CrystalDiskMark 3 text output -> seed-style "R W" rows.
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
	loop_fs "mkfs.$fs" "$w/$fs.img" "$w/mnt" 2G ${MKFS_ARGS[$fs]}
	nbd=$(free_port); met=$(free_port)
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
		log "$fs cache=$c: cdm-legacy"
		"$VMSAN" bench -q --profile cdm-legacy "${CDM_ARGS[@]}" --force -o "$OUT/$fs-$c-cdm.json" \
			--plot "$OUT/$fs-$c-cdm.png" "$uri" >"$OUT/$fs-$c-cdm.txt" 2>&1 || die "bench failed: $OUT/$fs-$c-cdm.txt"
		log "$fs cache=$c: gnome-disks"
		"$VMSAN" bench -q --profile gnome-disks "${GNOME_ARGS[@]}" --force -o "$OUT/$fs-$c-gnome.json" \
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
	echo "vmsan bench from the host against nbd:// (MB/s; CDM rows are \"read write\"); volume $VOLSIZE sparse raw on a loop-mounted 2 GiB image."
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
