# Guest side of TestGuestPairFailover (sourced by the iSCSI guest's /init;
# see login.sh). One logical unit presented by a replicated pair: PORTAL
# reaches node a (the primary: its port group active/optimized), PORTAL2
# node b (the secondary: standby). dm-multipath over both, an O_DIRECT
# writer, and the host kills the primary and promotes the secondary while
# the writer runs. The guest drives the sequence and the host reacts to its
# lines:
#   WRITER-RUNNING  -> the host kill -9's node a, then promotes node b
#   IO-CONTINUES    -> the host restarts node a (it comes back secondary)
# The writer fills slot 0, 1, 2, ... (SLOT_KB each, never one twice: an
# unwritten slot is zeroes, so a lost write cannot hide behind an older
# copy) with the slice of /pattern.bin at (slot mod slices) and prints
# "A <slot>" when the write is acknowledged; the host keeps those lines.
# Settings from /test.env: PORTAL PORTAL2 IQN SLOTS SLOT_KB WAIT.

# paths: "dev dm-state checker-state prio" for every path multipathd knows.
paths() { multipathd show paths raw format "%d %t %T %p" 2>/dev/null; }
# path_is DEV DM CHECKER [PRIO]: the path is in that state.
path_is() { paths | grep -q "^$1 $2 $3 ${4:-.*}\$"; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }

# One login at a time, so that each disk is known to be its node's.
run iscsi_login "$PORTAL" "$IQN" || fail "login at $PORTAL (node a)"
wait_disks 1 30 || fail "no SCSI disk after the login at node a"
DEV_A=$(iscsi_disks)
run iscsi_login "$PORTAL2" "$IQN" || fail "login at $PORTAL2 (node b)"
wait_disks 2 30 || fail "no second SCSI disk after the login at node b"
DEV_B=$(iscsi_disks | grep -vx "$DEV_A")
say "DISKS a=$DEV_A b=$DEV_B"
mp_start || fail "multipathd did not start"

# One map; node a's path up with the active/optimized priority (50),
# node b's a ghost (tur: NOT READY 04/0B) with the standby priority (1).
wait_for "$WAIT" sh -c "multipathd show paths raw format '%d %t %T %p' | grep -q '^$DEV_A active ready 50\$' &&
	multipathd show paths raw format '%d %t %T %p' | grep -q '^$DEV_B active ghost 1\$'" ||
	fail "paths never became a=active/ready/50 b=active/ghost/1: $(paths | tr '\n' ';') $(multipathd show paths 2>&1)"
map=$(mp_map)
[ -n "$map" ] || fail "no multipath map"
dev=/dev/mapper/$map
[ -b "$dev" ] || fail "no $dev"
run multipath -ll
say "MAP $map maps=$(dmsetup ls --target multipath | wc -l) groups=$(grep -c 'policy=' /tmp/run.out) hwhandler=$(sed -n "s/.*hwhandler='\([^']*\)'.*/\1/p" /tmp/run.out | head -1) dh_alua=$([ -d /sys/module/scsi_dh_alua ] && echo 1 || echo 0) paths=$(paths | tr ' \n' ':,')"

# rtpg DEV: the port groups as REPORT TARGET PORT GROUPS on that path
# gives them: "id:state ..." (state as the ALUA code, 0x0 active/optimized,
# 0x2 standby, 0xe transitioning).
rtpg() {
	sg_rtpg "/dev/$1" >/tmp/rtpg.out 2>&1 || { sed 's/^/  [sg_rtpg] /' /tmp/rtpg.out >&2; return 1; }
	sed 's/^/  [sg_rtpg] /' /tmp/rtpg.out >&2
	awk '/target port group id/ { id = $6 } /asymmetric access state/ { printf "%s:%s ", id, $NF }' /tmp/rtpg.out
}
say "RTPG a $(rtpg "$DEV_A")"
say "RTPG b $(rtpg "$DEV_B")"

rm -f /tmp/stop /tmp/slots /tmp/writer.err
slices=$((4096 / SLOT_KB))
(
	k=0
	while [ ! -e /tmp/stop ] && [ $k -lt "$SLOTS" ]; do
		if ! dd if=/pattern.bin of="$dev" bs="${SLOT_KB}k" skip=$((k % slices)) seek=$k count=1 \
			oflag=direct 2>/tmp/writer.dd; then
			echo "slot $k: $(cat /tmp/writer.dd)" >/tmp/writer.err
			say "WRITE-ERROR slot $k"
			break
		fi
		echo "$k $(uptime_s)" >>/tmp/slots
		echo "VMSAN-GUEST: A $k"
		k=$((k + 1))
	done
	[ $k -ge "$SLOTS" ] && echo full >/tmp/writer.full
) &
writer=$!
slots() { [ -e /tmp/slots ] && wc -l </tmp/slots || echo 0; }
# after_slots N: wait until N more slots complete (or the writer fails).
after_slots() {
	want=$(($(slots) + $1))
	wait_for "$WAIT" sh -c "[ -e /tmp/writer.err ] || [ -e /tmp/writer.full ] || [ \$(wc -l </tmp/slots) -ge $want ]"
	[ -e /tmp/writer.err ] && fail "WRITE-ERROR $(cat /tmp/writer.err)"
	[ -e /tmp/writer.full ] && fail "the writer filled all $SLOTS slots: raise SLOTS"
	[ "$(slots)" -ge "$want" ] || fail "the writer stalled at $(slots) slots: $(paths | tr '\n' ';')"
}
after_slots 4
# The path group statuses once I/O has run (before, none is "active").
run multipath -ll
say "GROUPS $(grep 'policy=' /tmp/run.out | sed "s/.*prio=\([0-9]*\) status=\([a-z]*\).*/prio=\1:\2/" | tr '\n' ' ')"
say "WRITER-RUNNING slots=$(slots) uptime=$(uptime_s)"

# Node a is killed: its path fails (the session's recovery timeout, then
# dm-multipath fails it); the writer's I/O queues (b is standby) until
# the promote makes b active/optimized.
wait_for "$WAIT" path_is "$DEV_A" failed '[a-z]*' ||
	fail "node a's path did not fail: $(paths | tr '\n' ';')"
say "PATH-FAILED a uptime=$(uptime_s) paths=$(paths | tr ' \n' ':,')"
wait_for "$WAIT" path_is "$DEV_B" active ready 50 ||
	fail "node b's path did not become active/ready/50: $(paths | tr '\n' ';')"
say "PATH-ACTIVE b uptime=$(uptime_s)"
after_slots 4
say "IO-CONTINUES slots=$(slots) uptime=$(uptime_s)"

# Node a restarts as secondary: iscsid logs back in (same session), its
# path comes back as a ghost with the standby priority; I/O stays on b.
wait_for "$WAIT" path_is "$DEV_A" active ghost 1 || {
	# Each distinct line once (a wedged reconnect repeats one line every
	# 2 s), and the kernel's view of the connections.
	awk '!seen[$0]++' /tmp/iscsid.log | tail -150 | sed 's/^/  [iscsid] /'
	dmesg 2>/dev/null | grep -i 'connection[0-9]' | tail -40 | sed 's/^/  [dmesg] /'
	fail "node a's path did not come back as a ghost: $(paths | tr '\n' ';')"
}
say "PATH-GHOST a uptime=$(uptime_s)"
after_slots 4
touch /tmp/stop
wait $writer
[ -e /tmp/writer.err ] && fail "WRITE-ERROR $(cat /tmp/writer.err)"
n=$(slots)
run multipath -ll
say "GROUPS-AFTER $(grep 'policy=' /tmp/run.out | sed "s/.*prio=\([0-9]*\) status=\([a-z]*\).*/prio=\1:\2/" | tr '\n' ' ')"
say "RTPG-AFTER a $(rtpg "$DEV_A")"
say "RTPG-AFTER b $(rtpg "$DEV_B")"

# Every acknowledged slot holds its slice of the pattern (O_DIRECT reads
# through the map, now node b).
k=0
while [ $k -lt "$n" ]; do
	dd if="$dev" of=/tmp/readback bs="${SLOT_KB}k" skip=$k count=1 iflag=direct 2>/tmp/dd.err ||
		fail "read slot $k: $(cat /tmp/dd.err)"
	dd if=/pattern.bin of=/tmp/want bs="${SLOT_KB}k" skip=$((k % slices)) count=1 2>/dev/null
	cmp -s /tmp/readback /tmp/want || fail "slot $k differs from the pattern"
	k=$((k + 1))
done
say "VERIFY-OK slots=$n"
# The longest time between two acknowledged slots (the failover stall).
say "MAX-STALL $(awk 'NR > 1 && $2 - prev > max { max = $2 - prev; at = $1 } { prev = $2 } END { printf "%.1fs before slot %d", max, at }' /tmp/slots)"

multipath -F >/dev/null 2>&1
for p in "$PORTAL" "$PORTAL2"; do
	run iscsi_logout "$p" "$IQN" || say "logout at $p failed"
done
