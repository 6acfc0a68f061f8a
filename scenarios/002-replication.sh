#!/usr/bin/env bash
# Scenario 002: a replicated pair whose secondary sits on a slow disk, and a
# client writing a long stream of 4 KiB blocks (what a guest's `cp -a` of a
# tree of small files turns into), run twice:
#
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
# The client is fio's nbd engine against the primary's NBD export (rw=write,
# bs=4k, iodepth 32), not a QEMU guest: it produces the same request stream
# a guest's virtio disk would send, in far less CPU time than a TCG guest.
#
# Output (scenarios/out/002-replication/): summary.md (table), mbps.tsv
# (client MB/s per second for both runs), mbps.png (plot), logs.
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"

RUNTIME=${RUNTIME:-40}          # seconds of client writes per run
SLOW_IOPS=${SLOW_IOPS:-150}     # secondary disk: write operations per second
SLOW_BPS=${SLOW_BPS:-94371840}  # and bytes per second (90 MiB/s)
OUT=$SCEN_OUT/002-replication

need_root "the throttled loop device"
need_tools fio:fio curl:curl losetup:mount mkfs.ext4:e2fsprogs go:golang-go
fio --enghelp=nbd >/dev/null 2>&1 || die "fio lacks the nbd engine (Debian's fio has it via libnbd)"
mkdir -p "$OUT"
build_vmsan

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
YAML
}

repl_field() { # DATA_DIR JQ
	"$VMSAN" repl status vm1 --data-dir "$1" --json 2>/dev/null | jq -r "$2" 2>/dev/null || echo "?"
}

fmt_disc() { # "N reason=n reason=n " -> "N (reason=n, ...)"
	local n=${1%% *} r=${1#* }
	r=${r% }
	if [ -n "$r" ]; then echo "$n (${r// /, })"; else echo "$n"; fi
}

run_one() { # NAME SECONDARY_ENGINE_YAML
	local name=$1 eng=$2 w
	workdir; w=$WORKDIR
	mkdir -p "$w/a"
	loop_fs mkfs.ext4 "$w/b.img" "$w/b" 4G -q -F
	local dev=$LOOP_DEV
	local pn pm pr sn sm sr
	free_port; pn=$PORT; free_port; pm=$PORT; free_port; pr=$PORT
	free_port; sn=$PORT; free_port; sm=$PORT; free_port; sr=$PORT
	node_config "$w/a.yaml" "$w/a" "$pn" "$pm" "$pr" "$sr" primary ""
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
		st="$(repl_field "$w/a" '(if type=="array" then .[0] elif .volumes then .volumes[0] else . end) | "\(.connection) \(.disk) \(.peer_disk)"')"
		case "$st" in "Connected UpToDate UpToDate") break ;; esac
		sleep 0.5
	done
	[ "$st" = "Connected UpToDate UpToDate" ] || die "$name: pair not in sync: $st"
	"$VMSAN" serve --config "$w/b.yaml" --print-config >"$OUT/$name-secondary-config.yaml" 2>&1 || true

	local sumb0 cntb0 disc0
	sumb0=$(metric '^vmsan_engine_backend_write_size_bytes_sum' "http://127.0.0.1:$sm/metrics")
	cntb0=$(metric '^vmsan_engine_backend_write_size_bytes_count' "http://127.0.0.1:$sm/metrics")
	curl -fs "http://127.0.0.1:$pm/metrics" | grep '^vmsan_repl_disconnects_total' >"$OUT/$name-disc-before.txt" || true
	log "$name: fio 4 KiB sequential writes, iodepth 32, ${RUNTIME}s (load $(loadavg))"
	local load0; load0=$(loadavg)
	# Connection state once a second while the client writes.
	( while kill -0 "$pa" 2>/dev/null; do
		printf '%s\t%s\n' "$(date +%s)" "$(repl_field "$w/a" '(if type=="array" then .[0] elif .volumes then .volumes[0] else . end) | "\(.connection)/\(.peer_disk)"')"; sleep 1
	done ) >"$OUT/$name-conn.tsv" &
	local poller=$!; _pids+=("$poller")
	child sh -c 'cd "$0" && exec "$@"' "$OUT" fio --name="$name" --ioengine=nbd --uri="nbd://127.0.0.1:$pn/vm1" --rw=write --bs=4k \
		--iodepth=32 --size=900M --time_based --runtime="$RUNTIME" --write_bw_log="$name" --log_avg_msec=1000 \
		--output-format=json >"$OUT/$name-fio.json" 2>"$OUT/$name-fio.err" || die "$name: fio failed (see $OUT/$name-fio.err)"
	kill "$poller" 2>/dev/null || true
	local sumb1 cntb1
	sumb1=$(metric '^vmsan_engine_backend_write_size_bytes_sum' "http://127.0.0.1:$sm/metrics")
	cntb1=$(metric '^vmsan_engine_backend_write_size_bytes_count' "http://127.0.0.1:$sm/metrics")
	curl -fs "http://127.0.0.1:$pm/metrics" | grep '^vmsan_repl_disconnects_total' >"$OUT/$name-disc-after.txt" || true
	curl -fs "http://127.0.0.1:$sm/metrics" >"$OUT/$name-secondary-metrics.txt" || true
	local disc reasons mean mbps reconn
	disc=$(awk 'NR==FNR { b[$1]=$2; next } { d=$2-b[$1]; if (d>0) { s+=d; match($1,/reason="[a-z_]+"/); r=r substr($1,RSTART+8,RLENGTH-9) "=" d " " } } END { printf "%d %s\n", s, r }' \
		"$OUT/$name-disc-before.txt" "$OUT/$name-disc-after.txt")
	mean=$(awk -v s=$((sumb1 - sumb0)) -v c=$((cntb1 - cntb0)) 'BEGIN { printf "%.1f", c ? s/c/1024 : 0 }')
	mbps=$(sed -n '/^{/,$p' "$OUT/$name-fio.json" | jq -r '.jobs[0].write.bw_bytes / 1e6 | . * 100 | round / 100')
	reconn=$(awk -F'\t' '$2 !~ /^Connected\// { n++ } END { print n+0 }' "$OUT/$name-conn.tsv")
	# Per-second MB/s: fio logs KiB/s averaged over each second.
	awk -F', *' -v n="$name" '{ printf "%s\t%d\t%.3f\n", n, int($1/1000+0.5), $2*1024/1e6 }' "$OUT/${name}_bw.1.log" >"$OUT/$name-mbps.tsv"
	local lo; lo=$(awk -F'\t' 'NR==1 || $3<m { m=$3 } END { printf "%.2f", m }' "$OUT/$name-mbps.tsv")
	printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$mbps" "$lo" "$mean" "$(fmt_disc "$disc")" "$reconn" "$load0" >>"$OUT/table.md"
	kill "$pa" "$pb" 2>/dev/null || true
	wait "$pa" "$pb" 2>/dev/null || true
	umount "$w/b"
}

rm -f "$OUT/table.md" "$OUT"/*_bw.*.log
{
	echo "| run | client MB/s (mean) | worst second MB/s | secondary mean backend write (KiB) | disconnects (by reason) | status samples not Connected | load avg at start |"
	echo "|---|---|---|---|---|---|---|"
} >"$OUT/table.md"
run_one default ""
run_one diagnostic "    engine:
      workers: 16
      max_merge: 4K
      gather_delay: -1ms"

cat "$OUT/default-mbps.tsv" "$OUT/diagnostic-mbps.tsv" >"$OUT/mbps.tsv"
(cd "$SCEN_ROOT" && go run ./scenarios/plot -logy -title "002: client MB/s, slow secondary (${SLOW_IOPS} IOPS)" \
	-x "second" -y "MB/s" -o "$OUT/mbps.png" "$OUT/mbps.tsv") || log "plot failed"

{
	echo "## 002-replication ($(date -u '+%Y-%m-%d %H:%M UTC'))"
	echo
	echo "Secondary disk throttled to ${SLOW_IOPS} write IOPS and $((SLOW_BPS / 1048576)) MiB/s; client: fio nbd, 4 KiB sequential writes, iodepth 32, ${RUNTIME} s per run; protocol C."
	echo
	cat "$OUT/table.md"
	echo
	echo "Client MB/s per second:"
	echo
	echo '```'
	printf 'second'; for n in default diagnostic; do printf '\t%s' "$n"; done; echo
	join -t $'\t' -a1 -a2 -e - -o 0,1.2,2.2 \
		<(awk -F'\t' '{ print $2 "\t" $3 }' "$OUT/default-mbps.tsv" | sort -k1,1) \
		<(awk -F'\t' '{ print $2 "\t" $3 }' "$OUT/diagnostic-mbps.tsv" | sort -k1,1) | sort -n
	echo '```'
} >"$OUT/summary.md"
cat "$OUT/summary.md"
