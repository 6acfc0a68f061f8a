package bench

import (
	"context"
	"encoding/binary"
	"net/url"
	"strconv"
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
}

// iscsiTarget benchmarks one LUN through the in-repo initiator: one
// session, one connection; the runner's QD goroutines each block in
// ReadAt/WriteAt while the session pipelines their commands within the
// target's CmdSN window.
type iscsiTarget struct {
	s     *initiator.Session
	lu    *initiator.LU
	maxIO int
	info  TargetInfo
}

func openISCSI(ctx context.Context, _ *url.URL, raw string, o TargetOptions) (Target, error) {
	u, err := initiator.ParseURI(raw)
	if err != nil {
		return nil, err
	}
	s, err := initiator.Dial(ctx, u.Addr, u.Config)
	if err != nil {
		return nil, err
	}
	lu, err := s.LU(ctx, u.LUN)
	if err != nil {
		s.Close()
		return nil, err
	}
	t := &iscsiTarget{s: s, lu: lu}
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
			BlockSize: lu.BlockSize(),
		},
	}
	return t, nil
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

func (t *iscsiTarget) ReadAt(p []byte, off int64) (int, error)  { return t.lu.ReadAt(p, off) }
func (t *iscsiTarget) WriteAt(p []byte, off int64) (int, error) { return t.lu.WriteAt(p, off) }
func (t *iscsiTarget) Flush() error                             { return t.lu.Flush() }
func (t *iscsiTarget) Size() int64                              { return t.lu.Size() }
func (t *iscsiTarget) Align() int                               { return t.lu.BlockSize() }
func (t *iscsiTarget) MaxIO() int                               { return t.maxIO }
func (t *iscsiTarget) Info() TargetInfo                         { return t.info }

// Close logs out (a clean end for the target's session accounting) and
// closes the connection.
func (t *iscsiTarget) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return t.s.Logout(ctx)
}
