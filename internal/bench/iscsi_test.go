package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/initiator"
	"github.com/vmsan/vmsan/internal/iscsi/tgtd"
	"github.com/vmsan/vmsan/internal/testutil"
)

// startTgt exports a fresh sparse file from tgt (a target we did not
// write) as LUN 1.
func startTgt(t *testing.T, size int64, o tgtd.Options) *tgtd.Server {
	t.Helper()
	testutil.NeedTool(t, "tgtd")
	testutil.NeedTool(t, "tgtadm")
	// tgtd takes its management lock under /var/run/tgtd.
	testutil.NeedRoot(t, "tgtd's management IPC")
	f := filepath.Join(testutil.DiskTempDir(t), "lun.img")
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
	t.Cleanup(srv.Stop)
	return srv
}

// tgtCounters sums tgt's completed read and write bytes on LUN 1 over all
// sessions.
func tgtCounters(t *testing.T, srv *tgtd.Server) (read, written uint64) {
	t.Helper()
	st, err := srv.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range st {
		if x.LUN == 1 {
			read += x.ReadBytes
			written += x.WriteBytes
		}
	}
	return read, written
}

// TestISCSITgtProfiles runs every profile over iscsi:// against tgt and
// checks that the bytes the benchmark says it moved are the bytes tgt
// says it read and wrote (tgt's per-LUN counters, taken just before and
// after the profile so that login-time commands such as READ CAPACITY
// do not count).
func TestISCSITgtProfiles(t *testing.T) {
	for _, prof := range Profiles {
		t.Run(prof, func(t *testing.T) {
			srv := startTgt(t, 32<<20, tgtd.Options{User: "bench", Secret: "bench-secret-1"})
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			uri := fmt.Sprintf("iscsi://bench%%bench-secret-1@%s/%s/1", srv.Addr, srv.IQN)
			tg, err := OpenTarget(ctx, uri, TargetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			in := tg.Info()
			if in.Kind != "iscsi" || in.Size != 32<<20 || in.ISCSI == nil || !in.ISCSI.CHAP || strings.Contains(in.URI, "secret") {
				t.Fatalf("info %+v", in)
			}
			r0, w0 := tgtCounters(t, srv)
			res, err := RunProfile(ctx, tg, quickOpts(prof), nil)
			if err != nil {
				t.Fatal(err)
			}
			r1, w1 := tgtCounters(t, srv)
			if err := tg.Close(); err != nil {
				t.Fatal(err)
			}
			tot := res.Totals
			t.Logf("%s: bench read %d wrote %d; tgt read %d wrote %d", prof, tot.BytesRead, tot.BytesWritten, r1-r0, w1-w0)
			if uint64(tot.BytesRead) != r1-r0 || uint64(tot.BytesWritten) != w1-w0 {
				t.Fatalf("bench read %d wrote %d, tgt read %d wrote %d", tot.BytesRead, tot.BytesWritten, r1-r0, w1-w0)
			}
			if tot.BytesRead+tot.BytesWritten == 0 {
				t.Fatal("nothing moved")
			}
		})
	}
}

// TestISCSIExecute is `vmsan bench --profile cdm iscsi://...` end to end
// (the table printed, the result saved), and a refused URI.
func TestISCSIExecute(t *testing.T) {
	srv := startTgt(t, 16<<20, tgtd.Options{})
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := RunConfig{Target: fmt.Sprintf("iscsi://%s/%s/1", srv.Addr, srv.IQN), Out: filepath.Join(dir, "r.json"),
		Options: Options{Profile: ProfileCDM, Passes: 1, PassTime: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Area: 8 << 20}}
	if err := Execute(context.Background(), cfg, out, devNull(t)); err != nil {
		t.Fatal(err)
	}
	out.Close()
	b, _ := os.ReadFile(filepath.Join(dir, "stdout"))
	for _, want := range []string{"iSCSI LUN 1", "SEQ    1MiB (Q=  8, T= 1):", "RND    4KiB (Q= 32, T= 1):"} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("table lacks %q:\n%s", want, b)
		}
	}
	r, err := LoadResult(cfg.Out)
	if err != nil || r.Target.ISCSI == nil || r.Target.ISCSI.Target != srv.IQN {
		t.Fatalf("saved result: %+v %v", r, err)
	}
	for _, bad := range []string{
		fmt.Sprintf("iscsi://%s/%s", srv.Addr, srv.IQN),           // no LUN
		fmt.Sprintf("iscsi://%s/%s/1?bogus=1", srv.Addr, srv.IQN), // unknown parameter
		fmt.Sprintf("iscsi://%s/iqn.2026-11.org.vmsan:nonesuch/1", srv.Addr),
	} {
		if _, err := OpenTarget(context.Background(), bad, TargetOptions{}); err == nil {
			t.Fatalf("%s: opened", bad)
		}
	}
}

func TestParseISCSIURI(t *testing.T) {
	u, err := initiator.ParseURI("iscsi://al%ice%se:cret@[::1]:3261/iqn.2026-11.x:y/3?target_user=t&target_password=pw&header_digest=crc32c-none")
	if err != nil {
		t.Fatal(err)
	}
	if u.User != "al" || u.Secret != "ice%se:cret" || u.Addr != "[::1]:3261" || u.TargetName != "iqn.2026-11.x:y" || u.LUN != 3 ||
		u.TargetUser != "t" || u.TargetSecret != "pw" || u.HeaderDigest != "CRC32C,None" {
		t.Fatalf("%+v", u)
	}
	u, err = initiator.ParseURI("iscsi://host/iqn.a:b/0")
	if err != nil || u.Addr != "host:3260" || u.LUN != 0 || u.User != "" {
		t.Fatalf("%+v %v", u, err)
	}
	for _, bad := range []string{"iscsi:///iqn/1", "iscsi://h/iqn/x", "iscsi://h/iqn/99999", "iscsi://%s@h/iqn/1", "nbd://h/x"} {
		if _, err := initiator.ParseURI(bad); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

// TestISCSISessions spreads a job over three sessions (--connections 3):
// tgt must see three sessions move data, and its counters must still sum
// to what the benchmark reports.
func TestISCSISessions(t *testing.T) {
	srv := startTgt(t, 16<<20, tgtd.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tg, err := OpenTarget(ctx, fmt.Sprintf("iscsi://%s/%s/1", srv.Addr, srv.IQN), TargetOptions{Connections: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if n := tg.Info().ISCSI.Sessions; n != 3 {
		t.Fatalf("%d sessions", n)
	}
	r0, w0 := tgtCounters(t, srv)
	res, err := RunProfile(ctx, tg, quickOpts(ProfileJob), nil)
	if err != nil {
		t.Fatal(err)
	}
	r1, w1 := tgtCounters(t, srv)
	if uint64(res.Totals.BytesRead) != r1-r0 || uint64(res.Totals.BytesWritten) != w1-w0 {
		t.Fatalf("bench read %d wrote %d, tgt read %d wrote %d", res.Totals.BytesRead, res.Totals.BytesWritten, r1-r0, w1-w0)
	}
	st, err := srv.Stats()
	if err != nil {
		t.Fatal(err)
	}
	busy := map[int]bool{}
	for _, x := range st {
		if x.LUN == 1 && x.ReadCmds+x.WriteCmds > 10 {
			busy[x.Session] = true
		}
	}
	if len(busy) != 3 {
		t.Fatalf("sessions that moved data: %v (stats %+v)", busy, st)
	}
	if _, err := OpenTarget(ctx, fmt.Sprintf("iscsi://%s/%s/1", srv.Addr, srv.IQN), TargetOptions{Connections: 17}); err == nil {
		t.Fatal("17 sessions accepted")
	}
}
