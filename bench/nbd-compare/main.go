// Command nbd-compare runs the same fio jobs (fio's nbd engine) against
// vmsan, nbdkit (file plugin), qemu-nbd and nbd-server serving ONE file, in
// one run, and prints absolute figures and ratios versus nbdkit.
//
//	go run ./bench/nbd-compare                      # all servers, 12 s per job
//	go run ./bench/nbd-compare -runtime 5s -servers vmsan,nbdkit
//	go run ./bench/nbd-compare -json > result.json
//	go run ./bench/nbd-compare -from result.json    # table of a saved run
//
// The file is vmsan's own volume raw file (created with `vmsan volume
// create`), pre-filled with non-zero data so reads hit allocated blocks; the
// anchors serve that same path. Every server uses the host page cache with
// writeback semantics (a write is acknowledged once in the page cache; FLUSH
// is fdatasync): vmsan with the volume's default cache mode, nbdkit's file
// plugin default (cache=default), qemu-nbd --cache=writeback --aio=threads,
// nbd-server's default. The file is read once before the first job so every
// server starts from a warm cache: this measures the servers, not the disk.
//
// Jobs run job-major (for each job, each server in turn, a fresh server
// process each time) so slow drift of the machine affects all servers alike.
// Only one server runs at a time. The program stops every process it started.
// It exits non-zero when any measurement failed.
//
//	go run ./bench/nbd-compare -size 64M -runtime 1s -ramp 0 -jobs seq-read-1M-QD8,rand-write-4K-QD32  # smoke
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vmsan/vmsan/bench/internal/hostinfo"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

// Job is one fio workload.
type Job struct {
	Name    string `json:"name"`
	RW      string `json:"rw"`
	BS      string `json:"bs"`
	IODepth int    `json:"iodepth"`
	// Throughput jobs are reported in MB/s, the others in IOPS.
	Throughput bool `json:"throughput"`
}

// Jobs are the rows of the comparison (issue 2's benchmark list).
var Jobs = []Job{
	{"seq-read-1M-QD8", "read", "1m", 8, true},
	{"seq-write-1M-QD8", "write", "1m", 8, true},
	{"rand-read-4K-QD32", "randread", "4k", 32, false},
	{"rand-write-4K-QD32", "randwrite", "4k", 32, false},
	{"rand-read-4K-QD1", "randread", "4k", 1, false},
	{"rand-write-4K-QD1", "randwrite", "4k", 1, false},
}

// Result is one (job, server) measurement.
type Result struct {
	Job       string  `json:"job"`
	Server    string  `json:"server"`
	Rep       int     `json:"rep"`
	MBps      float64 `json:"mb_per_s"` // decimal MB/s
	IOPS      float64 `json:"iops"`
	LatMeanUs float64 `json:"lat_mean_us"`
	LatP99Us  float64 `json:"lat_p99_us"`
	// ServerCPUus is the server's CPU time (user+system, its children
	// included) per I/O during the fio run, in microseconds. Unlike MB/s or
	// IOPS it hardly depends on what else runs on the machine, so it is the
	// figure to trust when the load average is high.
	ServerCPUus float64 `json:"server_cpu_us_per_op"`
	Error       string  `json:"error,omitempty"`
}

// Report is the -json output.
type Report struct {
	Started  time.Time         `json:"started"`
	Machine  map[string]string `json:"machine"`
	File     string            `json:"file"`
	Size     int64             `json:"size"`
	Runtime  string            `json:"runtime"`
	Jobs     []Job             `json:"jobs"`
	Servers  []string          `json:"servers"`
	Repeat   int               `json:"repeat"`
	Results  []Result          `json:"results"` // every sample
	Medians  []Result          `json:"medians"` // per job and server: the median sample (by the job's unit)
	Commands map[string]string `json:"server_commands"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "nbd-compare:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		dir      = flag.String("dir", "", "work directory on a disk filesystem (default <repo>/.cache/nbd-compare)")
		sizeStr  = flag.String("size", "2G", "size of the shared file")
		runtimeF = flag.Duration("runtime", 12*time.Second, "measured time per job and server")
		ramp     = flag.Duration("ramp", 2*time.Second, "fio ramp_time before measuring")
		repeat   = flag.Int("repeat", 1, "samples per job and server (interleaved); the table shows the median")
		list     = flag.String("servers", "vmsan,nbdkit,qemu-nbd,nbd-server", "comma-separated servers to compare")
		jobsF    = flag.String("jobs", "", "comma-separated job names to run (default all)")
		vmsanBin = flag.String("vmsan", "", "vmsan binary (default: go build ./cmd/vmsan into -dir)")
		asJSON   = flag.Bool("json", false, "print the report as JSON on stdout (progress goes to stderr)")
		logDir   = flag.String("logs", "", "directory for server logs (default <dir>/logs)")
		from     = flag.String("from", "", "print the table of a saved -json report and exit")
		extra    = flag.String("vmsan-args", "", "extra arguments for `vmsan serve` (space separated), e.g. \"--pprof 127.0.0.1:6060\"")
	)
	flag.Parse()
	if *from != "" {
		b, err := os.ReadFile(*from)
		if err != nil {
			return err
		}
		var rep Report
		if err := json.Unmarshal(b, &rep); err != nil {
			return fmt.Errorf("%s: %v", *from, err)
		}
		printTable(os.Stdout, rep)
		return nil
	}

	size, err := hostinfo.ParseSize(*sizeStr)
	if err != nil {
		return err
	}
	if *repeat < 1 {
		return errors.New("-repeat must be >= 1")
	}
	var kinds []servers.Kind
	seen := map[servers.Kind]bool{}
	for _, s := range strings.Split(*list, ",") {
		k, err := servers.ParseKind(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		if seen[k] {
			return fmt.Errorf("server %s listed twice (use -repeat for more samples)", k)
		}
		seen[k] = true
		if _, err := exec.LookPath(k.Executable()); err != nil && k != servers.VMSAN {
			return fmt.Errorf("%s not installed: %v", k, err)
		}
		kinds = append(kinds, k)
	}
	if _, err := exec.LookPath("fio"); err != nil {
		return errors.New("fio not installed (apt-get install fio)")
	}
	jobs := Jobs
	if *jobsF != "" {
		jobs = nil
		for _, n := range strings.Split(*jobsF, ",") {
			found := false
			for _, j := range Jobs {
				if j.Name == strings.TrimSpace(n) {
					jobs = append(jobs, j)
					found = true
				}
			}
			if !found {
				return fmt.Errorf("unknown job %q", n)
			}
		}
	}

	root, err := repoRoot()
	if err != nil {
		return err
	}
	if *dir == "" {
		*dir = filepath.Join(root, ".cache", "nbd-compare")
		_ = os.MkdirAll(filepath.Join(root, ".cache"), 0o755)
		_ = os.WriteFile(filepath.Join(root, ".cache", ".gitignore"), []byte("*\n"), 0o644)
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	if fs := hostinfo.FSType(*dir); fs == "tmpfs" {
		return fmt.Errorf("%s is on tmpfs; use -dir on a disk filesystem", *dir)
	}
	if *logDir == "" {
		*logDir = filepath.Join(*dir, "logs")
	}
	if err := os.MkdirAll(*logDir, 0o755); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	needVMSAN := false
	for _, k := range kinds {
		needVMSAN = needVMSAN || k == servers.VMSAN
	}
	bin := *vmsanBin
	if !needVMSAN {
		bin = "" // the anchors serve a plain file then
	} else if bin == "" {
		bin = filepath.Join(*dir, "vmsan")
		hostinfo.Logf("building vmsan into %s", bin)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/vmsan")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/vmsan: %v\n%s", err, out)
		}
	}

	// The shared file: vmsan's volume "bench" in <dir>/data.
	dataDir := filepath.Join(*dir, "data")
	file, err := prepareFile(ctx, bin, dataDir, "bench", size)
	if err != nil {
		return err
	}

	report := Report{
		Started: time.Now().UTC(), Machine: hostinfo.Machine(*dir, "fio", "nbdkit", "qemu-nbd"), File: file, Size: size,
		Runtime: runtimeF.String(), Jobs: jobs, Commands: map[string]string{}, Repeat: *repeat,
	}
	for _, k := range kinds {
		report.Servers = append(report.Servers, string(k))
	}
	var extraArgs []string
	if *extra != "" {
		extraArgs = strings.Fields(*extra)
	}

	for _, j := range jobs {
		for rep := 0; rep < *repeat; rep++ {
			for _, k := range kinds {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				hostinfo.Logf("%-20s %-10s #%d ...", j.Name, k, rep+1)
				r, cmdline := measure(ctx, k, j, servers.Options{
					File: file, Export: "bench", Binary: bin, DataDir: dataDir,
					LogDir: *logDir, ExtraArgs: vmsanOnly(k, extraArgs),
				}, *runtimeF, *ramp, size)
				if cmdline != "" {
					report.Commands[string(k)] = cmdline
				}
				if r.Error != "" {
					hostinfo.Logf("%-20s %-10s FAILED: %s", j.Name, k, hostinfo.FirstLine(r.Error))
				} else {
					hostinfo.Logf("%-20s %-10s %9.1f MB/s %9.0f IOPS  lat mean %7.1f us p99 %7.1f us", j.Name, k, r.MBps, r.IOPS, r.LatMeanUs, r.LatP99Us)
				}
				r.Rep = rep
				report.Results = append(report.Results, r)
			}
		}
	}
	report.Medians = medians(report)

	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(report); err != nil {
			return err
		}
	} else {
		printTable(os.Stdout, report)
	}
	return failures(report.Results)
}

// failures is an error when a measurement failed or moved nothing, so that
// a smoke run (and a script) sees a broken server or client in the exit
// status, not only in a cell of the table.
func failures(rs []Result) error {
	n := 0
	for _, r := range rs {
		if r.Error != "" || r.MBps <= 0 {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("%d of %d measurements failed", n, len(rs))
	}
	return nil
}

func vmsanOnly(k servers.Kind, args []string) []string {
	if k == servers.VMSAN {
		return args
	}
	return nil
}

// measure starts server k, runs job j with fio, stops the server.
func measure(ctx context.Context, k servers.Kind, j Job, o servers.Options, rt, ramp time.Duration, size int64) (Result, string) {
	res := Result{Job: j.Name, Server: string(k)}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	s, err := servers.Start(sctx, k, o)
	cancel()
	if err != nil {
		res.Error = err.Error()
		return res, ""
	}
	cmdline := serverCmdline(s)
	defer func() {
		if err := s.Stop(); err != nil {
			hostinfo.Logf("stopping %s: %v", k, err)
		}
	}()
	args := []string{
		"--name=" + j.Name, "--ioengine=nbd", "--uri=" + s.URI,
		"--rw=" + j.RW, "--bs=" + j.BS, fmt.Sprintf("--iodepth=%d", j.IODepth),
		fmt.Sprintf("--size=%d", size), "--time_based",
		fmt.Sprintf("--runtime=%dms", rt.Milliseconds()),
		fmt.Sprintf("--ramp_time=%dms", ramp.Milliseconds()),
		"--randrepeat=0", "--norandommap", "--output-format=json",
	}
	cpu0 := hostinfo.TreeCPU(s.PID())
	fctx, fcancel := context.WithTimeout(ctx, rt+ramp+60*time.Second)
	defer fcancel()
	cmd := exec.CommandContext(fctx, "fio", args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	runErr := cmd.Run()
	// Give a forking server (nbd-server) a moment to reap its per-client
	// child so the child's CPU time shows up in the parent's cutime.
	time.Sleep(100 * time.Millisecond)
	cpu := hostinfo.TreeCPU(s.PID()) - cpu0
	if runErr != nil {
		res.Error = fmt.Sprintf("fio: %v: %s", runErr, strings.TrimSpace(se.String()))
		return res, cmdline
	}
	var out struct {
		Jobs []struct {
			Error int     `json:"error"`
			Read  fioStat `json:"read"`
			Write fioStat `json:"write"`
		} `json:"jobs"`
	}
	raw := so.Bytes()
	if i := bytes.IndexByte(raw, '{'); i > 0 {
		raw = raw[i:]
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Jobs) != 1 {
		res.Error = fmt.Sprintf("fio output: %v", err)
		return res, cmdline
	}
	fj := out.Jobs[0]
	st := fj.Read
	if strings.Contains(j.RW, "write") {
		st = fj.Write
	}
	if fj.Error != 0 {
		res.Error = fmt.Sprintf("fio job error %d: %s", fj.Error, strings.TrimSpace(se.String()))
	}
	res.MBps = float64(st.BwBytes) / 1e6
	res.IOPS = st.IOPS
	res.LatMeanUs = st.Lat.Mean / 1e3
	res.LatP99Us = st.Clat.Percentile["99.000000"] / 1e3
	// fio's ops include the ramp, which the counters above exclude; total
	// ios cover the whole run, like the CPU time.
	if ios := st.TotalIOs; ios > 0 && cpu > 0 {
		res.ServerCPUus = cpu.Seconds() * 1e6 / float64(ios)
	}
	return res, cmdline
}

type fioStat struct {
	TotalIOs int64   `json:"total_ios"`
	BwBytes  int64   `json:"bw_bytes"`
	IOPS     float64 `json:"iops"`
	Lat      struct {
		Mean float64 `json:"mean"`
	} `json:"lat_ns"`
	Clat struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

func serverCmdline(s *servers.Server) string {
	b, err := os.ReadFile(s.Log)
	if err != nil {
		return ""
	}
	// The harness writes "### <time> <command line>" before each start.
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "### ") {
			f := strings.SplitN(lines[i], " ", 3)
			if len(f) == 3 {
				return f[2]
			}
		}
	}
	return ""
}

// prepareFile creates the vmsan volume (or, without vmsan, a plain file) of
// the given size and fills it with non-zero data, then reads it once so the
// page cache is warm for every server alike.
func prepareFile(ctx context.Context, bin, dataDir, name string, size int64) (string, error) {
	var file string
	if bin != "" {
		matches, _ := filepath.Glob(filepath.Join(dataDir, "*", name+".raw"))
		if len(matches) == 0 {
			if err := os.MkdirAll(dataDir, 0o755); err != nil {
				return "", err
			}
			if err := servers.CreateVMSANVolume(ctx, bin, dataDir, name, size); err != nil {
				return "", err
			}
			matches, _ = filepath.Glob(filepath.Join(dataDir, "*", name+".raw"))
		}
		if len(matches) != 1 {
			return "", fmt.Errorf("cannot find the raw file of vmsan volume %q under %s", name, dataDir)
		}
		file = matches[0]
	} else {
		file = filepath.Join(dataDir, name+".raw")
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return "", err
		}
	}
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if st.Size() != size {
		if bin != "" {
			return "", fmt.Errorf("%s is %d bytes, want %d: remove %s or pass the old -size", file, st.Size(), size, dataDir)
		}
		if err := f.Truncate(size); err != nil {
			return "", err
		}
	}
	// Fill once: a marker next to the data dir records that it is full.
	marker := filepath.Join(filepath.Dir(dataDir), "filled-"+name)
	if _, err := os.Stat(marker); err != nil {
		hostinfo.Logf("filling %s (%d MiB) with random data", file, size>>20)
		buf := make([]byte, 4<<20)
		if _, err := rand.Read(buf); err != nil {
			return "", err
		}
		for off := int64(0); off < size; off += int64(len(buf)) {
			n := int64(len(buf))
			if size-off < n {
				n = size - off
			}
			// Vary each chunk a little so no two chunks are identical.
			buf[0], buf[1] = byte(off>>22), byte(off>>30)
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				return "", err
			}
		}
		if err := f.Sync(); err != nil {
			return "", err
		}
		if err := os.WriteFile(marker, nil, 0o644); err != nil {
			return "", err
		}
	}
	hostinfo.Logf("warming the page cache with %s", file)
	if _, err := io.Copy(io.Discard, io.NewSectionReader(f, 0, size)); err != nil {
		return "", err
	}
	return file, nil
}

// medians picks, per job and server, the sample with the median figure
// (MB/s for throughput jobs, IOPS otherwise); failed samples count as 0.
func medians(rep Report) []Result {
	var out []Result
	for _, j := range rep.Jobs {
		for _, s := range rep.Servers {
			var xs []Result
			for _, r := range rep.Results {
				if r.Job == j.Name && r.Server == s {
					xs = append(xs, r)
				}
			}
			if len(xs) == 0 {
				continue
			}
			key := func(r Result) float64 {
				if r.Error != "" {
					return 0
				}
				if j.Throughput {
					return r.MBps
				}
				return r.IOPS
			}
			sort.Slice(xs, func(a, b int) bool { return key(xs[a]) < key(xs[b]) })
			out = append(out, xs[len(xs)/2])
		}
	}
	return out
}

func printTable(w io.Writer, rep Report) {
	get := func(job, srv string) *Result {
		for i := range rep.Medians {
			if rep.Medians[i].Job == job && rep.Medians[i].Server == srv {
				return &rep.Medians[i]
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "nbd-compare: %s file, %s per job, median of %d, fio --ioengine=nbd, page-cache writeback on every server\n", hostinfo.Human(rep.Size), rep.Runtime, rep.Repeat)
	fmt.Fprintf(w, "machine: %s\n\n", rep.Machine["summary"])
	hdr := "job\tunit\t"
	for _, s := range rep.Servers {
		hdr += s + "\t"
	}
	for _, s := range rep.Servers {
		if s != string(servers.NBDKit) {
			hdr += s + "/nbdkit\t"
		}
	}
	fmt.Fprintln(tw, hdr)
	for _, j := range rep.Jobs {
		unit := "IOPS"
		if j.Throughput {
			unit = "MB/s"
		}
		line := j.Name + "\t" + unit + "\t"
		val := func(r *Result) float64 {
			if r == nil || r.Error != "" {
				return 0
			}
			if j.Throughput {
				return r.MBps
			}
			return r.IOPS
		}
		for _, s := range rep.Servers {
			r := get(j.Name, s)
			if r == nil || r.Error != "" {
				line += "error\t"
			} else {
				line += fmt.Sprintf("%.0f\t", val(r))
			}
		}
		base := val(get(j.Name, string(servers.NBDKit)))
		for _, s := range rep.Servers {
			if s == string(servers.NBDKit) {
				continue
			}
			v := val(get(j.Name, s))
			if base == 0 || v == 0 {
				line += "-\t"
			} else {
				line += fmt.Sprintf("%.2fx\t", v/base)
			}
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "server CPU time per I/O (us, user+system; lower is better, robust to machine load):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	hdr = "job\t"
	for _, s := range rep.Servers {
		hdr += s + "\t"
	}
	fmt.Fprintln(tw, hdr)
	for _, j := range rep.Jobs {
		line := j.Name + "\t"
		for _, s := range rep.Servers {
			if r := get(j.Name, s); r == nil || r.Error != "" || r.ServerCPUus == 0 {
				line += "-\t"
			} else {
				line += fmt.Sprintf("%.1f\t", r.ServerCPUus)
			}
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "server command lines:")
	for _, s := range rep.Servers {
		fmt.Fprintf(w, "  %-10s %s\n", s, rep.Commands[s])
	}
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run nbd-compare from inside the vmsan repository")
	}
	return filepath.Dir(mod), nil
}
