# Guest side of TestGuestMultipath (sourced by the iSCSI guest's /init; see
# login.sh). Two paths to one LU (PORTAL and PORTAL2, the same target
# reached through two host ports), dm-multipath over them, and an O_DIRECT
# writer that must not see an error while the host cuts the first path and
# later restores it. The guest drives the sequence and the host reacts to
# its lines:
#   WRITER-RUNNING  -> the host cuts path 1 (closes its connections, refuses new ones)
#   IO-CONTINUES    -> the host restores path 1
# Settings from /test.env: PORTAL PORTAL2 IQN CHAP_USER CHAP_SECRET
# SLOTS (4 MiB slots the writer cycles through) and WAIT (seconds each
# stage may take).

for p in "$PORTAL" "$PORTAL2"; do
	run iscsi_login "$p" "$IQN" "$CHAP_USER" "$CHAP_SECRET" || fail "login at $p"
done
wait_disks 2 30 || fail "not two SCSI disks after two logins: $(iscsi_disks | tr '\n' ' ')"
mp_start || fail "multipathd did not start"

# paths_in STATE: how many paths multipathd reports in dm state STATE.
paths_in() { multipathd show paths raw format "%d %t" 2>/dev/null | grep -c " $1\$"; }
wait_for "$WAIT" sh -c '[ "$(multipathd show paths raw format "%d %t" | grep -c " active$")" -ge 2 ]' ||
	fail "two active paths never showed: $(multipathd show paths 2>&1)"
map=$(mp_map)
[ -n "$map" ] || fail "no multipath map"
dev=/dev/mapper/$map
[ -b "$dev" ] || dev=/dev/$(basename "$(readlink -f /sys/block/dm-0)")
run multipath -ll
say "MAP $map paths=$(paths_in active) hwhandler=$(sed -n "s/.*hwhandler='\([^']*\)'.*/\1/p" /tmp/run.out | head -1) groups=$(grep -c 'policy=' /tmp/run.out) dh_alua=$([ -d /sys/module/scsi_dh_alua ] && echo 1 || echo 0)"

# The writer: the 4 MiB pattern into slot k (offset 4k MiB) as 64 KiB
# O_DIRECT writes, k = 0, 1, ..., SLOTS-1, 0, ... until /tmp/stop exists.
# It logs each slot it completes to /tmp/slots and stops at the first error.
rm -f /tmp/stop /tmp/slots /tmp/writer.err
(
	k=0
	while [ ! -e /tmp/stop ]; do
		if ! dd if=/pattern.bin of="$dev" bs=64k seek=$((k * 64)) oflag=direct 2>/tmp/writer.dd; then
			echo "slot $k: $(cat /tmp/writer.dd)" >/tmp/writer.err
			break
		fi
		echo "$k $(cut -d' ' -f1 /proc/uptime)" >>/tmp/slots
		k=$(((k + 1) % SLOTS))
	done
) &
writer=$!
slots() { [ -e /tmp/slots ] && wc -l </tmp/slots || echo 0; }
# after_slots N: wait until N more slots complete (or the writer fails).
after_slots() {
	want=$(($(slots) + $1))
	wait_for "$WAIT" sh -c "[ -e /tmp/writer.err ] || [ \$(wc -l </tmp/slots) -ge $want ]"
	[ -e /tmp/writer.err ] && fail "WRITE-ERROR $(cat /tmp/writer.err)"
	[ "$(slots)" -ge "$want" ] || fail "the writer stalled at $(slots) slots"
}
after_slots 2
say "WRITER-RUNNING slots=$(slots)"

t0=$(date +%s)
wait_for "$WAIT" sh -c '[ "$(multipathd show paths raw format "%d %t" | grep -c " failed$")" -ge 1 ]' ||
	fail "no path failed after the cut: $(multipathd show paths 2>&1)"
say "PATH-FAILED after $(($(date +%s) - t0))s active=$(paths_in active)"
after_slots 3
say "IO-CONTINUES slots=$(slots) $(($(date +%s) - t0))s after the cut"

t1=$(date +%s)
wait_for "$WAIT" sh -c '[ "$(multipathd show paths raw format "%d %t" | grep -c " active$")" -ge 2 ]' ||
	fail "the path did not return: $(multipathd show paths 2>&1)"
say "PATH-RESTORED after $(($(date +%s) - t1))s"
after_slots 2
touch /tmp/stop
wait $writer
[ -e /tmp/writer.err ] && fail "WRITE-ERROR $(cat /tmp/writer.err)"
n=$(slots)
run multipath -ll

# Every slot written at least once holds the pattern (O_DIRECT reads through the map).
used=$SLOTS
[ "$n" -lt "$SLOTS" ] && used=$n
k=0
while [ $k -lt $used ]; do
	dd if="$dev" of=/tmp/readback bs=64k skip=$((k * 64)) count=64 iflag=direct 2>/tmp/dd.err || fail "read slot $k: $(cat /tmp/dd.err)"
	cmp -s /tmp/readback /pattern.bin || fail "slot $k differs from the pattern"
	k=$((k + 1))
done
say "VERIFY-OK slots_written=$n slots_verified=$used"
# The longest time between two completed slots: how long the writer was
# held up by the failover (a slot takes a fraction of a second otherwise).
say "MAX-STALL $(awk 'NR > 1 && $2 - prev > max { max = $2 - prev; at = NR } { prev = $2 } END { printf "%.1fs before slot %d", max, at }' /tmp/slots) (uptime stamps: $(awk '{ printf "%s ", $2 }' /tmp/slots))"

multipath -F >/dev/null 2>&1
for p in "$PORTAL" "$PORTAL2"; do
	run iscsi_logout "$p" "$IQN" || say "logout at $p failed"
done
