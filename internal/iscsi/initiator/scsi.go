package initiator

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
)

var be = binary.BigEndian

// SCSI operation codes this package sends (SBC-3, SPC-4).
const (
	opTestUnitReady  = 0x00
	opInquiry        = 0x12
	opRead16         = 0x88
	opWrite16        = 0x8a
	opSyncCache16    = 0x91
	opWriteSame16    = 0x93
	opServiceIn16    = 0x9e
	saReadCapacity16 = 0x10
	opUnmap          = 0x42
	opReportLUNs     = 0xa0
)

// CheckError is a command that ended with a status other than GOOD.
type CheckError struct {
	Op     byte
	Status pdu.SCSIStatus
	Sense  []byte
}

// SenseKey, ASC and ASCQ decode fixed (0x70/0x71) or descriptor
// (0x72/0x73) sense data; zero when absent.
func (e *CheckError) SenseKey() (key, asc, ascq byte) {
	s := e.Sense
	if len(s) == 0 {
		return
	}
	switch s[0] & 0x7f {
	case 0x70, 0x71:
		if len(s) > 2 {
			key = s[2] & 0x0f
		}
		if len(s) > 13 {
			asc, ascq = s[12], s[13]
		}
	case 0x72, 0x73:
		if len(s) > 3 {
			key, asc, ascq = s[1]&0x0f, s[2], s[3]
		}
	}
	return
}

func (e *CheckError) Error() string {
	k, a, q := e.SenseKey()
	return fmt.Sprintf("iscsi: SCSI op %#02x: %s (sense key %#x, ASC/ASCQ %02x/%02x)", e.Op, e.Status, k, a, q)
}

// Check turns a non-GOOD response into a *CheckError.
func Check(cdb []byte, r Response, err error) error {
	if err != nil {
		return err
	}
	if r.Response != pdu.CommandCompletedAtTarget {
		return fmt.Errorf("iscsi: SCSI op %#02x: %s", cdb[0], r.Response)
	}
	if r.Status != pdu.StatusGood {
		return &CheckError{Op: cdb[0], Status: r.Status, Sense: r.Sense}
	}
	return nil
}

// Retry policy of LU's commands. A target answers BUSY or TASK SET FULL
// when it cannot take more work just now (vmsan's target does when its
// in-flight byte budget is spent), and UNIT ATTENTION once after events
// such as a capacity change or a reset; like the Linux sd driver, the LU
// methods retry those instead of failing the caller's I/O.
const (
	// busyTimeout bounds the retries of one command on BUSY / TASK SET FULL.
	busyTimeout = 30 * time.Second
	// maxUnitAttentions is how many UNIT ATTENTIONs in a row one command
	// absorbs.
	maxUnitAttentions = 3
)

// do runs cdb on the LU, retrying BUSY, TASK SET FULL (with backoff from
// 1 ms up to 100 ms, for at most busyTimeout) and UNIT ATTENTION (up to
// maxUnitAttentions times).
func (l *LU) do(ctx context.Context, cdb, out, in []byte) (Response, error) {
	var deadline time.Time
	backoff := time.Millisecond
	uas := 0
	for {
		r, err := l.s.Command(ctx, l.lun, cdb, out, in)
		if err != nil {
			return r, err
		}
		switch r.Status {
		case pdu.StatusBusy, pdu.StatusTaskSetFull:
			if deadline.IsZero() {
				deadline = time.Now().Add(busyTimeout)
			} else if time.Now().After(deadline) {
				return r, Check(cdb, r, nil)
			}
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 100*time.Millisecond)
			continue
		case pdu.StatusCheckCondition:
			ce := &CheckError{Sense: r.Sense}
			if k, _, _ := ce.SenseKey(); k == senseUnitAttention && uas < maxUnitAttentions {
				uas++
				continue
			}
		}
		return r, Check(cdb, r, nil)
	}
}

// senseUnitAttention is sense key 6h.
const senseUnitAttention = 0x6

// LU is one logical unit of a session, with its capacity.
type LU struct {
	s         *Session
	lun       uint64
	blockSize int
	blocks    uint64
	lbpme     bool
}

// EncodeLUN returns the 8-byte LUN field for a LUN number (SAM-5
// peripheral addressing below 256, flat space addressing above).
func EncodeLUN(n uint16) uint64 {
	if n < 256 {
		return uint64(n) << 48
	}
	return uint64(0x4000|n&0x3fff) << 48
}

// LU returns logical unit n after READ CAPACITY(16). A unit attention
// left by the login (power on / reset) is cleared with TEST UNIT READY
// first (LU methods retry unit attentions, see do).
func (s *Session) LU(ctx context.Context, n uint16) (*LU, error) {
	lu := &LU{s: s, lun: EncodeLUN(n)}
	cdb := []byte{opTestUnitReady, 0, 0, 0, 0, 0}
	if _, err := lu.do(ctx, cdb, nil, nil); err != nil {
		return nil, err
	}
	buf := make([]byte, 32)
	cdb = make([]byte, 16)
	cdb[0], cdb[1] = opServiceIn16, saReadCapacity16
	be.PutUint32(cdb[10:], uint32(len(buf)))
	r, err := lu.do(ctx, cdb, nil, buf)
	if err != nil {
		return nil, err
	}
	if r.DataIn < 12 {
		return nil, fmt.Errorf("iscsi: READ CAPACITY(16) returned %d bytes", r.DataIn)
	}
	lu.blocks = be.Uint64(buf[0:]) + 1
	lu.blockSize = int(be.Uint32(buf[8:]))
	if lu.blockSize < 512 || lu.blockSize > 1<<20 || lu.blockSize&(lu.blockSize-1) != 0 {
		return nil, fmt.Errorf("iscsi: READ CAPACITY(16): block size %d", lu.blockSize)
	}
	lu.lbpme = r.DataIn > 14 && buf[14]&0x80 != 0
	return lu, nil
}

// Size is the capacity in bytes.
func (l *LU) Size() int64 { return int64(l.blocks) * int64(l.blockSize) }

// BlockSize is the logical block length.
func (l *LU) BlockSize() int { return l.blockSize }

// ThinProvisioned reports READ CAPACITY(16)'s LBPME bit (UNMAP works).
func (l *LU) ThinProvisioned() bool { return l.lbpme }

// Session is the session the LU belongs to.
func (l *LU) Session() *Session { return l.s }

func (l *LU) span(n int, off int64) (lba uint64, blocks uint32, err error) {
	bs := int64(l.blockSize)
	if off < 0 || off%bs != 0 || int64(n)%bs != 0 {
		return 0, 0, fmt.Errorf("iscsi: I/O [%d,+%d) not aligned to the %d-byte block", off, n, bs)
	}
	if off+int64(n) > l.Size() {
		return 0, 0, fmt.Errorf("iscsi: I/O [%d,+%d) beyond the %d-byte LU", off, n, l.Size())
	}
	if int64(n)/bs > 1<<32-1 {
		return 0, 0, fmt.Errorf("iscsi: I/O of %d bytes too long for one command", n)
	}
	return uint64(off / bs), uint32(int64(n) / bs), nil
}

func rw16(op byte, lba uint64, blocks uint32, fua bool) []byte {
	cdb := make([]byte, 16)
	cdb[0] = op
	if fua {
		cdb[1] = 0x08
	}
	be.PutUint64(cdb[2:], lba)
	be.PutUint32(cdb[10:], blocks)
	return cdb
}

// ReadAtContext reads len(p) bytes at off with READ(16).
// REQUIRES: off and len(p) are multiples of BlockSize.
func (l *LU) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	lba, n, err := l.span(len(p), off)
	if err != nil || n == 0 {
		return 0, err
	}
	cdb := rw16(opRead16, lba, n, false)
	r, err := l.do(ctx, cdb, nil, p)
	if err != nil {
		return 0, err
	}
	if r.DataIn != len(p) {
		return r.DataIn, fmt.Errorf("iscsi: READ(16) moved %d of %d bytes", r.DataIn, len(p))
	}
	return len(p), nil
}

// WriteAtContext writes p at off with WRITE(16) (FUA when fua).
func (l *LU) WriteAtContext(ctx context.Context, p []byte, off int64, fua bool) (int, error) {
	lba, n, err := l.span(len(p), off)
	if err != nil || n == 0 {
		return 0, err
	}
	cdb := rw16(opWrite16, lba, n, fua)
	r, err := l.do(ctx, cdb, p, nil)
	if err != nil {
		return 0, err
	}
	if r.Underflow && r.Residual > 0 {
		return len(p) - int(r.Residual), fmt.Errorf("iscsi: WRITE(16) residual %d", r.Residual)
	}
	return len(p), nil
}

// ReadAt implements io.ReaderAt.
func (l *LU) ReadAt(p []byte, off int64) (int, error) {
	return l.ReadAtContext(context.Background(), p, off)
}

// WriteAt implements io.WriterAt.
func (l *LU) WriteAt(p []byte, off int64) (int, error) {
	return l.WriteAtContext(context.Background(), p, off, false)
}

// Flush sends SYNCHRONIZE CACHE(16) for the whole LU.
func (l *LU) Flush() error {
	cdb := make([]byte, 16)
	cdb[0] = opSyncCache16
	_, err := l.do(context.Background(), cdb, nil, nil)
	return err
}

// Unmap deallocates [off, off+n) with one UNMAP block descriptor.
func (l *LU) Unmap(ctx context.Context, off, n int64) error {
	lba, blocks, err := l.span(int(n), off)
	if err != nil || blocks == 0 {
		return err
	}
	param := make([]byte, 24)
	be.PutUint16(param[0:], 22)
	be.PutUint16(param[2:], 16)
	be.PutUint64(param[8:], lba)
	be.PutUint32(param[16:], blocks)
	cdb := make([]byte, 10)
	cdb[0] = opUnmap
	be.PutUint16(cdb[7:], uint16(len(param)))
	_, err = l.do(ctx, cdb, param, nil)
	return err
}

// WriteSame writes block (one logical block) over [off, off+n) with WRITE
// SAME(16); unmap sets the UNMAP bit (the target may deallocate the range
// if block is all zeroes).
func (l *LU) WriteSame(ctx context.Context, block []byte, off, n int64, unmap bool) error {
	if len(block) != l.blockSize {
		return fmt.Errorf("iscsi: WRITE SAME block of %d bytes, LU block size %d", len(block), l.blockSize)
	}
	lba, blocks, err := l.span(int(n), off)
	if err != nil || blocks == 0 {
		return err
	}
	cdb := rw16(opWriteSame16, lba, blocks, false)
	if unmap {
		cdb[1] |= 0x08
	}
	_, err = l.do(ctx, cdb, block, nil)
	return err
}

// Inquiry returns the standard INQUIRY data (evpd false) or VPD page
// page (evpd true), at most 255 bytes.
func (l *LU) Inquiry(ctx context.Context, evpd bool, page byte) ([]byte, error) {
	buf := make([]byte, 255)
	cdb := []byte{opInquiry, 0, 0, 0, byte(len(buf)), 0}
	if evpd {
		cdb[1], cdb[2] = 1, page
	}
	r, err := l.do(ctx, cdb, nil, buf)
	if err != nil {
		return nil, err
	}
	return buf[:r.DataIn], nil
}

// ReportLUNs returns the LUN numbers REPORT LUNS lists (peripheral and
// flat space addressing; other address methods are skipped).
func (s *Session) ReportLUNs(ctx context.Context) ([]uint16, error) {
	buf := make([]byte, 8+8*256)
	cdb := make([]byte, 12)
	cdb[0] = opReportLUNs
	be.PutUint32(cdb[6:], uint32(len(buf)))
	r, err := s.Command(ctx, 0, cdb, nil, buf)
	if err := Check(cdb, r, err); err != nil {
		return nil, err
	}
	if r.DataIn < 8 {
		return nil, fmt.Errorf("iscsi: REPORT LUNS returned %d bytes", r.DataIn)
	}
	n := min(int(be.Uint32(buf)), r.DataIn-8) / 8
	var out []uint16
	for i := 0; i < n; i++ {
		e := buf[8+8*i:]
		switch e[0] >> 6 {
		case 0: // peripheral device addressing, bus 0
			if e[0]&0x3f == 0 {
				out = append(out, uint16(e[1]))
			}
		case 1: // flat space addressing
			out = append(out, uint16(e[0]&0x3f)<<8|uint16(e[1]))
		}
	}
	return out, nil
}

// FirstDisk returns the first LUN whose standard INQUIRY names a
// direct-access block device (peripheral qualifier 0, type 0): tgt lists
// a controller at LUN 0 before its disks.
func (s *Session) FirstDisk(ctx context.Context) (uint16, error) {
	luns, err := s.ReportLUNs(ctx)
	if err != nil {
		return 0, err
	}
	for _, n := range luns {
		lu := &LU{s: s, lun: EncodeLUN(n)}
		inq, err := lu.Inquiry(ctx, false, 0)
		if err == nil && len(inq) > 0 && inq[0] == 0 {
			return n, nil
		}
	}
	return 0, fmt.Errorf("iscsi: no direct-access LUN among %v", luns)
}
