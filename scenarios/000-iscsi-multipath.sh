#!/usr/bin/env bash
# Scenario 000: KVM hosts on an iSCSI SAN reached over several NICs with
# dm-multipath (round-robin, queue_if_no_path), benchmarked with bonnie++,
# read-ahead 256 vs 16384 sectors, and one path cut mid-run.
#
# Targets:
#   vmsan  `vmsan serve` with one 1 GiB sparse volume per cache mode
#          (none = O_DIRECT, writethrough, writeback), iSCSI mode
#          per-volume (one target per volume), PATHS portals on 127.0.0.1
#          in portal groups 1..PATHS, CHAP, a 2 s NOP-In ping
#   tgt    the reference: tgtd with one LU on a sparse file of the same
#          size, opened O_DIRECT (bsoflags direct, the counterpart of
#          cache=none; TGT_MODES="direct buffered" adds a run on tgt's
#          default buffered backing store), PATHS portals (all in tgt's one
#          portal group), the same CHAP account
# Each portal is reached through its own host-side fault proxy
# (scenarios/pathproxy, built on internal/testutil/faultproxy: the proxy
# the guest tests cut paths with), so the guest has PATHS paths, like the
# field case's NICs, and one of them can be cut and restored.
#
# The client: the iSCSI test guest (scripts/guest/build.sh --iscsi; QEMU
# TCG, Linux's initiator, multipath-tools) with
# scenarios/guest/bonnie-multipath.sh as its test: it logs in through
# every path, builds one dm-multipath map with the device section that
# `vmsan iscsi multipath-conf` prints, except the path selector, which is
# the field case's "round-robin 0" (all paths in one group, I/O spread over
# them; queue_if_no_path for no_path_retry checker intervals), and the
# open-iscsi timers printed with it (init-iscsi's MP_DEVICES,
# REPLACEMENT_TIMEOUT, NOOP_INTERVAL, NOOP_TIMEOUT), makes ext4
# on the map and runs bonnie++ once per read-ahead in RA_LIST (blockdev
# --setra on the map and every path). One guest boot per target and cache
# mode.
#
# The cut: the first vmsan boot and the first tgt boot make one more
# bonnie++ run (read-ahead CUT_RA, default the first of RA_LIST), and
# CUT_AFTER seconds after the guest says it started, path 1 is cut
# (CUT=blackhole: its traffic silently stalls, a pulled cable; CUT=drop:
# its connections are closed and new ones refused) for CUT_SECS seconds,
# then restored. bonnie++ must finish without an error. In every run the
# guest also times a 4 KiB O_DIRECT probe write through the map every
# 0.25 s (round-robin sends some down the lost path) and reports the
# slowest (how long one I/O was held), the longest time the map completed
# nothing while it had requests in flight, the most paths failed at once,
# and kernel I/O errors on the map (must be none) and on the paths
# (failed over by dm-multipath).
#
# QUICK=1: cache=none only, a smaller bonnie++ file. MP_CONF_ARGS: flags
# for `vmsan iscsi multipath-conf` (e.g. "--replacement-timeout 2").
#
# Output (scenarios/out/000/): summary.md (the table), results.csv (the
# bonnie++ CSV lines, named TARGET-CACHE-RUN, RUN the read-ahead or
# "cut"), results.json, bonnie.txt (bon_csv2txt: bonnie++'s own table),
# runs.tsv (per run: the guest's probe, stall, paths, errors),
# paths-TARGET.png and paths.tsv (per-path MB/s around the cut, from the
# proxies' byte counts), guest consoles and daemon logs.
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"

QUICK=${QUICK:-0}
PATHS=${PATHS:-3}
RA_LIST=${RA_LIST:-256 16384}
if [ "$QUICK" = 1 ]; then
	CACHES=${CACHES:-none}
	BONNIE_SIZE=${BONNIE_SIZE:-64}
	BONNIE_RAM=${BONNIE_RAM:-32}
else
	CACHES=${CACHES:-none writethrough writeback}
	BONNIE_SIZE=${BONNIE_SIZE:-96}
	BONNIE_RAM=${BONNIE_RAM:-48}
fi
TGT_MODES=${TGT_MODES:-direct}
GUEST_MEM=${GUEST_MEM:-256} # MiB; the guest pins all but BONNIE_RAM (+ a margin) so that bonnie++'s file does not fit in its page cache
VOLSIZE_MB=${VOLSIZE_MB:-1024}
CUT=${CUT:-blackhole}
CUT_AFTER=${CUT_AFTER:-3}
CUT_SECS=${CUT_SECS:-20}
CUT_RA=${CUT_RA:-${RA_LIST%% *}}
OUT=$SCEN_OUT/000
IQN_TGT=iqn.2026-11.org.vmsan.scenario:tgt
NODE=scen000
CHAP_USER=guest
CHAP_SECRET=vmsan-chap-secret

need_root "tgtd and the guest's iSCSI target ports"
need_tools curl:curl jq:jq go:golang-go qemu-system-x86_64:qemu-system-x86 cpio:cpio gzip:gzip \
	tgtd:tgt tgtadm:tgt iscsiadm:open-iscsi multipath:multipath-tools bonnie++:bonnie++ bon_csv2txt:bonnie++
case "$CUT" in blackhole | drop) ;; *) die "CUT must be blackhole or drop" ;; esac
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.tsv "$OUT"/*.csv "$OUT"/*.json "$OUT"/*.png "$OUT"/*.log "$OUT"/*.yaml "$OUT/summary.md"
build_vmsan
log "building the path proxy and the iSCSI guest"
(cd "$SCEN_ROOT" && go build -o "$SCEN_OUT/bin/pathproxy" ./scenarios/pathproxy)
"$SCEN_ROOT/scripts/guest/build.sh" --iscsi >&2
GUEST=$SCEN_ROOT/.cache/guest-iscsi
workdir; W=$WORKDIR

# The device section the guest uses: vmsan's own advice, with the field
# case's round-robin selector in place of service-time.
# shellcheck disable=SC2086 # MP_CONF_ARGS: flags, split on spaces
"$VMSAN" iscsi multipath-conf ${MP_CONF_ARGS:-} | sed 's/path_selector "service-time 0"/path_selector "round-robin 0"/' >"$OUT/multipath-device.conf"
grep -q 'round-robin 0' "$OUT/multipath-device.conf" || die "vmsan iscsi multipath-conf: no path_selector line to replace"
# iscsid_conf KEY: the open-iscsi setting that multipath-conf prints (as a
# comment) with its device section; the guest's iscsid.conf gets it.
iscsid_conf() { sed -n "s/^#.*\.$1 = \([0-9][0-9]*\)$/\1/p" "$OUT/multipath-device.conf" | head -1; }
for k in replacement_timeout noop_out_interval noop_out_timeout; do
	[ -n "$(iscsid_conf $k)" ] || die "vmsan iscsi multipath-conf: no $k in its output"
done

# --- targets ----------------------------------------------------------------

# vmsan: one volume per cache mode, PATHS portals in PATHS portal groups.
VM_PORTALS=()
free_port; nbd=$PORT; free_port; met=$PORT
{
	echo "data_dir: $W/vmsan"
	echo "listen: [127.0.0.1:$nbd]"
	echo "metrics_listen: 127.0.0.1:$met"
	echo "no_default_volume: true"
	echo "volumes:"
	for c in $CACHES; do echo "  - {name: vm-$c, size: ${VOLSIZE_MB}M, cache: $c}"; done
	echo "iscsi:"
	echo "  mode: per-volume"
	echo "  node_name: $NODE"
	printf '  listen: ['
	for i in $(seq 1 "$PATHS"); do
		free_port; VM_PORTALS+=("127.0.0.1:$PORT")
		printf '%s{addr: "127.0.0.1:%s", tpgt: %s}' "$([ "$i" = 1 ] || echo ', ')" "$PORT" "$i"
	done
	echo ']'
	echo "  auth: {user: $CHAP_USER, secret: \"$CHAP_SECRET\"}"
} >"$OUT/vmsan.yaml"
"$VMSAN" serve --config "$OUT/vmsan.yaml" >"$OUT/vmsan.log" 2>&1 &
_pids+=("$!")
wait_http "http://127.0.0.1:$met/metrics" 30 || die "vmsan serve did not start (see $OUT/vmsan.log)"
for p in "${VM_PORTALS[@]}"; do
	for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/${p%:*}/${p#*:}") 2>/dev/null && break; sleep 0.1; done
done

# tgt: one target, LU 1 on a sparse file, PATHS portals. Its control
# socket is named after the first portal's port.
TGT_PORTALS=()
for i in $(seq 1 "$PATHS"); do free_port; TGT_PORTALS+=("127.0.0.1:$PORT"); done
tctl=${TGT_PORTALS[0]#*:}
truncate -s "${VOLSIZE_MB}M" "$W/tgt-lun1.img"
tgtd -f -C "$tctl" --iscsi "portal=${TGT_PORTALS[0]}" >"$OUT/tgtd.log" 2>&1 &
tgtpid=$!
_pids+=("$tgtpid")
# tgtd ignores SIGTERM while it has targets (the cleanup's SIGKILL follows)
# and leaves its control socket behind: the cleanup deletes it with the
# work directories (after the processes are stopped).
_workdirs+=("/var/run/tgtd/socket.$tctl" "/var/run/tgtd/socket.$tctl.lock")
tadm() { tgtadm -C "$tctl" --lld iscsi "$@" >>"$OUT/tgtd.log" 2>&1 || die "tgtadm $*: see $OUT/tgtd.log"; }
for _ in $(seq 1 100); do tgtadm -C "$tctl" --lld iscsi --mode target --op show >/dev/null 2>&1 && break; sleep 0.1; done
grep -q "failed to create/bind\|another tgtd" "$OUT/tgtd.log" && die "tgtd could not bind ${TGT_PORTALS[0]} (see $OUT/tgtd.log)"
for p in "${TGT_PORTALS[@]:1}"; do tadm --mode portal --op new --param "portal=$p"; done
tadm --mode target --op new --tid 1 --targetname "$IQN_TGT"
tadm --mode target --op bind --tid 1 --initiator-address ALL
tadm --mode account --op new --user "$CHAP_USER" --password "$CHAP_SECRET"
tadm --mode account --op bind --tid 1 --user "$CHAP_USER"
# tgt_lun MODE: (re)create LU 1 on the image, O_DIRECT for "direct",
# answering what vmsan answers so that the same device section applies.
tgt_lun() {
	tgtadm -C "$tctl" --lld iscsi --mode logicalunit --op delete --tid 1 --lun 1 >/dev/null 2>&1 || true
	truncate -s 0 "$W/tgt-lun1.img"
	truncate -s "${VOLSIZE_MB}M" "$W/tgt-lun1.img"
	if [ "$1" = direct ]; then
		tadm --mode logicalunit --op new --tid 1 --lun 1 --backing-store "$W/tgt-lun1.img" --bsoflags direct
	else
		tadm --mode logicalunit --op new --tid 1 --lun 1 --backing-store "$W/tgt-lun1.img"
	fi
	tadm --mode logicalunit --op update --tid 1 --lun 1 --params vendor_id=VMSAN,product_id=VOLUME,thin_provisioning=1
}

# Paths: one proxy per portal of each target (vmsan paths v1.., tgt t1..).
free_port; ctl=127.0.0.1:$PORT
proxy_args=() VM_GUEST=() TGT_GUEST=()
for i in $(seq 1 "$PATHS"); do
	free_port; proxy_args+=("v$i=127.0.0.1:$PORT=${VM_PORTALS[$((i - 1))]}"); VM_GUEST+=("10.0.2.2:$PORT")
	free_port; proxy_args+=("t$i=127.0.0.1:$PORT=${TGT_PORTALS[$((i - 1))]}"); TGT_GUEST+=("10.0.2.2:$PORT")
done
"$SCEN_OUT/bin/pathproxy" -ctl "$ctl" -samples "$OUT/proxy-samples.tsv" "${proxy_args[@]}" >"$OUT/pathproxy.log" 2>&1 &
_pids+=("$!")
wait_http "http://$ctl/ready" 10 || die "pathproxy did not start (see $OUT/pathproxy.log)"

# --- guest runs ---------------------------------------------------------------

# boot NAME IQN CUT(0|1) PORTAL...: one guest boot, bonnie++ per read-ahead;
# with CUT=1 path 1 (the first portal's proxy) is cut during the first run.
# Kernel messages of an I/O error on the map (dm-N) or in ext4.
GUEST_IO_ERR='I/O error.* dev(ice)? dm-|EXT4-fs (error|warning)'
boot() {
	local name=$1 iqn=$2 cut=$3 pname; shift 3
	pname=$( [ "${name%%-*}" = vmsan ] && echo v1 || echo t1)
	local gd=$W/guest-$name
	mkdir -p "$gd"
	cp "$SCEN_ROOT/scenarios/guest/bonnie-multipath.sh" "$gd/test.sh"
	cat >"$gd/test.env" <<-EOF
		PORTALS='$*'
		IQN='$iqn'
		CHAP_USER='$CHAP_USER'
		CHAP_SECRET='$CHAP_SECRET'
		RA_LIST='$RA_LIST'
		BONNIE_SIZE='$BONNIE_SIZE'
		BONNIE_RAM='$BONNIE_RAM'
		MP_VENDOR='VMSAN'
		MP_PRODUCT='VOLUME'
		CUT_RA='$([ "$cut" = 1 ] && echo "$CUT_RA")'
		REPLACEMENT_TIMEOUT='$(iscsid_conf replacement_timeout)'
		NOOP_INTERVAL='$(iscsid_conf noop_out_interval)'
		NOOP_TIMEOUT='$(iscsid_conf noop_out_timeout)'
		MP_DEVICES='$(sed "s/'/'\\\\''/g" "$OUT/multipath-device.conf")'
	EOF
	(cd "$gd" && printf '%s\n' test.sh test.env | cpio -o -H newc --quiet -R 0:0 | gzip -1) >"$gd/overlay.gz"
	cat "$GUEST/initramfs.gz" "$gd/overlay.gz" >"$gd/initrd.gz"
	local console=$OUT/$name-console.txt cutter=
	log "$name: guest boot, bonnie++ ${BONNIE_SIZE} MiB per read-ahead in: $RA_LIST$([ "$cut" = 1 ] && echo ", then ra=$CUT_RA with path 1 cut ($CUT)") (load $(loadavg))"
	echo "$name	$(loadavg)" >>"$OUT/load.tsv"
	timeout 540 qemu-system-x86_64 -accel tcg -m "$GUEST_MEM" -nographic -no-reboot \
		-netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile= \
		-kernel "$GUEST/vmlinuz" -initrd "$gd/initrd.gz" \
		-append "console=ttyS0 panic=-1 quiet" </dev/null >"$console" 2>&1 &
	local q=$!
	_pids+=("$q")
	while kill -0 "$q" 2>/dev/null; do
		# An error on the map reaches ext4, and the guest may then hang in
		# it: stop at once, that is the scenario's failure.
		if grep -aqE "$GUEST_IO_ERR" "$console"; then
			sleep 2
			kill "$q" 2>/dev/null || true
			die "$name: I/O errors reached the map or ext4 in the guest: $(grep -aE "$GUEST_IO_ERR" "$console" | head -3 | tr -d '\r' | tr '\n' ' ')(see $console)"
		fi
		if [ "$cut" = 1 ] && [ -z "$cutter" ] && grep -q "VMSAN-GUEST: BONNIE-RUNNING ra=[0-9]* run=cut" "$console"; then
			(
				sleep "$CUT_AFTER"
				t0=$(date +%s.%N)
				log "$name: $(curl -fsS "http://$ctl/cut?path=$pname&how=$CUT")"
				sleep "$CUT_SECS"
				log "$name: $(curl -fsS "http://$ctl/restore?path=$pname")"
				printf '%s\t%s\t%s\t%s\n' "$name" "$pname" "$t0" "$(date +%s.%N)" >>"$OUT/cuts.tsv"
			) &
			cutter=$!
			_pids+=("$cutter")
		fi
		sleep 0.5
	done
	local rc=0
	wait "$q" || rc=$?
	[ -z "$cutter" ] || wait "$cutter" || true
	grep -q "VMSAN-GUEST: DONE OK" "$console" || die "$name: guest failed (rc $rc; see $console): $(grep -a 'VMSAN-GUEST: FAIL' "$console" | head -1)"
	local label
	for label in $RA_LIST $([ "$cut" = 1 ] && echo cut); do
		tr -d '\r' <"$console" | awk -v b="VMSAN-BONNIE-$label-BEGIN" -v e="VMSAN-BONNIE-$label-END" '$0 ~ e { p=0 } p { print } $0 ~ b { p=1 }' |
			awk -F, -v OFS=, -v n="$name-$label" 'NF > 20 { $3 = n; print }' >>"$OUT/results.csv"
		tr -d '\r' <"$console" | sed -n "s/.*VMSAN-GUEST: RUN $label ra=\([0-9]*\) \(.*\)/$name\t$label\t\1\t\2/p" >>"$OUT/runs.tsv"
	done
}

start=$(date +%s)
first_vm=1
for c in $CACHES; do
	boot "vmsan-$c" "iqn.2026-11.org.vmsan:$NODE:vm-$c" "$first_vm" "${VM_GUEST[@]}"
	first_vm=0
done
first_tgt=1
for m in $TGT_MODES; do
	tgt_lun "$m"
	boot "tgt-$m" "$IQN_TGT" "$first_tgt" "${TGT_GUEST[@]}"
	first_tgt=0
done
elapsed=$(($(date +%s) - start))
# tgtd ignores SIGTERM: SIGKILL (it keeps nothing but the image).
kill -9 "$tgtpid" 2>/dev/null && wait "$tgtpid" 2>/dev/null || true

# --- report -----------------------------------------------------------------

# bon_csv2txt keeps 7 characters of a name: TARGET CACHE-RUN, e.g. vwt-16k
# (vmsan, writethrough, read-ahead 16384), td-cut (tgt, direct, the run
# with the cut).
short() {
	local n=$1 t c ra
	t=${n%%-*}; c=${n#*-}; c=${c%-*}; ra=${n##*-}
	case "$c" in none) c=n ;; writethrough) c=wt ;; writeback) c=wb ;; direct) c=d ;; buffered) c=b ;; esac
	[ "$ra" != cut ] && [ "$ra" -ge 1024 ] && [ $((ra % 1024)) = 0 ] && ra=$((ra / 1024))k
	echo "${t:0:1}$c-$ra"
}
while IFS=, read -r a b name rest; do
	echo "$a,$b,$(short "$name"),$rest"
done <"$OUT/results.csv" | bon_csv2txt >"$OUT/bonnie.txt" 2>/dev/null || true

# kv KEY LINE: the value of KEY=VALUE in a RUN line.
kv() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"; }
# The bonnie++ 1.98 CSV fields (0-based): 9/10 per-chr output (skipped, -f),
# 11/12 block output K/s and %CPU, 13/14 rewrite, 15/16 per-chr input
# (skipped), 17/18 block input, 19/20 random seeks /s, 38-43 the latencies
# of those six tests.
{
	echo "["
	sep=
	while IFS=$'\t' read -r name label ra rest; do
		line=$(grep "^[^,]*,[^,]*,$name-$label," "$OUT/results.csv" || true)
		IFS=, read -r -a f <<<"$line"
		cut=-
		[ "$label" = cut ] && cut=$CUT
		printf '%s  {"target": "%s", "cache": "%s", "run": "%s", "read_ahead_sectors": %s, "path_cut": "%s", "block_out_kps": "%s", "block_out_cpu": "%s", "rewrite_kps": "%s", "rewrite_cpu": "%s", "block_in_kps": "%s", "block_in_cpu": "%s", "seeks_per_s": "%s", "seeks_cpu": "%s", "latency_block_out": "%s", "latency_rewrite": "%s", "latency_block_in": "%s", "latency_seeks": "%s", "map_stall_s": %s, "probe_max_s": %s, "probes": %s, "probe_errors": %s, "paths_failed_max": "%s", "dm_errors": %s, "path_errors": %s, "bonnie_rc": %s}' \
			"$sep" "${name%%-*}" "${name#*-}" "$label" "$ra" "$cut" "${f[11]:-}" "${f[12]:-}" "${f[13]:-}" "${f[14]:-}" "${f[17]:-}" "${f[18]:-}" "${f[19]:-}" "${f[20]:-}" \
			"${f[39]:-}" "${f[40]:-}" "${f[42]:-}" "${f[43]:-}" "$(kv map_stall "$rest")" "$(kv probe_max "$rest")" "$(kv probes "$rest")" "$(kv probe_errors "$rest")" "$(kv failed_max "$rest")" "$(kv dm_errors "$rest")" "$(kv path_errors "$rest")" "$(kv rc "$rest")"
		sep=$',\n'
	done <"$OUT/runs.tsv"
	printf '\n]\n'
} >"$OUT/results.json"
jq . "$OUT/results.json" >/dev/null || die "results.json is not valid JSON"

# Per-path MB/s around each cut (1 s steps, from 10 s before the cut to 20 s
# after the restore), from the proxies' cumulative byte counts.
: >"$OUT/paths.tsv"
if [ -s "$OUT/cuts.tsv" ]; then
	while IFS=$'\t' read -r name pname t0 t1; do
		pfx=${pname:0:1}
		awk -F'\t' -v pfx="$pfx" -v t0="$t0" -v t1="$t1" -v tg="${name%%-*}" '
			substr($2, 1, 1) == pfx {
				t = $1 / 1000 - t0
				if (t < -10 || t > t1 - t0 + 20) next
				s = int(t + 10) - 10
				if (!(($2, s) in first)) { first[$2, s] = $3 }
				last[$2, s] = $3; seen[$2] = 1; if (s > maxs) maxs = s
			}
			END {
				for (p in seen) for (s = -10; s <= maxs; s++) if ((p, s) in first) {
					# bytes forwarded from the first to the first sample of the next second
					nb = ((p, s + 1) in first) ? first[p, s + 1] : last[p, s]
					printf "%s path %s\t%d\t%.2f\n", tg, substr(p, 2), s, (nb - first[p, s]) / 1e6
				}
			}' "$OUT/proxy-samples.tsv" | sort -t$'\t' -k1,1 -k2,2n >>"$OUT/paths.tsv"
		grep "^${name%%-*} " "$OUT/paths.tsv" >"$W/paths-${name%%-*}.tsv" || true
		[ -s "$W/paths-${name%%-*}.tsv" ] &&
			(cd "$SCEN_ROOT" && go run ./scenarios/plot -title "000: ${name%%-*}, MB/s per path, path 1 cut ($CUT) at 0 s for ${CUT_SECS} s" \
				-x "seconds from the cut" -y "MB/s (both directions)" -o "$OUT/paths-${name%%-*}.png" "$W/paths-${name%%-*}.tsv") ||
			log "plot for $name failed"
	done <"$OUT/cuts.tsv"
fi

# fmt_run: the table row of one run.
{
	echo "## 000-iscsi-multipath ($(date -u '+%Y-%m-%d %H:%M UTC'), guest runs $elapsed s)"
	echo
	echo "QEMU TCG guest ($GUEST_MEM MiB), Linux initiator, dm-multipath over $PATHS paths (round-robin 0, one group; $(grep -o 'no_path_retry [0-9][0-9]*' "$OUT/multipath-device.conf" | head -1), $(grep -o 'fast_io_fail_tmo [0-9][0-9]*' "$OUT/multipath-device.conf" | head -1); open-iscsi replacement_timeout $(iscsid_conf replacement_timeout) s, NOP-Out $(iscsid_conf noop_out_interval) s + $(iscsid_conf noop_out_timeout) s), ext4 on the map; bonnie++ -s $BONNIE_SIZE -r $BONNIE_RAM -n 0 -f (block tests only). Volume ${VOLSIZE_MB} MiB sparse. K/s as bonnie++ prints them (KiB/s), %CP its CPU column (of the guest's one emulated CPU), latency its maximum per test. The first vmsan boot and the tgt boot make one more run (read-ahead $CUT_RA) during which path 1 is cut ($CUT) $CUT_AFTER s after it started, for $CUT_SECS s. Longest probe write: the slowest of the guest's 4 KiB O_DIRECT writes through the map every 0.25 s during the run (round-robin sends some down the lost path: how long one I/O was held). Map stall: the longest time the map had requests in flight and completed none (0.5 s samples)."
	echo
	echo "| target | cache | read-ahead | block out K/s | %CP | rewrite K/s | %CP | block in K/s | %CP | seeks /s | %CP | max latency out / rewrite / in / seeks | path cut | longest probe write | map stall | paths failed (most at once) | I/O errors (map / paths) |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	jq -r '.[] | "| \(.target) | \(.cache) | \(.read_ahead_sectors) | \(.block_out_kps) | \(.block_out_cpu) | \(.rewrite_kps) | \(.rewrite_cpu) | \(.block_in_kps) | \(.block_in_cpu) | \(.seeks_per_s) | \(.seeks_cpu) | \(.latency_block_out) / \(.latency_rewrite) / \(.latency_block_in) / \(.latency_seeks) | \(.path_cut) | \(.probe_max_s) s | \(.map_stall_s) s | \(.paths_failed_max) | \(.dm_errors) / \(.path_errors) |"' "$OUT/results.json"
	echo
	echo "Load average at each boot: $(awk -F'\t' '{ printf "%s%s %s", sep, $1, $2; sep = "; " }' "$OUT/load.tsv")."
	echo
	echo "bonnie++'s own table (bon_csv2txt; names: target v(msan)/t(gt), cache n(one)/wt/wb/d(irect)/b(uffered), read-ahead):"
	echo
	echo '```'
	cat "$OUT/bonnie.txt"
	echo '```'
} >"$OUT/summary.md"
cat "$OUT/summary.md"
errs=$(jq '[.[] | select(.dm_errors != 0 or .bonnie_rc != 0 or .probe_errors != 0)] | length' "$OUT/results.json")
[ "$errs" = 0 ] || die "$errs run(s) with I/O errors on the map"
[ "$(jq length "$OUT/results.json")" -gt 0 ] || die "no results"
