# /test.sh for the iSCSI guest (scripts/guest/build.sh --iscsi), for
# scenario 000: bonnie++ on ext4 over a dm-multipath map of the target's
# LU reached through every portal in PORTALS, once per read-ahead value in
# RA_LIST. Sourced by the guest's /init, whose helpers it uses.
#
# /test.env: PORTALS ("10.0.2.2:P1 10.0.2.2:P2 ...", as the guest reaches
# them), IQN, CHAP_USER/CHAP_SECRET (optional), RA_LIST (read-ahead in
# 512-byte sectors, default "256 16384", the values of the field case),
# BONNIE_SIZE and BONNIE_RAM (MiB; bonnie++ wants a file of twice the RAM
# it is told about; default 128 and 64), MP_VENDOR/MP_PRODUCT.
# /mp-device.conf, if the host adds it: the multipath.conf devices section
# to use instead of init-iscsi's (the scenario passes what
# `vmsan iscsi multipath-conf` prints, with the field case's path
# selector); init-iscsi's defaults and blacklist (no udev in the guest)
# stay.
#
# Console output: "VMSAN-GUEST: BONNIE-RUNNING ra=N" when each run starts
# (a scenario that cuts a path mid-run waits for it), each run's bonnie++
# CSV line between "VMSAN-BONNIE-N-BEGIN" and "VMSAN-BONNIE-N-END", then
# "RUN ra=N ..." with what the guest saw of the map during the run:
#   stall=S      the longest time (s, sampled every 0.5 s) the map had
#                requests in flight and completed none: a path failover
#   min_active=K/N  the fewest active paths seen
#   dm_errors=E  kernel log lines of I/O errors on the map or ext4 errors
#                (must be 0: an error the guest's filesystem saw)
#   path_errors=P  kernel log lines of I/O errors on the member paths
#                (sdX: failed over by dm-multipath, invisible above it)
# and "PATHS-ACTIVE ra=N after S s" once every path is active again (the
# next run waits for that, up to 120 s).
RA_LIST=${RA_LIST:-256 16384}
BONNIE_SIZE=${BONNIE_SIZE:-128}
BONNIE_RAM=${BONNIE_RAM:-64}

if [ -f /mp-device.conf ]; then
	sed '/^devices {/,$d' /etc/multipath.conf >/tmp/mp.conf
	cat /mp-device.conf >>/tmp/mp.conf
	cp /tmp/mp.conf /etc/multipath.conf
fi

n=0
for p in $PORTALS; do
	run iscsi_login "$p" "$IQN" "${CHAP_USER:-}" "${CHAP_SECRET:-}" || fail "login at $p"
	n=$((n + 1))
done
wait_disks "$n" 30 || fail "not $n SCSI disks after $n logins: $(iscsi_disks | tr '\n' ' ')"
mp_start || fail "multipathd did not start"
active_paths() { multipathd show paths raw format '%d %t' 2>/dev/null | grep -c ' active$'; }
wait_for 30 sh -c "[ \$(multipathd show paths raw format '%d %t' | grep -c ' active\$') -ge $n ]" ||
	fail "not $n active paths: $(multipathd show paths 2>&1)"
map=$(mp_map)
[ -n "$map" ] || fail "no multipath map"
dev=/dev/mapper/$map
dm=$(basename "$(ls -d /sys/block/dm-* | head -1)")
run multipath -ll
say "MAP $map paths=$n $(grep -o "policy='[^']*'" /tmp/run.out | head -1) $(grep -o "features='[^']*'" /tmp/run.out | head -1)"

mke2fs -q -t ext4 "$dev" >/dev/null 2>&1 || mke2fs -q "$dev" || fail "mke2fs $dev"
mkdir -p /mnt
for ra in $RA_LIST; do
	# The read-ahead of the map and of every path under it.
	blockdev --setra "$ra" "$dev"
	for d in $(iscsi_disks); do blockdev --setra "$ra" "/dev/$d"; done
	mount -t ext4 "$dev" /mnt 2>/dev/null || mount "$dev" /mnt || fail "mount $dev"
	dmesg -c >/dev/null 2>&1
	# Sampler: uptime and the map's stat (reads completed is field 1,
	# writes completed field 5, in flight field 9) every 0.5 s, and the
	# active path count every second.
	rm -f /tmp/io.log /tmp/paths.log /tmp/sampler.stop
	(
		i=0
		while [ ! -e /tmp/sampler.stop ]; do
			echo "$(cut -d' ' -f1 /proc/uptime) $(cat /sys/block/$dm/stat)" >>/tmp/io.log
			[ $((i % 2)) = 0 ] && active_paths >>/tmp/paths.log
			i=$((i + 1))
			sleep 0.5
		done
	) &
	sampler=$!
	say "BONNIE-RUNNING ra=$ra"
	rc=0
	bonnie++ -d /mnt -s "$BONNIE_SIZE" -r "$BONNIE_RAM" -n 0 -f -u root -q >/tmp/bonnie.csv 2>/tmp/bonnie.err || rc=$?
	touch /tmp/sampler.stop
	wait $sampler
	echo "VMSAN-BONNIE-$ra-BEGIN"
	tail -1 /tmp/bonnie.csv
	echo "VMSAN-BONNIE-$ra-END"
	stall=$(awk '{ ios = $2 + $6; if (NR == 1 || ios != prev) { last = $1 } else if ($10 > 0 && $1 - last > max) { max = $1 - last } prev = ios }
		END { printf "%.1f", max }' /tmp/io.log)
	minact=$(sort -n /tmp/paths.log | head -1)
	dmerr=$(dmesg | grep -E "(I/O error|critical).*dev dm-|EXT4-fs (error|warning)|Buffer I/O error on dev dm-" | tee /tmp/dmerr | wc -l)
	patherr=$(dmesg | grep -E "I/O error.*dev sd|rejecting I/O|Failing path" | wc -l)
	say "RUN ra=$ra rc=$rc stall=$stall min_active=${minact:-?}/$n dm_errors=$dmerr path_errors=$patherr"
	[ "$dmerr" = 0 ] || sed 's/^/  [dm-error] /' /tmp/dmerr
	[ "$rc" = 0 ] || fail "bonnie++ ra=$ra: $(tail -3 /tmp/bonnie.err)"
	umount /mnt || fail "umount"
	t0=$(cut -d. -f1 /proc/uptime)
	wait_for 120 sh -c "[ \$(multipathd show paths raw format '%d %t' | grep -c ' active\$') -ge $n ]" ||
		fail "not $n active paths again: $(multipathd show paths 2>&1)"
	say "PATHS-ACTIVE ra=$ra after $(($(cut -d. -f1 /proc/uptime) - t0))s"
done
run multipath -ll
multipath -F >/dev/null 2>&1
for p in $PORTALS; do
	run iscsi_logout "$p" "$IQN" || say "logout at $p failed"
done
