package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/initiator"
	"github.com/vmsan/vmsan/internal/iscsi/tgtd"
	"github.com/vmsan/vmsan/internal/testutil"
)

// startTgt exports a fresh file of size bytes from tgtd (a target we did
// not write) and returns the server and the file's path.
func startTgt(t *testing.T, size int64, o tgtd.Options) (*tgtd.Server, string) {
	t.Helper()
	testutil.NeedTool(t, "tgtd")
	testutil.NeedTool(t, "tgtadm")
	// tgtd takes its management lock under /var/run/tgtd.
	testutil.NeedRoot(t, "tgtd's management IPC")
	f := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f, size); err != nil {
		t.Fatal(err)
	}
	o.Files = []string{f}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := tgtd.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Stop()
		if t.Failed() {
			t.Logf("tgtd output:\n%s", srv.Output())
		}
	})
	return srv, f
}

func dialLU(t *testing.T, srv *tgtd.Server, cfg initiator.Config) (*initiator.Session, *initiator.LU) {
	t.Helper()
	cfg.TargetName = srv.IQN
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, srv.Addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	lu, err := s.LU(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return s, lu
}

func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestTgtReadWrite writes and reads back through tgt with each write path
// the negotiation can select (R2T only; immediate + unsolicited Data-Out;
// neither immediate nor unsolicited) and both digest settings, checks the
// bytes landed in the backing file, and that tgt counted what we moved.
func TestTgtReadWrite(t *testing.T) {
	cases := []struct {
		name   string
		params map[string]string
		cfg    initiator.Config
	}{
		{"defaults", nil, initiator.Config{}},
		{"unsolicited", map[string]string{"InitialR2T": "No", "MaxRecvDataSegmentLength": "65536", "FirstBurstLength": "131072"}, initiator.Config{}},
		{"r2t-only", nil, initiator.Config{NoImmediateData: true, InitialR2T: true}},
		{"crc32c", map[string]string{"HeaderDigest": "CRC32C,None", "DataDigest": "CRC32C,None"}, initiator.Config{HeaderDigest: "CRC32C", DataDigest: "CRC32C"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, file := startTgt(t, 16<<20, tgtd.Options{Params: c.params})
			s, lu := dialLU(t, srv, c.cfg)
			p := s.Params()
			t.Logf("negotiated: %+v", p)
			if c.cfg.HeaderDigest == "CRC32C" && (!p.HeaderDigest || !p.DataDigest) {
				t.Fatalf("digests not negotiated: %+v", p)
			}
			if lu.Size() != 16<<20 || lu.BlockSize() != 512 {
				t.Fatalf("LU %d bytes, blocks of %d", lu.Size(), lu.BlockSize())
			}
			// Sizes around every boundary: one block, the target's
			// MaxRecvDataSegmentLength, FirstBurstLength, MaxBurstLength
			// and several bursts.
			var wrote int64
			off := int64(0)
			for i, n := range []int{512, 8192, 8704, 65536, 131072 + 512, 262144, 1 << 20, 3<<20 + 4096} {
				w := pattern(uint64(i), n)
				if _, err := lu.WriteAt(w, off); err != nil {
					t.Fatalf("write %d at %d: %v", n, off, err)
				}
				r := make([]byte, n)
				if _, err := lu.ReadAt(r, off); err != nil {
					t.Fatalf("read %d at %d: %v", n, off, err)
				}
				if !bytes.Equal(r, w) {
					t.Fatalf("read back %d bytes at %d differ", n, off)
				}
				if err := lu.Flush(); err != nil {
					t.Fatal(err)
				}
				disk := make([]byte, n)
				fh, _ := os.Open(file)
				_, err := fh.ReadAt(disk, off)
				fh.Close()
				if err != nil || !bytes.Equal(disk, w) {
					t.Fatalf("backing file at %d does not hold what was written (%v)", off, err)
				}
				wrote += int64(n)
				off += int64(n)
			}
			st, err := srv.Stats()
			if err != nil {
				t.Fatal(err)
			}
			var tw, tr uint64
			for _, x := range st {
				if x.LUN == 1 {
					tw += x.WriteBytes
					tr += x.ReadBytes
				}
			}
			// Reads: the data plus READ CAPACITY(16)'s 32 bytes.
			if tw != uint64(wrote) || tr != uint64(wrote)+32 {
				t.Fatalf("tgt counted written %d read %d; we wrote %d read %d+32", tw, tr, wrote, wrote)
			}
			if sst := s.Stats(); sst.DataOut != uint64(wrote) || sst.DataIn != uint64(wrote)+32 {
				t.Fatalf("session stats %+v, wrote %d", sst, wrote)
			}
			if err := s.Ping(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := s.Logout(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTgtConcurrent has many goroutines issue writes and reads on one
// session at once (more than tgt's CmdSN window), each on its own region,
// and checks every byte.
func TestTgtConcurrent(t *testing.T) {
	srv, _ := startTgt(t, 64<<20, tgtd.Options{})
	s, lu := dialLU(t, srv, initiator.Config{})
	const workers, region = 160, 256 << 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			base := int64(w) * region
			r := rand.New(rand.NewPCG(uint64(w), 2))
			for i := 0; i < 12; i++ {
				n := (1 + r.IntN(64)) * 4096
				off := base + int64(r.IntN((region-n)/512+1))*512
				d := pattern(uint64(w*100+i), n)
				if _, err := lu.WriteAt(d, off); err != nil {
					errs <- err
					return
				}
				got := make([]byte, n)
				if _, err := lu.ReadAt(got, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, d) {
					errs <- errors.New("data mismatch")
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := s.Logout(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestTgtCHAP logs in with one-way and mutual CHAP, and checks that wrong
// secrets are refused on both sides: the target refusing ours with 0x0201,
// and the initiator refusing a target that does not know the mutual secret.
func TestTgtCHAP(t *testing.T) {
	srv, _ := startTgt(t, 1<<20, tgtd.Options{User: "alice", Secret: "alice-secret-1", TargetUser: "tgt", TargetSecret: "target-secret-2"})
	ctx := context.Background()
	good := initiator.Config{TargetName: srv.IQN, User: "alice", Secret: "alice-secret-1"}
	s, err := initiator.Dial(ctx, srv.Addr, good)
	if err != nil {
		t.Fatalf("one-way CHAP: %v", err)
	}
	s.Logout(ctx)
	mutual := good
	mutual.TargetUser, mutual.TargetSecret = "tgt", "target-secret-2"
	s, err = initiator.Dial(ctx, srv.Addr, mutual)
	if err != nil {
		t.Fatalf("mutual CHAP: %v", err)
	}
	if _, err := s.LU(ctx, 1); err != nil {
		t.Fatal(err)
	}
	s.Logout(ctx)
	// tgt cannot authenticate discovery sessions (no discovery accounts):
	// it lists targets without CHAP and refuses a CHAP offer. The CHAP
	// discovery path is checked against the fake target.
	ts, err := initiator.Discover(ctx, srv.Addr, initiator.Config{})
	if err != nil || len(ts) != 1 || ts[0].Name != srv.IQN || len(ts[0].Portals) != 1 || ts[0].Portals[0].Addr != srv.Addr {
		t.Fatalf("discovery: %+v %v", ts, err)
	}

	bad := good
	bad.Secret = "wrong-secret-3"
	_, err = initiator.Dial(ctx, srv.Addr, bad)
	var le *initiator.LoginError
	if !errors.As(err, &le) || !errors.Is(err, initiator.ErrAuth) {
		t.Fatalf("wrong secret: %v", err)
	}
	none := initiator.Config{TargetName: srv.IQN}
	if _, err = initiator.Dial(ctx, srv.Addr, none); err == nil {
		t.Fatal("login without CHAP to a target that requires it succeeded")
	}
	badTarget := mutual
	badTarget.TargetSecret = "not-the-target-4"
	if _, err = initiator.Dial(ctx, srv.Addr, badTarget); !errors.Is(err, initiator.ErrAuth) {
		t.Fatalf("target with the wrong mutual secret: %v", err)
	}
}

// TestTgtDiscoveryAndUnknownTarget lists targets and refuses a login to a
// target that does not exist with the target's 0x0203.
func TestTgtDiscoveryAndUnknownTarget(t *testing.T) {
	srv, _ := startTgt(t, 1<<20, tgtd.Options{})
	ctx := context.Background()
	ts, err := initiator.Discover(ctx, srv.Addr, initiator.Config{})
	if err != nil || len(ts) != 1 || ts[0].Name != srv.IQN || ts[0].Portals[0].Addr != srv.Addr || ts[0].Portals[0].Tag != 1 {
		t.Fatalf("discovery: %+v %v", ts, err)
	}
	_, err = initiator.Dial(ctx, srv.Addr, initiator.Config{TargetName: "iqn.2026-11.org.vmsan:nonesuch"})
	var le *initiator.LoginError
	if !errors.As(err, &le) || le.Status.Class() != 2 {
		t.Fatalf("unknown target: %v", err)
	}
}

// TestTgtReportLUNs finds tgt's disk behind its LUN 0 controller.
func TestTgtReportLUNs(t *testing.T) {
	srv, _ := startTgt(t, 1<<20, tgtd.Options{})
	s, err := initiator.Dial(context.Background(), srv.Addr, initiator.Config{TargetName: srv.IQN})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	luns, err := s.ReportLUNs(context.Background())
	if err != nil || len(luns) != 2 || luns[0] != 0 || luns[1] != 1 {
		t.Fatalf("REPORT LUNS: %v %v", luns, err)
	}
	if n, err := s.FirstDisk(context.Background()); err != nil || n != 1 {
		t.Fatalf("first disk: %d %v", n, err)
	}
}

// TestTgtUnmapWriteSame: on a thin-provisioned tgt LU, WRITE SAME(16)
// fills a range with one block's pattern, and UNMAP deallocates a range
// of the sparse backing file (it reads back as zeroes).
func TestTgtUnmapWriteSame(t *testing.T) {
	srv, file := startTgt(t, 8<<20, tgtd.Options{LUParams: "thin_provisioning=1"})
	s, lu := dialLU(t, srv, initiator.Config{})
	ctx := context.Background()
	if !lu.ThinProvisioned() {
		t.Fatal("READ CAPACITY(16) does not report LBPME")
	}
	block := bytes.Repeat([]byte{0xab}, lu.BlockSize())
	if err := lu.WriteSame(ctx, block, 1<<20, 1<<20, false); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1<<20)
	if _, err := lu.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{0xab}, 1<<20)) {
		t.Fatalf("WRITE SAME range does not hold the pattern (%v)", err)
	}
	if err := lu.Flush(); err != nil {
		t.Fatal(err)
	}
	alloc := func() int64 {
		var st syscall.Stat_t
		if err := syscall.Stat(file, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	before := alloc()
	if err := lu.Unmap(ctx, 1<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := lu.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, make([]byte, 1<<20)) {
		t.Fatalf("unmapped range does not read as zeroes (%v)", err)
	}
	if after := alloc(); after > before-(1<<20) {
		t.Fatalf("backing file allocation %d -> %d after unmapping 1 MiB", before, after)
	}
	s.Logout(ctx)
}
