package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/initiator"
)

func init() {
	RegisterScheme("iscsi", openISCSI)
}

// ISCSIInfo is what was negotiated with an iSCSI target.
type ISCSIInfo struct {
	Target                   string `json:"target"`
	LUN                      uint16 `json:"lun"`
	Portal                   string `json:"portal"`
	CHAP                     bool   `json:"chap"`
	MutualCHAP               bool   `json:"mutual_chap"`
	HeaderDigest             bool   `json:"header_digest_crc32c"`
	DataDigest               bool   `json:"data_digest_crc32c"`
	ImmediateData            bool   `json:"immediate_data"`
	InitialR2T               bool   `json:"initial_r2t"`
	FirstBurstLength         uint64 `json:"first_burst_length"`
	MaxBurstLength           uint64 `json:"max_burst_length"`
	MaxRecvDataSegmentLength uint64 `json:"max_recv_data_segment_length"`
	// TargetMaxRecvDataSegmentLength is what the target declared: the
	// largest Data-Out/immediate data PDU it accepts.
	TargetMaxRecvDataSegmentLength uint64 `json:"target_max_recv_data_segment_length"`
	BlockSize                      int    `json:"block_size"`
	// Sessions is the number of sessions (one connection each) used.
	Sessions int `json:"sessions"`
}

// iscsiTarget benchmarks one LUN through the in-repo initiator: one
// session (one connection) by default, like open-iscsi, or
// TargetOptions.Connections sessions used in turn; the runner's QD
// goroutines each block in ReadAt/WriteAt while each session pipelines
// their commands within the target's CmdSN window. SYNCHRONIZE CACHE on
// one session flushes the logical unit's cache, which every session
// shares (SBC-3), so Flush uses the first.
type iscsiTarget struct {
	ss    []*initiator.Session
	lus   []*initiator.LU
	next  atomic.Uint32
	maxIO int
	info  TargetInfo
}

// maxISCSISessions bounds --connections for iscsi://.
const maxISCSISessions = 16

func (t *iscsiTarget) pick() *initiator.LU {
	if len(t.lus) == 1 {
		return t.lus[0]
	}
	return t.lus[int(t.next.Add(1))%len(t.lus)]
}

func openISCSI(ctx context.Context, _ *url.URL, raw string, o TargetOptions) (Target, error) {
	u, err := initiator.ParseURI(raw)
	if err != nil {
		return nil, err
	}
	n := max(o.Connections, 1)
	if n > maxISCSISessions {
		return nil, fmt.Errorf("bench: --connections %d: at most %d iSCSI sessions", n, maxISCSISessions)
	}
	t := &iscsiTarget{}
	for i := 0; i < n; i++ {
		s, err := initiator.Dial(ctx, u.Addr, u.Config)
		if err != nil {
			t.closeAll()
			return nil, err
		}
		t.ss = append(t.ss, s)
		lu, err := s.LU(ctx, u.LUN)
		if err != nil {
			err = noLUNError(ctx, s, u, err)
			t.closeAll()
			return nil, err
		}
		t.lus = append(t.lus, lu)
	}
	s, lu := t.ss[0], t.lus[0]
	// Block Limits VPD (B0h): MAXIMUM TRANSFER LENGTH in blocks, 0 = no
	// limit. Targets without the page simply have no stated limit.
	if b0, err := lu.Inquiry(ctx, true, 0xb0); err == nil && len(b0) >= 12 {
		if n := binary.BigEndian.Uint32(b0[8:]); n > 0 && int64(n)*int64(lu.BlockSize()) < 1<<30 {
			t.maxIO = int(n) * lu.BlockSize()
		}
	}
	p := s.Params()
	t.info = TargetInfo{
		URI: redactISCSI(raw, u), Kind: "iscsi", Size: lu.Size(), ReadOnly: o.ReadOnly,
		ISCSI: &ISCSIInfo{
			Target: u.TargetName, LUN: u.LUN, Portal: u.Addr, CHAP: u.User != "", MutualCHAP: u.TargetUser != "",
			HeaderDigest: p.HeaderDigest, DataDigest: p.DataDigest, ImmediateData: p.ImmediateData, InitialR2T: p.InitialR2T,
			FirstBurstLength: p.FirstBurstLength, MaxBurstLength: p.MaxBurstLength,
			MaxRecvDataSegmentLength: p.MaxRecvDataSegmentLength, TargetMaxRecvDataSegmentLength: p.PeerMaxRecvDataSegmentLength,
			BlockSize: lu.BlockSize(), Sessions: n,
		},
	}
	return t, nil
}

// noLUNError words the sense LOGICAL UNIT NOT SUPPORTED (05/25/00), a
// LUN number the target does not have (a typo in the URL), as such, with
// the LUNs it has (REPORT LUNS); any other error is returned as it is.
func noLUNError(ctx context.Context, s *initiator.Session, u *initiator.URI, err error) error {
	var ce *initiator.CheckError
	if !errors.As(err, &ce) {
		return err
	}
	if k, asc, ascq := ce.SenseKey(); k != 0x05 || asc != 0x25 || ascq != 0 {
		return err
	}
	msg := fmt.Sprintf("bench: no LUN %d on this target (%s at %s)", u.LUN, u.TargetName, u.Addr)
	if luns, lerr := s.ReportLUNs(ctx); lerr == nil && len(luns) > 0 {
		l := make([]string, len(luns))
		for i, n := range luns {
			l[i] = strconv.Itoa(int(n))
		}
		msg += "; it has LUN " + strings.Join(l, ", ")
	}
	return errors.New(msg)
}

// redactISCSI keeps CHAP secrets out of results: they are saved to JSON
// files and printed.
func redactISCSI(raw string, u *initiator.URI) string {
	if u.User == "" && u.TargetSecret == "" {
		return raw
	}
	s := "iscsi://" + u.User + "%***@" + u.Addr + "/" + u.TargetName + "/" + strconv.Itoa(int(u.LUN))
	if u.TargetUser != "" {
		s += "?target_user=" + url.QueryEscape(u.TargetUser) + "&target_password=***"
	}
	return s
}

func (t *iscsiTarget) ReadAt(p []byte, off int64) (int, error)  { return t.pick().ReadAt(p, off) }
func (t *iscsiTarget) WriteAt(p []byte, off int64) (int, error) { return t.pick().WriteAt(p, off) }
func (t *iscsiTarget) Flush() error                             { return t.lus[0].Flush() }
func (t *iscsiTarget) Size() int64                              { return t.lus[0].Size() }
func (t *iscsiTarget) Align() int                               { return t.lus[0].BlockSize() }
func (t *iscsiTarget) MaxIO() int                               { return t.maxIO }
func (t *iscsiTarget) Info() TargetInfo                         { return t.info }

// Close logs every session out (a clean end for the target's session
// accounting) and closes the connections.
func (t *iscsiTarget) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var first error
	for _, s := range t.ss {
		if err := s.Logout(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (t *iscsiTarget) closeAll() {
	for _, s := range t.ss {
		s.Close()
	}
}
