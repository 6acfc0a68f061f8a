# /test.sh for the iSCSI guest (scripts/guest/build.sh --iscsi), for
# scenario 000: bonnie++ on ext4 over a dm-multipath map of the target's
# LU reached through every portal in PORTALS, once per read-ahead value in
# RA_LIST. Sourced by the guest's /init, whose helpers it uses.
#
# /test.env: PORTALS ("10.0.2.2:P1 10.0.2.2:P2 ...", as the guest reaches
# them), IQN, CHAP_USER/CHAP_SECRET (optional), RA_LIST (read-ahead in
# 512-byte sectors, default "256 16384", the values of the field case),
# BONNIE_SIZE and BONNIE_RAM (MiB; bonnie++ wants a file of twice the RAM
# it is told about; default 128 and 64; the guest's memory beyond BONNIE_RAM
# is pinned in a tmpfs, so that the file does not fit in its page cache),
# MP_VENDOR/MP_PRODUCT.
# The multipath.conf device section and the open-iscsi timers come from
# init-iscsi's MP_DEVICES, REPLACEMENT_TIMEOUT, NOOP_* in /test.env.
#
# CUT_RA: if set, one more run with that read-ahead, labelled "cut" (the
# host cuts a path during it); the others are labelled with their
# read-ahead.
#
# Console output: "VMSAN-GUEST: BONNIE-RUNNING ra=N run=LABEL" when each
# run starts (a scenario that cuts a path mid-run waits for it), each
# run's bonnie++ CSV line between "VMSAN-BONNIE-LABEL-BEGIN" and
# "VMSAN-BONNIE-LABEL-END", then "RUN LABEL ra=N ..." with what the guest
# saw of the map during the run (sampled every 0.5 s; paths every second):
#   map_stall=S  the longest time the map had requests in flight and
#                completed none (other paths may keep completing I/O
#                while one is stuck, so this can be short)
#   probe_max=S  the longest of the probe writes (4 KiB, O_DIRECT, through
#                the map into its last MiB, which ext4 leaves free, every
#                0.25 s during the run): how long one I/O was held, e.g.
#                on a lost path until it failed over; probes=N of them,
#                probe_errors=E failed (must be 0)
#   failed_max=K/N  the most paths multipathd had failed at once
#   dm_errors=E  kernel log lines of I/O errors on the map or ext4 errors
#                (must be 0: an error the guest's filesystem saw)
#   path_errors=P  kernel log lines of I/O errors on the member paths
#                (sdX: failed over by dm-multipath, invisible above it)
# and "PATHS-ACTIVE LABEL after S s" once every path is active again (the
# next run waits for that, up to 120 s).
RA_LIST=${RA_LIST:-256 16384}
BONNIE_SIZE=${BONNIE_SIZE:-128}
BONNIE_RAM=${BONNIE_RAM:-64}

n=0
for p in $PORTALS; do
	run iscsi_login "$p" "$IQN" "${CHAP_USER:-}" "${CHAP_SECRET:-}" || fail "login at $p"
	n=$((n + 1))
done
wait_disks "$n" 30 || fail "not $n SCSI disks after $n logins: $(iscsi_disks | tr '\n' ' ')"
mp_start || fail "multipathd did not start"
wait_for 30 sh -c "[ \$(multipathd show paths raw format '%d %t' | grep -c ' active\$') -ge $n ]" ||
	fail "not $n active paths: $(multipathd show paths 2>&1)"
map=$(mp_map)
[ -n "$map" ] || fail "no multipath map"
dev=/dev/mapper/$map
dm=$(basename "$(ls -d /sys/block/dm-* | head -1)")
run multipath -ll
say "MAP $map paths=$n $(grep -o "policy='[^']*'" /tmp/run.out | head -1) $(grep -o "features='[^']*'" /tmp/run.out | head -1)"

# bonnie++ sizes its file from the RAM it is told (-r, twice that), not
# from what the guest has: pin the guest's memory beyond BONNIE_RAM (plus
# a margin for the kernel and the tools) in a tmpfs, so that the page
# cache cannot hold the file and its reads go to the disk, where
# read-ahead matters.
avail=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
pin=$((avail - BONNIE_RAM - 32))
if [ "$pin" -gt 0 ]; then
	mkdir -p /pin
	mount -t tmpfs -o size="${pin}m" tmpfs /pin && dd if=/dev/zero of=/pin/mem bs=1M count="$pin" 2>/dev/null
fi
say "MEM available=${avail}MiB pinned=${pin}MiB left=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)MiB bonnie_ram=${BONNIE_RAM}MiB"

# ext4 leaves the map's last MiB to the probe (below).
sectors=$(blockdev --getsz "$dev")
fskb=$((sectors / 2 - 1024))
probe_seek=$((sectors / 8 - 256)) # in 4 KiB blocks: the last MiB
mke2fs -q -t ext4 "$dev" "$fskb" >/dev/null 2>&1 || mke2fs -q "$dev" "$fskb" || fail "mke2fs $dev"
mkdir -p /mnt
# The runs: one per read-ahead, and with CUT_RA set one more, labelled
# "cut", with that read-ahead, during which the host cuts a path.
runs=
for ra in $RA_LIST; do runs="$runs $ra:$ra"; done
[ -n "${CUT_RA:-}" ] && runs="$runs cut:$CUT_RA"
for r in $runs; do
	label=${r%%:*} ra=${r#*:}
	# The read-ahead of the map and of every path under it.
	blockdev --setra "$ra" "$dev"
	for d in $(iscsi_disks); do blockdev --setra "$ra" "/dev/$d"; done
	mount -t ext4 "$dev" /mnt 2>/dev/null || mount "$dev" /mnt || fail "mount $dev"
	dmesg -c >/dev/null 2>&1
	# Samplers: every 0.5 s the uptime and the map's stat line (reads
	# completed is field 1, writes completed field 5, in flight field 9),
	# every second the failed path count.
	rm -f /tmp/io.log /tmp/paths.log /tmp/probe.log /tmp/probe.err /tmp/sampler.stop
	# Two loops: multipathd's answers wait while its checker is stuck on
	# the lost path, and must not hold up the stat samples.
	(
		while [ ! -e /tmp/sampler.stop ]; do
			t=$(cut -d' ' -f1 /proc/uptime)
			for d in $dm; do echo "$t $d $(cat /sys/block/$d/stat)"; done >>/tmp/io.log
			sleep 0.5
		done
	) &
	sampler=$!
	(
		while [ ! -e /tmp/sampler.stop ]; do
			out=$(multipathd show paths raw format '%d %t' 2>/dev/null) && [ -n "$out" ] &&
				echo "$out" | grep -c ' failed$' >>/tmp/paths.log
			sleep 1
		done
	) &
	psampler=$!
	# The probe: one 4 KiB O_DIRECT write through the map every 0.25 s,
	# timed. Round-robin sends successive probes down different paths, so
	# one of them waits on a lost path for as long as any I/O does; bonnie++
	# writes through the page cache and its own latencies do not show that.
	(
		while [ ! -e /tmp/sampler.stop ]; do
			t0=$(cut -d' ' -f1 /proc/uptime)
			dd if=/dev/zero of="$dev" bs=4k count=1 seek="$probe_seek" oflag=direct 2>/dev/null || echo "probe write failed" >>/tmp/probe.err
			echo "$t0 $(cut -d' ' -f1 /proc/uptime)" >>/tmp/probe.log
			sleep 0.25
		done
	) &
	prober=$!
	say "BONNIE-RUNNING ra=$ra run=$label"
	rc=0
	bonnie++ -d /mnt -s "$BONNIE_SIZE" -r "$BONNIE_RAM" -n 0 -f -u root -q >/tmp/bonnie.csv 2>/tmp/bonnie.err || rc=$?
	touch /tmp/sampler.stop
	wait $sampler $psampler $prober
	echo "VMSAN-BONNIE-$label-BEGIN"
	tail -1 /tmp/bonnie.csv
	echo "VMSAN-BONNIE-$label-END"
	# The longest time the map had requests in flight and completed none.
	stalls=$(awk -v dm="$dm" '{
			d = $2; ios = $3 + $7
			if (!(d in prev) || ios != prev[d]) { last[d] = $1 } else if ($11 > 0 && $1 - last[d] > max[d]) { max[d] = $1 - last[d] }
			prev[d] = ios
		}
		END { printf "map_stall=%.1f", max[dm] }' /tmp/io.log)
	probe=$(awk '$2 - $1 > max { max = $2 - $1 } END { printf "probe_max=%.2f probes=%d", max, NR }' /tmp/probe.log)
	probe_err=$([ -e /tmp/probe.err ] && wc -l </tmp/probe.err || echo 0)
	maxfailed=$(sort -n /tmp/paths.log | tail -1)
	dmerr=$(dmesg | grep -E "(I/O error|critical).* dev(ice)? dm-|EXT4-fs (error|warning)" | tee /tmp/dmerr | wc -l)
	patherr=$(dmesg | grep -E "I/O error.*dev sd|rejecting I/O|Failing path" | wc -l)
	say "RUN $label ra=$ra rc=$rc $stalls $probe probe_errors=$probe_err failed_max=${maxfailed:-?}/$n dm_errors=$dmerr path_errors=$patherr"
	[ "$dmerr" = 0 ] || sed 's/^/  [dm-error] /' /tmp/dmerr
	[ "$rc" = 0 ] || fail "bonnie++ run $label: $(tail -3 /tmp/bonnie.err)"
	[ "$probe_err" = 0 ] || fail "probe writes failed in run $label"
	umount /mnt || fail "umount"
	t0=$(cut -d. -f1 /proc/uptime)
	wait_for 120 sh -c "[ \$(multipathd show paths raw format '%d %t' | grep -c ' active\$') -ge $n ]" ||
		fail "not $n active paths again: $(multipathd show paths 2>&1)"
	say "PATHS-ACTIVE $label after $(($(cut -d. -f1 /proc/uptime) - t0))s"
done
run multipath -ll
multipath -F >/dev/null 2>&1
for p in $PORTALS; do
	run iscsi_logout "$p" "$IQN" || say "logout at $p failed"
done
