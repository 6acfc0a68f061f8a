# /test.sh for the iSCSI guest (scripts/guest/build.sh --iscsi), for
# scenario 000: bonnie++ on ext4 over a dm-multipath map of the target's
# LU reached through every portal in PORTALS, once per read-ahead value in
# RA_LIST. Sourced by the guest's /init, whose helpers it uses.
#
# /test.env: PORTALS ("10.0.2.2:P1 10.0.2.2:P2", as the guest reaches
# them), IQN, CHAP_USER/CHAP_SECRET (optional), RA_LIST (read-ahead in
# 512-byte sectors, default "256 16384", the values of the field case),
# BONNIE_SIZE and BONNIE_RAM (MiB; bonnie++ wants a file of twice the RAM
# it is told about; default 128 and 64), MP_VENDOR/MP_PRODUCT.
#
# Console output: "VMSAN-GUEST: BONNIE-RUNNING ra=N" when each run starts
# (a scenario that cuts a path mid-run waits for it), and each run's
# bonnie++ CSV line between "VMSAN-BONNIE-N-BEGIN" and "VMSAN-BONNIE-N-END".
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
run multipath -ll
say "MAP $map paths=$n"

mke2fs -q -t ext4 "$dev" >/dev/null 2>&1 || mke2fs -q "$dev" || fail "mke2fs $dev"
mkdir -p /mnt
for ra in $RA_LIST; do
	# The read-ahead of the map and of every path under it.
	blockdev --setra "$ra" "$dev"
	for d in $(iscsi_disks); do blockdev --setra "$ra" "/dev/$d"; done
	mount -t ext4 "$dev" /mnt 2>/dev/null || mount "$dev" /mnt || fail "mount $dev"
	say "BONNIE-RUNNING ra=$ra"
	bonnie++ -d /mnt -s "$BONNIE_SIZE" -r "$BONNIE_RAM" -n 1 -u root -q >/tmp/bonnie.csv 2>/tmp/bonnie.err ||
		fail "bonnie++ ra=$ra: $(tail -3 /tmp/bonnie.err)"
	echo "VMSAN-BONNIE-$ra-BEGIN"
	tail -1 /tmp/bonnie.csv
	echo "VMSAN-BONNIE-$ra-END"
	umount /mnt || fail "umount"
done
run multipath -ll
multipath -F >/dev/null 2>&1
for p in $PORTALS; do
	run iscsi_logout "$p" "$IQN" || say "logout at $p failed"
done
