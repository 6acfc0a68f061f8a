package pdu

// Serial number arithmetic (RFC 1982 with SERIAL_BITS = 32), which RFC
// 7143 4.2.2.1 prescribes for CmdSN, ExpCmdSN, MaxCmdSN, StatSN and
// DataSN comparisons. Two numbers exactly 2^31 apart are incomparable:
// neither is less than the other.

// SNLess reports whether a < b in serial arithmetic.
func SNLess(a, b uint32) bool {
	d := b - a
	return d != 0 && d < 1<<31
}

// SNGreater reports whether a > b in serial arithmetic.
func SNGreater(a, b uint32) bool { return SNLess(b, a) }

// SNLessEq reports whether a <= b in serial arithmetic.
func SNLessEq(a, b uint32) bool { return a == b || SNLess(a, b) }

// SNInWindow reports whether lo <= sn <= hi in serial arithmetic: the test
// a target applies to a non-immediate CmdSN against ExpCmdSN..MaxCmdSN.
// RFC 7143 4.2.2.1: MaxCmdSN = ExpCmdSN - 1 means the window is empty
// (then no sn is inside).
func SNInWindow(sn, lo, hi uint32) bool {
	return SNLessEq(lo, sn) && SNLessEq(sn, hi) && hi != lo-1
}

// SNDistance returns b - a, the number of increments from a to b.
func SNDistance(a, b uint32) uint32 { return b - a }
