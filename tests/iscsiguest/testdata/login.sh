# Guest side of TestGuestLogin (sourced by the iSCSI guest's /init, whose
# helpers it uses; settings come from /test.env). One path, CHAP:
# discovery, a login with a wrong secret that must be refused, the real
# login, SCSI identity and persistent reservations with sg3-utils, an
# O_DIRECT pattern round trip, a discard, logout. Each step reports a
# VMSAN-GUEST line that the host test checks.
P=$PORTAL

# Every carried program starts (its libraries and loader are in the image).
for c in "iscsiadm --version" "iscsid --version" "multipath -h" "multipathd -h" "mpathpersist -h" \
	"dmsetup --version" "sg_inq --version" "sg_vpd --version" "sg_persist --version" "sg_rtpg --version" \
	"sg_turs --version" "sg_readcap --version" "sg_luns --version" "sg_reset --version" "bonnie++ -h"; do
	# shellcheck disable=SC2086
	$c >/tmp/tool.out 2>&1
	rc=$?
	# 127: not found; 126: not executable; the loader's "error while
	# loading shared libraries" for a missing library.
	if [ $rc -ge 126 ] || grep -q 'error while loading' /tmp/tool.out; then
		fail "${c%% *} does not run (exit $rc): $(head -3 /tmp/tool.out)"
	fi
done
say "TOOLS-OK"

# Discovery, with CHAP where the target asks for it (DISC_USER set;
# mutual when DISC_MUTUAL_USER is set too): a wrong secret is refused
# and lists nothing, the right one lists the target.
if [ -n "${DISC_USER:-}" ]; then
	if run iscsi_discover "$P" "$DISC_USER" "$DISC_BAD_SECRET" "${DISC_MUTUAL_USER:-}" "${DISC_MUTUAL_SECRET:-}"; then
		fail "discovery with a wrong CHAP secret succeeded"
	fi
	grep -q " $IQN\$" /tmp/run.out && fail "discovery with a wrong CHAP secret lists $IQN"
	say "DISC-CHAP-REFUSED"
	run iscsi_discover "$P" "$DISC_USER" "$DISC_SECRET" "${DISC_MUTUAL_USER:-}" "${DISC_MUTUAL_SECRET:-}" || fail "discovery with CHAP"
else
	run iscsi_discover "$P" || fail "discovery"
fi
grep -q " $IQN\$" /tmp/run.out && say "DISCOVERY-OK $(tr '\n' ' ' </tmp/run.out)" || fail "discovery does not list $IQN"

# A wrong CHAP secret must be refused (login status 0201), leaving no session.
if run iscsi_login "$P" "$IQN" "$CHAP_USER" "$BAD_SECRET"; then
	fail "login with a wrong CHAP secret succeeded"
fi
iscsiadm -m node -T "$IQN" -p "$P" -o delete >/dev/null 2>&1
iscsiadm -m session >/dev/null 2>&1 && fail "a session exists after the refused login"
say "CHAP-REFUSED"

start=$(date +%s)
run iscsi_login "$P" "$IQN" "$CHAP_USER" "$CHAP_SECRET" || fail "login"
wait_disks 1 30 || fail "no SCSI disk after login"
d=$(iscsi_disks | head -1)
dev=/dev/$d
say "LOGIN-OK disk=$d in $(($(date +%s) - start))s sectors=$(cat /sys/block/$d/size) discard_max_bytes=$(cat /sys/block/$d/queue/discard_max_bytes)"

run sg_inq "$dev" || fail "sg_inq"
v=$(sed -n 's/^ *Vendor identification: *//p' /tmp/run.out | sed 's/ *$//')
p=$(sed -n 's/^ *Product identification: *//p' /tmp/run.out | sed 's/ *$//')
say "INQUIRY vendor=$v product=$p"
run sg_vpd -p 0x83 "$dev" || fail "sg_vpd 0x83"
grep -q 'designator type: NAA' /tmp/run.out && say "VPD83-NAA $(cat /sys/block/$d/device/wwid)" || fail "no NAA designator in VPD 0x83"
run sg_vpd -p 0xb0 "$dev" && say "VPD-B0-OK" || say "VPD-B0-MISSING"

# Persistent reservations: register a key, reserve (write exclusive),
# read both back, release, unregister.
run sg_persist --out --register --param-sark=0x7e57 "$dev" || fail "PR register"
run sg_persist --in --read-keys "$dev" || fail "PR read keys"
grep -q '0x7e57' /tmp/run.out || fail "registered key 0x7e57 not listed"
run sg_persist --out --reserve --param-rk=0x7e57 --prout-type=1 "$dev" || fail "PR reserve"
run sg_persist --in --read-reservation "$dev" || fail "PR read reservation"
grep -q 'Key=0x7e57' /tmp/run.out || fail "reservation by 0x7e57 not listed"
run sg_persist --out --release --param-rk=0x7e57 --prout-type=1 "$dev" || fail "PR release"
run sg_persist --out --register --param-rk=0x7e57 --param-sark=0 "$dev" || fail "PR unregister"
run sg_persist --in --read-keys "$dev" || fail "PR read keys"
grep -q '0x7e57' /tmp/run.out && fail "key 0x7e57 still registered"
say "PR-OK"

# The pattern at 1 MiB, O_DIRECT both ways.
dd if=/pattern.bin of="$dev" bs=64k seek=16 oflag=direct conv=fsync 2>/tmp/dd.err || fail "pattern write: $(cat /tmp/dd.err)"
dd if="$dev" of=/tmp/readback bs=64k skip=16 count=64 iflag=direct 2>/tmp/dd.err || fail "pattern read: $(cat /tmp/dd.err)"
cmp -s /tmp/readback /pattern.bin || fail "pattern read back differs"
say "PATTERN-OK off=1MiB len=4MiB"

# Discard: the pattern again at 8 MiB, then discard its first 2 MiB; the
# host checks that those bytes read as zero in the backing file and that
# the other 2 MiB are still the pattern.
dd if=/pattern.bin of="$dev" bs=64k seek=128 oflag=direct conv=fsync 2>/tmp/dd.err || fail "pattern write at 8 MiB: $(cat /tmp/dd.err)"
run blkdiscard -o $((8 << 20)) -l $((2 << 20)) "$dev" || fail "blkdiscard"
say "DISCARD-OK off=8MiB len=2MiB"

run iscsi_logout "$P" "$IQN" || fail "logout"
iscsiadm -m session >/dev/null 2>&1 && fail "a session exists after logout"
say "LOGOUT-OK"
iscsiadm -m node -T "$IQN" -p "$P" -o delete >/dev/null 2>&1

# relogin: log in again (no other session) and set $dev.
relogin() {
	run iscsi_login "$P" "$IQN" "$CHAP_USER" "$CHAP_SECRET" || fail "login ($1)"
	wait_disks 1 30 || fail "no SCSI disk after login ($1)"
	dev=/dev/$(iscsi_disks | head -1)
}
# check_pattern SEEK64K WHAT: the pattern reads back at SEEK64K 64 KiB blocks.
check_pattern() {
	dd if="$dev" of=/tmp/readback bs=64k skip="$1" count=64 iflag=direct 2>/tmp/dd.err || fail "read ($2): $(cat /tmp/dd.err)"
	cmp -s /tmp/readback /pattern.bin || fail "pattern differs ($2)"
}

# Restart: the host stops the target gracefully and starts it again on the
# same data; the pattern written before must read back. Then kill -9: the
# pattern at 16 MiB written with O_DIRECT and fsync (the kernel's cache
# flush, SYNCHRONIZE CACHE, acknowledged before dd exits), the target
# killed and started again while the session is logged in; the session
# recovers on its own (within replacement_timeout: REPLACEMENT_TIMEOUT in
# /test.env) and both patterns must read back. A target that cannot be
# restarted answers SKIP. (busybox dd has no oflag=sync for FUA writes.)
ask RESTART || fail "no answer to ASK RESTART"
if [ "$ANSWER" = RESTARTED ]; then
	relogin "after restart"
	check_pattern 16 "after restart"
	say "RESTART-OK"
	dd if=/pattern.bin of="$dev" bs=64k seek=256 oflag=direct conv=fsync 2>/tmp/dd.err || fail "pattern write at 16 MiB: $(cat /tmp/dd.err)"
	ask KILL || fail "no answer to ASK KILL"
	[ "$ANSWER" = KILLED ] || fail "host: $ANSWER"
	check_pattern 256 "after kill -9"
	check_pattern 16 "after kill -9"
	say "KILL-OK"
	run iscsi_logout "$P" "$IQN" || fail "logout after kill -9"
	iscsiadm -m node -T "$IQN" -p "$P" -o delete >/dev/null 2>&1
else
	say "RESTART-SKIPPED $ANSWER"
fi

# A short session for golden PDU vectors: bursts and data segments of 512
# bytes (the least RFC 7143 allows), so that a 2 KiB write shows immediate
# data, R2Ts and Data-Outs, and a 2 KiB read several Data-Ins, each PDU
# small enough to keep; mutual CHAP where the target has an answer
# (MUTUAL_USER); 5 s idle so that NOP-Outs (open-iscsi's ping) and the
# target's NOP-Ins pass; a LUN RESET task management request (sg_reset
# -d: the kernel's device reset, which iscsi_tcp sends as a TMF).
iscsiadm -m node -o new -T "$IQN" -p "$P" >/dev/null || fail "node record"
for kv in node.session.iscsi.FirstBurstLength=512 node.session.iscsi.MaxBurstLength=512 \
	"node.conn[0].iscsi.MaxRecvDataSegmentLength=512"; do
	iscsiadm -m node -T "$IQN" -p "$P" -o update -n "${kv%%=*}" -v "${kv#*=}" || fail "node update $kv"
done
run iscsi_login "$P" "$IQN" "$CHAP_USER" "$CHAP_SECRET" "${MUTUAL_USER:-}" "${MUTUAL_SECRET:-}" || fail "login (small bursts)"
wait_disks 1 30 || fail "no SCSI disk after login (small bursts)"
dev=/dev/$(iscsi_disks | head -1)
dd if=/pattern.bin of="$dev" bs=2k count=1 seek=10240 oflag=direct 2>/tmp/dd.err || fail "2 KiB write: $(cat /tmp/dd.err)"
dd if="$dev" of=/tmp/small bs=2k count=1 skip=10240 iflag=direct 2>/tmp/dd.err || fail "2 KiB read: $(cat /tmp/dd.err)"
head -c 2048 /pattern.bin | cmp -s - /tmp/small || fail "2 KiB read back differs"
sleep 5
run sg_reset -d "$dev" || fail "sg_reset -d (LUN RESET)"
run sg_turs "$dev" || run sg_turs "$dev" || fail "TEST UNIT READY after the LUN RESET"
run iscsi_logout "$P" "$IQN" || fail "logout (small bursts)"
say "SMALL-BURST-OK"
