package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// fioMBps runs one fio job and returns its read bandwidth in MB/s.
func fioMBps(t *testing.T, file, rw string, bs, qd int, secs float64) float64 {
	t.Helper()
	out, err := exec.Command("fio", "--name=parity", "--filename="+file, "--rw="+rw,
		"--bs="+strconv.Itoa(bs), "--iodepth="+strconv.Itoa(qd), "--ioengine=libaio", "--direct=1",
		fmt.Sprintf("--runtime=%gs", secs), "--time_based", "--output-format=json").Output()
	if err != nil {
		t.Fatalf("fio: %v", err)
	}
	// fio may print warnings before the JSON.
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	var j struct {
		Jobs []struct {
			Read struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &j); err != nil || len(j.Jobs) == 0 {
		t.Fatalf("fio output: %v: %s", err, out)
	}
	return j.Jobs[0].Read.BwBytes / 1e6
}

func vmsanMBps(t *testing.T, file string, rw Pattern, bs, qd int, secs float64) float64 {
	t.Helper()
	ctx := context.Background()
	tg, err := OpenTarget(ctx, file, TargetOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	res, err := RunProfile(ctx, tg, Options{Profile: ProfileJob, Job: JobSpec{RW: rw, BS: bs, QD: qd, Runtime: time.Duration(secs * float64(time.Second))}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Ops[0].MBps
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestFioParity is the honesty check: `vmsan bench job` and fio, run on the
// same file with the same job (O_DIRECT on a disk filesystem, libaio
// queue depth for fio, vmsan's own AIO queue), interleaved in one test run,
// agree within ±15%. Disk speed on a shared machine drifts by more than
// that between runs, so runs alternate in back-to-back pairs and the median
// of the pair ratios is compared; an attempt that misses is repeated (up to
// 3), and every attempt is logged. A systematic error (wrong byte count, wrong clock, a missing
// queue depth) misses on every attempt.
func TestFioParity(t *testing.T) {
	testutil.NeedTool(t, "fio")
	dir := testutil.DiskTempDir(t)
	file := filepath.Join(dir, "parity.img")
	const size = 256 << 20
	tg, err := OpenTarget(context.Background(), file, TargetOptions{Size: size, Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := Fill(context.Background(), tg, 0, size, nil); err != nil {
		t.Fatal(err)
	}
	tg.Info()
	// Keep the file: reopen it below as an existing file.
	tg.(*fileTarget).removeF = false
	tg.Close()

	jobs := []struct {
		name   string
		fioRW  string
		rw     Pattern
		bs, qd int
	}{
		{"seq 1MiB read QD8", "read", Read, 1 << 20, 8},
		{"rand 4KiB read QD32", "randread", RandRead, 4096, 32},
	}
	const rounds, secs = 7, 0.8
	for _, j := range jobs {
		t.Run(j.name, func(t *testing.T) {
			var last string
			for attempt := 1; attempt <= 3; attempt++ {
				fioMBps(t, file, j.fioRW, j.bs, j.qd, 0.3) // warm the path
				var f, v []float64
				for r := 0; r < rounds; r++ {
					// Alternate who goes first so drift hits both equally.
					if r%2 == 0 {
						f = append(f, fioMBps(t, file, j.fioRW, j.bs, j.qd, secs))
						v = append(v, vmsanMBps(t, file, j.rw, j.bs, j.qd, secs))
					} else {
						v = append(v, vmsanMBps(t, file, j.rw, j.bs, j.qd, secs))
						f = append(f, fioMBps(t, file, j.fioRW, j.bs, j.qd, secs))
					}
				}
				// Each round's two runs are back to back, so their ratio
				// cancels most of the machine's drift; the median of the
				// round ratios drops rounds another process disturbed.
				rs := make([]float64, rounds)
				for i := range rs {
					rs[i] = v[i] / f[i]
				}
				ratio := median(rs)
				last = fmt.Sprintf("attempt %d: fio %.1f MB/s (runs %.0f), vmsan %.1f MB/s (runs %.0f), round ratios %.2f, median ratio %.3f", attempt, median(f), f, median(v), v, rs, ratio)
				t.Log(last)
				if ratio >= 0.85 && ratio <= 1.15 {
					return
				}
			}
			t.Fatalf("vmsan bench and fio disagree by more than 15%% on every attempt; last %s", last)
		})
	}
}

// startNbdkit runs nbdkit with the log filter on a Unix socket; the log
// lists every request with its byte count, which is how the test knows
// what the server received.
func startNbdkit(t *testing.T, size string) (uri, logPath string, stop func()) {
	t.Helper()
	testutil.NeedTool(t, "nbdkit")
	dir := t.TempDir()
	sock := filepath.Join(dir, "s")
	logPath = filepath.Join(dir, "log")
	cmd := exec.Command("nbdkit", "-f", "--exit-with-parent", "-U", sock, "--filter=log", "memory", size, "logfile="+logPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
	}
	t.Cleanup(stop)
	for i := 0; i < 500; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return "nbd+unix:///?socket=" + sock, logPath, stop
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("nbdkit did not start: %s", stderr.String())
	return
}

var logReq = regexp.MustCompile(`connection=\d+ (Read|Write) id=\d+ offset=0x[0-9a-f]+ count=0x([0-9a-f]+)`)

// serverBytes sums the byte counts of the Read and Write requests nbdkit logged.
func serverBytes(t *testing.T, path string) (read, written, nreads, nwrites int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := logReq.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, _ := strconv.ParseInt(m[2], 16, 64)
		if m[1] == "Read" {
			read += n
			nreads++
		} else {
			written += n
			nwrites++
		}
	}
	return
}

// TestNBDProfilesByteCounts runs every profile against nbdkit over the
// pipelined client and checks that what the benchmark says it moved is
// exactly what the server logged, and that measured rows add up.
func TestNBDProfilesByteCounts(t *testing.T) {
	for _, prof := range Profiles {
		t.Run(prof, func(t *testing.T) {
			uri, logPath, stop := startNbdkit(t, "32M")
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			tg, err := OpenTarget(ctx, uri, TargetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			in := tg.Info()
			if in.NBD == nil || in.NBD.Connections != 4 || !slices.Contains(in.NBD.Flags, "CAN_MULTI_CONN") {
				t.Fatalf("NBD info not recorded: %+v", in.NBD)
			}
			res, err := RunProfile(ctx, tg, quickOpts(prof), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := tg.Close(); err != nil {
				t.Fatal(err)
			}
			stop()
			r, w, nr, nw := serverBytes(t, logPath)
			tot := res.Totals
			t.Logf("%s: client read %d B in %d requests, wrote %d B in %d; server got reads %d B/%d, writes %d B/%d",
				prof, tot.BytesRead, tot.Reads, tot.BytesWritten, tot.Writes, r, nr, w, nw)
			if tot.BytesWritten != w || tot.BytesRead != r {
				t.Fatalf("byte counts differ: client read %d wrote %d, server read %d wrote %d", tot.BytesRead, tot.BytesWritten, r, w)
			}
			if tot.Writes != nw || tot.Reads != nr {
				t.Fatalf("request counts differ: client %d/%d, server %d/%d", tot.Reads, tot.Writes, nr, nw)
			}
			var rowR, rowW int64
			for _, o := range res.Ops {
				if o.Bytes < 0 || o.Seconds <= 0 {
					t.Fatalf("row %s: %d bytes in %v s", o.Key(), o.Bytes, o.Seconds)
				}
				if o.Metric == MetricMBps && prof != ProfileGnome {
					if d := o.MBps*o.Seconds*1e6 - float64(o.Bytes); d > 1 || d < -1 {
						t.Fatalf("row %s: MB/s × s ≠ bytes", o.Key())
					}
				}
				if o.Dir == "read" {
					rowR += o.Bytes
				} else {
					rowW += o.Bytes
				}
			}
			if prof != ProfileGnome && (rowR > tot.BytesRead || rowW > tot.BytesWritten) {
				t.Fatalf("rows claim more bytes (%d read, %d written) than moved (%d, %d)", rowR, rowW, tot.BytesRead, tot.BytesWritten)
			}
			if rowR+rowW == 0 {
				t.Fatal("no bytes measured")
			}
			var b bytes.Buffer
			PrintTable(&b, res)
			want := map[string]string{ProfileCDM: "[Read]", ProfileCDMLegacy: "Random Read 4KB (QD=32)", ProfileBonnie: "-Per Chr- --Block-- -Rewrite-", ProfileGnome: "AVG Access:", ProfileJob: "lat mean us"}[prof]
			if !strings.Contains(b.String(), want) {
				t.Fatalf("table lacks %q:\n%s", want, b.String())
			}
			t.Logf("\n%s", b.String())
		})
	}
}
