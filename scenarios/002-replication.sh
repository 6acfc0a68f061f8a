#!/usr/bin/env bash
# Scenario 002: a replicated pair whose secondary sits on a slow disk, and a
# QEMU guest whose disk is the primary's export copying a tree of small
# files (`cp -a`, many 4 KiB writes), run three times:
#
#   reference   the primary alone, the volume not replicated: what the
#               client does when storage is not its limit (REFERENCE=0
#               skips it)
#   default     vmsan's defaults: the secondary applies the replication
#               stream through its I/O engine, which merges adjacent writes
#   diagnostic  the secondary's engine with merging and write gathering
#               off and 16 workers (engine.max_merge: 4K, gather_delay: -1ms,
#               workers: 16): every 4 KiB write is its own backend call, the
#               way a secondary that does not merge behaves. This is a
#               diagnostic to show the small-write penalty, not a tuning.
#
# The slow disk: the secondary's data directory is an ext4 image on a loop
# device, and the secondary process runs in a block-I/O cgroup that caps
# writes to that loop device (SLOW_IOPS operations/s and SLOW_BPS bytes/s,
# like a single SATA disk); volumes use cache=none (O_DIRECT), so every
# backend write passes the throttle in the daemon's own context.
#
# The client (CLIENT=guest, the default): a QEMU TCG guest booting the
# busybox initramfs of scripts/guest/build.sh with scenarios/guest/cp-init
# and the host's mke2fs added. /dev/vda is the primary's export (QEMU's NBD
# client, virtio-blk, cache=none); /dev/vdb is a read-only ext4 image built
# here with `mke2fs -d` holding FILES files of 4 KiB in directories of 300.
# The guest makes an ext4 filesystem on vda, mounts it, runs
# `cp -a /src/tree /dst/` and `sync`, with small dirty limits so that cp
# runs at the rate the disk takes. MAX_KB=4 (default): the guest's vda
# max_sectors_kb is 4 during the copy and QEMU's virtio-blk request merging
# is off, so the primary receives 4 KiB requests, the stream the reported
# secondary got; MAX_KB=0 keeps the guest's own limit (ext4 writeback then
# sends ~128 KiB requests and neither mode collapses). A copy still running COPY_LIMIT
# seconds after it started is cut off (the guest is killed) and reported as
# such. The copy's rate comes from the primary's metrics
# (vmsan_nbd_bytes_total{direction="write"}, sampled once a second), since
# cp prints none.
# CLIENT=fio: fio's nbd engine instead (rw=write, bs=4k, iodepth 32,
# RUNTIME seconds): the same kind of request stream without the filesystem
# and in far less CPU time.
#
# Output (scenarios/out/002-replication/): summary.md (table, ack
# latencies, MB/s per 5 s), mbps.tsv (client MB/s per sample for each run),
# mbps.png (plot), logs, metrics, guest consoles.
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"

CLIENT=${CLIENT:-guest}         # guest or fio
FILES=${FILES:-40000}           # guest: files of 4 KiB in the tree
COPY_LIMIT=${COPY_LIMIT:-120}   # guest: seconds the copy may run before it is cut off
MAX_KB=${MAX_KB:-4}             # guest: vda max_sectors_kb during the copy (0: the guest's own)
# QEMU's virtio-blk merges adjacent requests that the guest queued
# together; off, each guest request is one NBD request.
QEMU_MERGE=$([ "$MAX_KB" = 0 ] && echo on || echo off)
REFERENCE=${REFERENCE:-1}       # 1: first a run on an unreplicated volume (what the client does alone)
RUNTIME=${RUNTIME:-40}          # fio: seconds of client writes per run
SLOW_IOPS=${SLOW_IOPS:-150}     # secondary disk: write operations per second
SLOW_BPS=${SLOW_BPS:-94371840}  # and bytes per second (90 MiB/s)
OUT=$SCEN_OUT/002-replication

need_root "the throttled loop device"
need_tools curl:curl jq:jq losetup:mount mkfs.ext4:e2fsprogs go:golang-go
mkdir -p "$OUT"
rm -f "$OUT"/*.tsv "$OUT"/*.log "$OUT"/*.txt "$OUT"/*.json "$OUT"/*.err "$OUT"/*.md "$OUT"/*.png
build_vmsan

case "$CLIENT" in
guest)
	need_tools qemu-system-x86_64:qemu-system-x86 cpio:cpio gzip:gzip
	"$SCEN_ROOT/scripts/guest/build.sh" >&2
	GUEST=$SCEN_OUT/guest-002
	rm -rf "$GUEST/root"; mkdir -p "$GUEST/root/usr/sbin" "$GUEST/root/etc" "$GUEST/root/bin"
	# mke2fs from the host with the libraries it links (busybox's mke2fs
	# makes ext2 only). Called by full path in cp-init: busybox's shell
	# prefers its own applets to $PATH.
	mke2fs=$(command -v mke2fs)
	cp -L "$mke2fs" "$GUEST/root/usr/sbin/mke2fs"
	[ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$GUEST/root/etc/"
	for l in $(ldd "$mke2fs" | grep -oE '/[^ ]+'); do
		mkdir -p "$GUEST/root$(dirname "$l")"
		cp -L "$l" "$GUEST/root$l"
	done
	for a in cp df awk find kill cut; do ln -sf busybox "$GUEST/root/bin/$a"; done
	install -m 755 "$SCEN_ROOT/scenarios/guest/cp-init" "$GUEST/root/init"
	# The kernel unpacks concatenated archives in order: ours replaces /init.
	(cd "$GUEST/root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -1) >"$GUEST/overlay.gz"
	cat "$SCEN_ROOT/.cache/guest/initramfs.gz" "$GUEST/overlay.gz" >"$GUEST/initrd.gz"
	# The tree to copy, kept between runs (same FILES, same image).
	SRC_IMG=$GUEST/src-$FILES.img
	if [ ! -s "$SRC_IMG" ]; then
		log "building the source tree: $FILES files of 4 KiB"
		workdir
		mkdir -p "$WORKDIR/src/tree"
		left=$FILES d=0
		while [ "$left" -gt 0 ]; do
			n=$((left < 300 ? left : 300))
			mkdir "$WORKDIR/src/tree/d$d"
			head -c $((n * 4096)) /dev/urandom | (cd "$WORKDIR/src/tree/d$d" && split -b 4096 -a 3 - f)
			left=$((left - n)) d=$((d + 1))
		done
		rm -f "$GUEST"/src-*.img
		# Room for the data plus one inode and directory entry per file.
		truncate -s $(( (FILES * 4096 * 5 / 4 >> 20) + 64 ))M "$SRC_IMG.tmp"
		mke2fs -t ext4 -q -F -N $((FILES + 1000)) -d "$WORKDIR/src" "$SRC_IMG.tmp" >/dev/null 2>&1 ||
			die "mke2fs -d for the source tree failed"
		mv "$SRC_IMG.tmp" "$SRC_IMG"
		rm -rf "$WORKDIR/src"
	fi
	;;
fio)
	need_tools fio:fio
	fio --enghelp=nbd >/dev/null 2>&1 || die "fio lacks the nbd engine (Debian's fio has it via libnbd)"
	;;
*) die "CLIENT must be guest or fio" ;;
esac

# throttle_start DEV CMD...: run CMD in a cgroup whose writes to DEV are
# capped; sets THROTTLED_PID. cgroup v1 blkio where mounted, else v2 io.max.
throttle_start() {
	local dev=$1; shift
	local mm cg
	mm=$(cat "/sys/block/$(basename "$dev")/dev")
	if [ -w /sys/fs/cgroup/blkio/cgroup.procs ]; then
		cg=/sys/fs/cgroup/blkio/vmsan-scen-$$-$RANDOM
		mkdir "$cg"; _cgroups+=("$cg")
		echo "$mm $SLOW_IOPS" >"$cg/blkio.throttle.write_iops_device"
		echo "$mm $SLOW_BPS" >"$cg/blkio.throttle.write_bps_device"
	elif grep -qw io /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
		echo +io >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
		cg=/sys/fs/cgroup/vmsan-scen-$$-$RANDOM
		mkdir "$cg"; _cgroups+=("$cg")
		echo "$mm wiops=$SLOW_IOPS wbps=$SLOW_BPS" >"$cg/io.max"
	else
		die "no block-I/O cgroup (v1 blkio or v2 io) to throttle the secondary's disk"
	fi
	sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$@" >>"$THROTTLED_LOG" 2>&1 &
	THROTTLED_PID=$!
}

node_config() { # FILE DATA_DIR NBD METRICS REPL_LISTEN PEER ROLE ENGINE_YAML
	cat >"$1" <<YAML
data_dir: $2
listen: [127.0.0.1:$3]
metrics_listen: 127.0.0.1:$4
no_default_volume: true
volumes:
  - name: vm1
    size: 1G
    cache: none
$8
    replication:
      listen: 127.0.0.1:$5
      peer: 127.0.0.1:$6
      role: $7
      protocol: C
      shared_secret: scenario-002-shared-secret
YAML
}

repl_field() { # DATA_DIR JQ
	"$VMSAN" repl status vm1 --data-dir "$1" --json 2>/dev/null | jq -r "$2" 2>/dev/null || echo "?"
}
CONN_JQ='(if type=="array" then .[0] elif .volumes then .volumes[0] else . end) | "\(.connection)/\(.peer_disk)"'

fmt_disc() { # "N reason=n reason=n " -> "N (reason=n, ...)"
	local n=${1%% *} r=${1#* }
	r=${r% }
	if [ -n "$r" ]; then echo "$n (${r// /, })"; else echo "$n"; fi
}

# sampler METRICS_URL: once a second, "epoch<TAB>nbd write bytes<TAB>nbd
# write requests<TAB>connection/peer disk" from one scrape of the primary.
sampler() {
	while :; do
		curl -fs "$1" | awk -v t="$(date +%s.%N)" '
			$1 ~ /^vmsan_nbd_bytes_total[{].*direction="write"/ { b += $2 }
			$1 ~ /^vmsan_nbd_requests_total[{].*command="write"/ { r += $2 }
			$1 ~ /^vmsan_repl_connection_state[{]/ && $2 == 1 { match($1, /state="[A-Za-z]+"/); c = substr($1, RSTART + 7, RLENGTH - 8) }
			$1 ~ /^vmsan_repl_peer_disk_state[{]/ && $2 == 1 { match($1, /state="[A-Za-z]+"/); d = substr($1, RSTART + 7, RLENGTH - 8) }
			END { printf "%s\t%.0f\t%.0f\t%s/%s\n", t, b, r, c ? c : "?", d ? d : "?" }'
		sleep 1
	done
}

# guest_client NAME NBD_PORT: boot the guest on the export, wait for it to
# power off or for COPY_LIMIT seconds of copying. Sets CP_T0 and CP_T1
# (host epochs of the copy's start and end: sync done, or the cut-off) and
# CP_DONE (yes/no).
guest_client() {
	local name=$1 port=$2 con=$OUT/$1-console.txt q now
	child_bg timeout 600 qemu-system-x86_64 -accel tcg -smp 2 -m 512 -nographic -no-reboot -nic none \
		-kernel "$SCEN_ROOT/.cache/guest/vmlinuz" -initrd "$GUEST/initrd.gz" \
		-append "console=ttyS0 panic=-1 quiet vmsan.max_sectors_kb=$MAX_KB" \
		-drive "file=nbd://127.0.0.1:$port/vm1,format=raw,if=none,id=dst,cache=none" \
		-device "virtio-blk-pci,drive=dst,request-merging=$QEMU_MERGE" \
		-drive "file=$SRC_IMG,format=raw,if=virtio,readonly=on" </dev/null >"$con" 2>&1
	q=$BG_PID
	CP_T0="" CP_T1="" CP_DONE=no
	while kill -0 "$q" 2>/dev/null; do
		now=$(date +%s.%N)
		if [ -z "$CP_T0" ] && grep -q '^VMSAN-PHASE cp ' "$con"; then
			CP_T0=$now
			log "$name: guest copying (load $(loadavg))"
		fi
		if [ -z "$CP_T1" ] && grep -q '^VMSAN-PHASE sync-done' "$con"; then
			CP_T1=$now CP_DONE=yes
		fi
		if [ -n "$CP_T0" ] && [ -z "$CP_T1" ] && awk -v a="$now" -v b="$CP_T0" -v l="$COPY_LIMIT" 'BEGIN { exit !(a - b > l) }'; then
			CP_T1=$now
			log "$name: copy still running after ${COPY_LIMIT}s: cut off"
			kill "$q" 2>/dev/null || true
			break
		fi
		sleep 0.5
	done
	wait "$q" 2>/dev/null || true
	[ -n "$CP_T0" ] || die "$name: the guest never started copying (see $con)"
	[ -n "$CP_T1" ] || die "$name: the guest stopped before the copy ended (see $con)"
}

# child_bg CMD...: like child, without waiting; sets BG_PID.
child_bg() {
	"$@" &
	BG_PID=$!
	_pids+=("$BG_PID")
}

# run_one NAME SECONDARY_ENGINE_YAML: one pair, one client run, one table
# row. NAME "reference": the primary alone, its volume not replicated.
run_one() {
	local name=$1 eng=$2 w
	workdir; w=$WORKDIR
	mkdir -p "$w/a"
	local pn pm pr sn sm sr
	free_port; pn=$PORT; free_port; pm=$PORT; free_port; pr=$PORT
	free_port; sn=$PORT; free_port; sm=$PORT; free_port; sr=$PORT
	node_config "$w/a.yaml" "$w/a" "$pn" "$pm" "$pr" "$sr" primary ""
	if [ "$name" = reference ]; then
		# Same config without the replication section.
		sed -i '/^    replication:/,$d' "$w/a.yaml"
		"$VMSAN" serve --config "$w/a.yaml" >"$OUT/$name-primary.log" 2>&1 &
		local pa=$!; _pids+=("$pa")
		wait_http "http://127.0.0.1:$pm/metrics" 30 || die "vmsan did not start (see $OUT/$name-primary.log)"
		client_run "$name" "$pn" "$pm"
		printf '| %s | %s | %s | %s | %s | - | - | - | - | %s |\n' "$name" "$CR_TIME" "$CR_MBPS" "$CR_WORST" "$CR_WSZ" "$CR_LOAD" >>"$OUT/table.md"
		kill "$pa" 2>/dev/null || true
		wait "$pa" 2>/dev/null || true
		return
	fi
	loop_fs mkfs.ext4 "$w/b.img" "$w/b" 4G -q -F
	local dev=$LOOP_DEV
	node_config "$w/b.yaml" "$w/b" "$sn" "$sm" "$sr" "$pr" secondary "$eng"
	"$VMSAN" serve --config "$w/a.yaml" >"$OUT/$name-primary.log" 2>&1 &
	local pa=$!; _pids+=("$pa")
	THROTTLED_LOG=$OUT/$name-secondary.log
	: >"$THROTTLED_LOG"
	throttle_start "$dev" "$VMSAN" serve --config "$w/b.yaml"
	local pb=$THROTTLED_PID
	_pids+=("$pb")
	wait_http "http://127.0.0.1:$pm/metrics" 30 || die "primary did not start (see $OUT/$name-primary.log)"
	wait_http "http://127.0.0.1:$sm/metrics" 30 || die "secondary did not start (see $OUT/$name-secondary.log)"
	log "$name: waiting for the pair to connect and sync"
	local i st
	for i in $(seq 1 1200); do
		st="$(repl_field "$w/a" "$CONN_JQ")"
		case "$st" in "Connected/UpToDate") break ;; esac
		sleep 0.5
	done
	[ "$st" = "Connected/UpToDate" ] || die "$name: pair not in sync: $st"
	"$VMSAN" serve --config "$w/b.yaml" --print-config >"$OUT/$name-secondary-config.yaml" 2>&1 || true

	local sumb0 cntb0
	sumb0=$(metric '^vmsan_engine_backend_write_size_bytes_sum' "http://127.0.0.1:$sm/metrics")
	cntb0=$(metric '^vmsan_engine_backend_write_size_bytes_count' "http://127.0.0.1:$sm/metrics")
	curl -fs "http://127.0.0.1:$pm/metrics" | grep '^vmsan_repl_disconnects_total' >"$OUT/$name-disc-before.txt" || true
	client_run "$name" "$pn" "$pm"
	local sumb1 cntb1
	sumb1=$(metric '^vmsan_engine_backend_write_size_bytes_sum' "http://127.0.0.1:$sm/metrics")
	cntb1=$(metric '^vmsan_engine_backend_write_size_bytes_count' "http://127.0.0.1:$sm/metrics")
	curl -fs "http://127.0.0.1:$pm/metrics" | grep '^vmsan_repl_disconnects_total' >"$OUT/$name-disc-after.txt" || true
	curl -fs "http://127.0.0.1:$sm/metrics" >"$OUT/$name-secondary-metrics.txt" || true
	local disc ping mean
	disc=$(awk 'NR==FNR { b[$1]=$2; next } { d=$2-b[$1]; if (d>0) { s+=d; match($1,/reason="[a-z_]+"/); r=r substr($1,RSTART+8,RLENGTH-9) "=" d " " } } END { printf "%d %s\n", s, r }' \
		"$OUT/$name-disc-before.txt" "$OUT/$name-disc-after.txt")
	ping=$(awk 'NR==FNR { b[$1]=$2; next } /reason="ping_timeout"/ { s+=$2-b[$1] } END { print s+0 }' \
		"$OUT/$name-disc-before.txt" "$OUT/$name-disc-after.txt")
	# The primary's log says it too, whatever the metrics say.
	ping="$ping ($(grep -ci 'ping.timeout' "$OUT/$name-primary.log" || true) log lines)"
	mean=$(awk -v s=$((sumb1 - sumb0)) -v c=$((cntb1 - cntb0)) 'BEGIN { printf "%.1f", c ? s/c/1024 : 0 }')
	# How long a replicated write waited for the secondary's ack (the whole
	# life of the pair: the initial sync sends none): mean and the bucket
	# that holds the 99th percentile. Against the ping and ko timeouts.
	awk -v n="$name" '
		/^vmsan_repl_peer_ack_latency_seconds_bucket/ { match($1, /le="[^"]+"/); le[++k] = substr($1, RSTART + 4, RLENGTH - 5); c[k] = $2 }
		/^vmsan_repl_peer_ack_latency_seconds_sum/ { s = $2 }
		/^vmsan_repl_peer_ack_latency_seconds_count/ { t = $2 }
		END {
			if (!t) { printf "%s: no replicated writes acked\n", n; exit }
			for (i = 1; i <= k; i++) if (c[i] >= 0.99 * t) { p = le[i]; break }
			printf "%s: %d writes, mean %.3f s, 99%% within %s s\n", n, t, s / t, p
		}' "$OUT/$name-primary-metrics.txt" >>"$OUT/ack.txt"
	printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$CR_TIME" "$CR_MBPS" "$CR_WORST" "$CR_WSZ" "$mean" \
		"$(fmt_disc "$disc")" "$ping" "$CR_NC" "$CR_LOAD" >>"$OUT/table.md"
	kill "$pa" "$pb" 2>/dev/null || true
	wait "$pa" "$pb" 2>/dev/null || true
	umount "$w/b"
}

# client_run NAME NBD_PORT METRICS_PORT: the client against the primary,
# sampled once a second. Writes NAME-mbps.tsv (MB/s per second of the
# copy) and sets CR_TIME (copy time, and for the guest how much it copied),
# CR_MBPS (mean client MB/s over the copy), CR_WORST (slowest 5 s),
# CR_WSZ (client mean write size, KiB), CR_NC (samples not
# Connected/UpToDate, replicated runs only) and CR_LOAD.
client_run() {
	local name=$1 pn=$2 pm=$3 t0 t1 done_
	CR_LOAD=$(loadavg)
	sampler "http://127.0.0.1:$pm/metrics" >"$OUT/$name-samples.tsv" &
	local poller=$!; _pids+=("$poller")
	if [ "$CLIENT" = guest ]; then
		log "$name: guest boot, mkfs.ext4, cp -a of $FILES files of 4 KiB, sync (load $CR_LOAD)"
		guest_client "$name" "$pn"
		t0=$CP_T0 t1=$CP_T1 done_=$CP_DONE
	else
		log "$name: fio 4 KiB sequential writes, iodepth 32, ${RUNTIME}s (load $CR_LOAD)"
		t0=$(date +%s.%N)
		child sh -c 'cd "$0" && exec "$@"' "$OUT" fio --name="$name" --ioengine=nbd --uri="nbd://127.0.0.1:$pn/vm1" --rw=write --bs=4k \
			--iodepth=32 --size=900M --time_based --runtime="$RUNTIME" \
			--output-format=json >"$OUT/$name-fio.json" 2>"$OUT/$name-fio.err" || die "$name: fio failed (see $OUT/$name-fio.err)"
		t1=$(date +%s.%N) done_=yes
	fi
	sleep 1.2 # one more sample after the end
	kill "$poller" 2>/dev/null || true
	wait "$poller" 2>/dev/null || true
	curl -fs "http://127.0.0.1:$pm/metrics" >"$OUT/$name-primary-metrics.txt" || true
	# MB/s between consecutive samples inside the copy, at seconds since
	# its start.
	awk -F'\t' -v n="$name" -v t0="$t0" -v t1="$t1" '
		NR > 1 && $1 > t0 && pt < t1 && $1 > pt { printf "%s\t%d\t%.3f\n", n, int($1 - t0 + 0.5), ($2 - pb) / ($1 - pt) / 1e6 }
		{ pt = $1; pb = $2 }' "$OUT/$name-samples.tsv" >"$OUT/$name-mbps.tsv"
	local stats
	stats=$(awk -F'\t' -v t0="$t0" -v t1="$t1" -v repl="$([ "$name" = reference ] && echo 0 || echo 1)" '
		{ t[NR] = $1; b[NR] = $2; r[NR] = $3; if (repl && $4 != "Connected/UpToDate" && $1 >= t0 && $1 <= t1 + 1) nc++ }
		END {
			# the last samples at or before the copy start and end
			for (i = 1; i <= NR; i++) { if (t[i] <= t0) a = i; if (t[i] <= t1 + 1.5) z = i }
			if (!a) a = 1
			db = b[z] - b[a]; dr = r[z] - r[a]; dt = t[z] - t[a]
			# slowest 5 s: the lowest rate over any span of >= 5 s between samples
			worst = -1
			for (i = a; i < z; i++) for (j = i + 1; j <= z; j++) if (t[j] - t[i] >= 5) {
				m = (b[j] - b[i]) / (t[j] - t[i]) / 1e6; if (worst < 0 || m < worst) worst = m; break }
			printf "%.2f %.2f %.1f %d\n", dt ? db/dt/1e6 : 0, worst < 0 ? 0 : worst, dr ? db/dr/1024 : 0, nc
		}' "$OUT/$name-samples.tsv")
	read -r CR_MBPS CR_WORST CR_WSZ CR_NC <<<"$stats"
	[ "$name" = reference ] && CR_NC=-
	CR_TIME=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
	if [ "$done_" = yes ]; then CR_TIME="$CR_TIME s"; else CR_TIME="cut off at $CR_TIME s"; fi
	if [ "$CLIENT" = guest ]; then
		CR_TIME="$CR_TIME, $(awk '/^VMSAN-PROGRESS/ { k = $3 } END { printf "%.0f", k / 1024 }' "$OUT/$name-console.txt") MiB on /dst"
	fi
}

start=$(date +%s)
{
	echo "| run | client time (guest: cp -a + sync) | client MB/s (mean) | slowest 5 s, MB/s | client mean write (KiB) | secondary mean backend write (KiB) | disconnects (by reason) | ping timeouts | status samples not Connected | load avg at start |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
} >"$OUT/table.md"
[ "$REFERENCE" = 1 ] && run_one reference ""
run_one default ""
run_one diagnostic "    engine:
      workers: 16
      max_merge: 4K
      gather_delay: -1ms"

runs=(default diagnostic)
[ "$REFERENCE" = 1 ] && runs=(reference "${runs[@]}")
for n in "${runs[@]}"; do cat "$OUT/$n-mbps.tsv"; done >"$OUT/mbps.tsv"
(cd "$SCEN_ROOT" && go run ./scenarios/plot -logy -title "002: client MB/s, slow secondary (${SLOW_IOPS} IOPS)" \
	-x "second of the client run" -y "MB/s" -o "$OUT/mbps.png" "$OUT/mbps.tsv") || log "plot failed"

{
	echo "## 002-replication ($(date -u '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - start )) s)"
	echo
	echo -n "Secondary disk throttled to ${SLOW_IOPS} write IOPS and $((SLOW_BPS / 1048576)) MiB/s; protocol C; "
	if [ "$CLIENT" = guest ]; then
		echo "client: QEMU TCG guest, mkfs.ext4 on the export, cp -a of $FILES files of 4 KiB, sync (cut off after ${COPY_LIMIT} s); guest max_sectors_kb during the copy: $MAX_KB (0: the guest's own)."
	else
		echo "client: fio nbd, 4 KiB sequential writes, iodepth 32, ${RUNTIME} s per run."
	fi
	echo
	cat "$OUT/table.md"
	echo
	echo "Replicated writes' wait for the secondary's ack (vmsan_repl_peer_ack_latency_seconds on the primary; the defaults: ping timeout 6 s, ko timeout 10 s):"
	echo
	sed 's/^/* /' "$OUT/ack.txt"
	echo
	echo "Client MB/s over time (primary's NBD bytes written; mean of the once-a-second samples in each 5 s of the client run; full series in mbps.tsv):"
	echo
	echo '```'
	awk -F'\t' -v order="${runs[*]}" '
		BEGIN { nr = split(order, rn, " ") }
		{ k = int($2 / 5) * 5; s[$1, k] += $3; n[$1, k]++; if (k > max) max = k }
		END {
			printf "second"; for (i = 1; i <= nr; i++) printf "\t%s", rn[i]; print ""
			for (sec = 0; sec <= max; sec += 5) {
				line = sec
				for (i = 1; i <= nr; i++) line = line "\t" (((rn[i], sec) in n) ? sprintf("%.2f", s[rn[i], sec] / n[rn[i], sec]) : "-")
				print line
			}
		}' "$OUT/mbps.tsv"
	echo '```'
} >"$OUT/summary.md"
cat "$OUT/summary.md"
