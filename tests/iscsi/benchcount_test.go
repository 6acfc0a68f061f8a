package iscsi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/bench"
)

// TestBenchByteCounts runs every `vmsan bench` profile over iscsi://
// against vmsan's target and checks that the bytes the benchmark reports
// are the bytes vmsan counted: the iSCSI front end's payload counters
// (vmsan_frontend_bytes_total{frontend="iscsi"}) and the volume's engine
// (vmsan_engine_bytes_total{volume="disk"}), read from the daemon's
// metrics endpoint just before and after each profile, so that login-time
// commands (INQUIRY, READ CAPACITY) do not count. The same check against
// tgt is internal/bench's TestISCSITgtProfiles.
func TestBenchByteCounts(t *testing.T) {
	t.Parallel()
	v := startVmsan(t, "")
	for _, prof := range bench.Profiles {
		t.Run(prof, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			tg, err := bench.OpenTarget(ctx, v.url("", 0), bench.TargetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if in := tg.Info(); in.Kind != "iscsi" || in.Size != volSize {
				t.Fatalf("info %+v", in)
			}
			m0 := scrape(t, v.metrics)
			res, err := bench.RunProfile(ctx, tg, quickBench(prof), nil)
			if err != nil {
				t.Fatal(err)
			}
			m1 := scrape(t, v.metrics)
			if err := tg.Close(); err != nil {
				t.Fatal(err)
			}
			d := func(name string) uint64 { return uint64(m1[name] - m0[name]) }
			feR, feW := d(`vmsan_frontend_bytes_total{direction="read",frontend="iscsi"}`), d(`vmsan_frontend_bytes_total{direction="write",frontend="iscsi"}`)
			enR, enW := d(`vmsan_engine_bytes_total{direction="read",volume="disk"}`), d(`vmsan_engine_bytes_total{direction="write",volume="disk"}`)
			tot := res.Totals
			t.Logf("%s: bench read %d wrote %d; iscsi front end sent %d received %d; engine read %d wrote %d",
				prof, tot.BytesRead, tot.BytesWritten, feR, feW, enR, enW)
			if uint64(tot.BytesRead) != feR || uint64(tot.BytesWritten) != feW {
				t.Errorf("bench read %d wrote %d, the iSCSI front end sent %d received %d", tot.BytesRead, tot.BytesWritten, feR, feW)
			}
			if uint64(tot.BytesRead) != enR || uint64(tot.BytesWritten) != enW {
				t.Errorf("bench read %d wrote %d, the volume's engine read %d wrote %d", tot.BytesRead, tot.BytesWritten, enR, enW)
			}
			if tot.BytesRead+tot.BytesWritten == 0 {
				t.Fatal("nothing moved")
			}
		})
	}
}

// quickBench is internal/bench's quick test options: every row runs, in
// well under a second each.
func quickBench(profile string) bench.Options {
	return bench.Options{Profile: profile, Force: true, Passes: 1, PassTime: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Area: 8 << 20,
		BonnieSize: 8 << 20, ChrSize: 64 << 10, Seeks: 200, Samples: 5, SampleSize: 1 << 20, AccessReads: 50, WriteTest: true, Seed: 42,
		Job: bench.JobSpec{RW: bench.RandRW, BS: 4096, QD: 8, Runtime: 200 * time.Millisecond}}
}

// scrape reads the daemon's Prometheus text exposition into series →
// value (labels sorted as the client library writes them).
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("metrics: %s\n%s", resp.Status, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		f, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", l, err)
		}
		out[l[:i]] = f
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal(fmt.Errorf("no metrics from %s", addr))
	}
	return out
}
