// Command iscsi-compare runs the same iSCSI clients against vmsan's iSCSI
// target and tgt (bs rdwr and bs aio) serving ONE file, in one run, and
// prints absolute figures, ratios versus tgt, and the servers' CPU time per
// I/O. vmsan's own NBD server on the same file is measured with the clients
// that speak NBD too (qemu-img bench, vmsan bench), for the "iSCSI within
// 0.8x of NBD" comparison.
//
//	go run ./bench/iscsi-compare                       # all servers and clients
//	go run ./bench/iscsi-compare -runtime 5s -servers tgt-rdwr,tgt-aio
//	go run ./bench/iscsi-compare -json > result.json
//	go run ./bench/iscsi-compare -from result.json     # table of a saved run
//	go run ./bench/iscsi-compare -size 64M -runtime 1s \
//	    -jobs 'qemu-img write 4K QD32,iscsi-perf randread 4K QD32,vmsan-bench randwrite 4K QD32'  # smoke
//
// It exits non-zero when any measurement that could run failed.
//
// Clients (none of the iSCSI ones written here, except vmsan bench):
//
//   - qemu-img bench over QEMU's libiscsi driver (package qemu-block-extra):
//     4 KiB at queue depth 32 and 1 MiB at queue depth 8, read and write.
//     qemu-img bench steps sequentially through the image (it has no
//     random mode); its request count is calibrated to -runtime per server.
//   - iscsi-perf (libiscsi-bin): random 4 KiB reads at 32 in flight and
//     sequential 1 MiB reads at 8 (it only reads).
//   - vmsan bench --profile job over iscsi:// (the in-repo initiator).
//
// The file is vmsan's own volume raw file, filled with random data and read
// once so every server starts from a warm page cache. tgt serves the same
// path; its target parameters are set to what vmsan offers (-tgt-params) so
// both negotiate the same burst and segment sizes. Jobs run job-major (for
// each job, each server in turn, a fresh server each time). Until vmsan
// serves iSCSI (`vmsan serve --iscsi-listen`), its columns read "n/a".
// Needs root: tgtd keeps its management lock under /var/run.
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
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vmsan/vmsan/bench/internal/hostinfo"
	"github.com/vmsan/vmsan/internal/iscsi/initiator"
	"github.com/vmsan/vmsan/internal/iscsi/tgtd"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

// Server kinds.
const (
	VMSAN    = "vmsan"     // vmsan serve --iscsi-listen
	TgtRdwr  = "tgt-rdwr"  // tgtd, --bstype rdwr
	TgtAIO   = "tgt-aio"   // tgtd, --bstype aio
	VMSANNBD = "vmsan-nbd" // vmsan serve, NBD (reference)
)

var allServers = []string{VMSAN, TgtRdwr, TgtAIO, VMSANNBD}

// Job is one row: a client with a workload.
type Job struct {
	Name   string `json:"name"`
	Client string `json:"client"` // qemu-img, iscsi-perf, vmsan-bench
	Write  bool   `json:"write"`
	Random bool   `json:"random"`
	BS     int    `json:"bs"`
	QD     int    `json:"qd"`
	// Throughput jobs are reported in MB/s, the others in IOPS.
	Throughput bool `json:"throughput"`
}

// Jobs are the rows of the comparison.
var Jobs = []Job{
	{"qemu-img read 4K QD32", "qemu-img", false, false, 4096, 32, false},
	{"qemu-img write 4K QD32", "qemu-img", true, false, 4096, 32, false},
	{"qemu-img read 1M QD8", "qemu-img", false, false, 1 << 20, 8, true},
	{"qemu-img write 1M QD8", "qemu-img", true, false, 1 << 20, 8, true},
	{"iscsi-perf randread 4K QD32", "iscsi-perf", false, true, 4096, 32, false},
	{"iscsi-perf read 1M QD8", "iscsi-perf", false, false, 1 << 20, 8, true},
	{"vmsan-bench randread 4K QD32", "vmsan-bench", false, true, 4096, 32, false},
	{"vmsan-bench randwrite 4K QD32", "vmsan-bench", true, true, 4096, 32, false},
	{"vmsan-bench read 1M QD8", "vmsan-bench", false, false, 1 << 20, 8, true},
	{"vmsan-bench write 1M QD8", "vmsan-bench", true, false, 1 << 20, 8, true},
}

// Result is one (job, server) measurement.
type Result struct {
	Job     string  `json:"job"`
	Server  string  `json:"server"`
	Rep     int     `json:"rep"`
	MBps    float64 `json:"mb_per_s"`
	IOPS    float64 `json:"iops"`
	Ops     int64   `json:"ops"`
	Seconds float64 `json:"seconds"`
	// ServerCPUus is the server's CPU time (user+system, children
	// included) per I/O over the client's run, in microseconds.
	ServerCPUus float64 `json:"server_cpu_us_per_op"`
	// NA: this server cannot run this job (no iSCSI in vmsan yet, or
	// iscsi-perf against an NBD server); Error: it failed.
	NA    string `json:"na,omitempty"`
	Error string `json:"error,omitempty"`
}

// Report is the -json output.
type Report struct {
	Started   time.Time         `json:"started"`
	Machine   map[string]string `json:"machine"`
	File      string            `json:"file"`
	Size      int64             `json:"size"`
	Runtime   string            `json:"runtime"`
	Jobs      []Job             `json:"jobs"`
	Servers   []string          `json:"servers"`
	Repeat    int               `json:"repeat"`
	TgtParams map[string]string `json:"tgt_params"`
	Results   []Result          `json:"results"`
	Medians   []Result          `json:"medians"`
	Commands  map[string]string `json:"server_commands"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "iscsi-compare:", err)
		os.Exit(1)
	}
}

type config struct {
	dir, file, bin, logDir string
	benchBin               string // runs `vmsan bench` (the client)
	size                   int64
	rt                     time.Duration
	tgtParams              map[string]string
	vmsanISCSI             bool
}

func run() error {
	var (
		dir       = flag.String("dir", "", "work directory on a disk filesystem (default <repo>/.cache/iscsi-compare)")
		sizeStr   = flag.String("size", "1G", "size of the shared file")
		runtimeF  = flag.Duration("runtime", 8*time.Second, "measured time per job and server")
		repeat    = flag.Int("repeat", 1, "samples per job and server (interleaved); the table shows the median")
		list      = flag.String("servers", strings.Join(allServers, ","), "comma-separated servers")
		clients   = flag.String("clients", "qemu-img,iscsi-perf,vmsan-bench", "comma-separated clients")
		jobsF     = flag.String("jobs", "", "comma-separated job names of those clients to run (default all)")
		vmsanBin  = flag.String("vmsan", "", "vmsan binary that serves (default: go build ./cmd/vmsan into -dir)")
		benchBin  = flag.String("vmsan-bench", "", "vmsan binary that runs `vmsan bench` as a client (default: -vmsan when given, else the one built)")
		asJSON    = flag.Bool("json", false, "print the report as JSON on stdout (progress goes to stderr)")
		from      = flag.String("from", "", "print the table of a saved -json report and exit")
		tgtParams = flag.String("tgt-params", "MaxRecvDataSegmentLength=262144,MaxXmitDataSegmentLength=262144,FirstBurstLength=262144,MaxBurstLength=1048576,InitialR2T=No,ImmediateData=Yes",
			"tgt target parameters (tgtadm --op update), comma-separated NAME=VALUE")
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
	var kinds []string
	for _, s := range strings.Split(*list, ",") {
		s = strings.TrimSpace(s)
		ok := false
		for _, k := range allServers {
			ok = ok || k == s
		}
		if !ok {
			return fmt.Errorf("unknown server %q (have %v)", s, allServers)
		}
		kinds = append(kinds, s)
	}
	var jobs []Job
	for _, c := range strings.Split(*clients, ",") {
		for _, j := range Jobs {
			if j.Client == strings.TrimSpace(c) {
				jobs = append(jobs, j)
			}
		}
	}
	if *jobsF != "" {
		want := map[string]bool{}
		for _, n := range strings.Split(*jobsF, ",") {
			want[strings.TrimSpace(n)] = true
		}
		var picked []Job
		for _, j := range jobs {
			if want[j.Name] {
				picked = append(picked, j)
				delete(want, j.Name)
			}
		}
		for n := range want {
			return fmt.Errorf("unknown job %q (or its client is not in -clients)", n)
		}
		jobs = picked
	}
	if len(jobs) == 0 {
		return fmt.Errorf("no jobs for clients %q", *clients)
	}
	for _, tool := range []string{"tgtd", "tgtadm", "qemu-img", "iscsi-perf"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not installed (apt-get install tgt qemu-utils qemu-block-extra libiscsi-bin): %v", tool, err)
		}
	}
	tp := map[string]string{}
	for _, kv := range strings.Split(*tgtParams, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("-tgt-params: %q is not NAME=VALUE", kv)
		}
		tp[k] = v
	}

	root, err := repoRoot()
	if err != nil {
		return err
	}
	if *dir == "" {
		*dir = filepath.Join(root, ".cache", "iscsi-compare")
		_ = os.MkdirAll(filepath.Join(root, ".cache"), 0o755)
		_ = os.WriteFile(filepath.Join(root, ".cache", ".gitignore"), []byte("*\n"), 0o644)
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	if fs := hostinfo.FSType(*dir); fs == "tmpfs" {
		return fmt.Errorf("%s is on tmpfs; use -dir on a disk filesystem", *dir)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg := &config{dir: *dir, size: size, rt: *runtimeF, tgtParams: tp, logDir: filepath.Join(*dir, "logs")}
	if err := os.MkdirAll(cfg.logDir, 0o755); err != nil {
		return err
	}
	cfg.bin, cfg.benchBin = *vmsanBin, *benchBin
	if cfg.bin == "" || cfg.benchBin == "" && *vmsanBin == "" {
		built := filepath.Join(*dir, "vmsan")
		hostinfo.Logf("building vmsan into %s", built)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", built, "./cmd/vmsan")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/vmsan: %v\n%s", err, out)
		}
		if cfg.bin == "" {
			cfg.bin = built
		}
		if cfg.benchBin == "" {
			cfg.benchBin = built
		}
	}
	if cfg.benchBin == "" {
		cfg.benchBin = cfg.bin
	}
	help, _ := exec.Command(cfg.bin, "serve", "--help").CombinedOutput()
	cfg.vmsanISCSI = bytes.Contains(help, []byte("--iscsi-listen"))
	if !cfg.vmsanISCSI {
		hostinfo.Logf("vmsan serve has no --iscsi-listen yet: vmsan (iSCSI) columns will read n/a")
	}
	dataDir := filepath.Join(*dir, "data")
	if cfg.file, err = prepareFile(ctx, cfg.bin, dataDir, "bench", size); err != nil {
		return err
	}

	rep := Report{
		Started: time.Now().UTC(), Machine: hostinfo.Machine(*dir, "qemu-img", "tgtd"), File: cfg.file, Size: size, Runtime: runtimeF.String(),
		Jobs: jobs, Servers: kinds, Repeat: *repeat, TgtParams: tp, Commands: map[string]string{},
	}
	for _, j := range jobs {
		for r := 0; r < *repeat; r++ {
			for _, k := range kinds {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				hostinfo.Logf("%-30s %-10s #%d ...", j.Name, k, r+1)
				res, cmdline := measure(ctx, cfg, k, j, dataDir)
				res.Rep = r
				if cmdline != "" {
					rep.Commands[k] = cmdline
				}
				switch {
				case res.NA != "":
					hostinfo.Logf("%-30s %-10s n/a: %s", j.Name, k, res.NA)
				case res.Error != "":
					hostinfo.Logf("%-30s %-10s FAILED: %s", j.Name, k, hostinfo.FirstLine(res.Error))
				default:
					hostinfo.Logf("%-30s %-10s %9.1f MB/s %9.0f IOPS  server CPU %.1f us/op", j.Name, k, res.MBps, res.IOPS, res.ServerCPUus)
				}
				rep.Results = append(rep.Results, res)
			}
		}
	}
	rep.Medians = medians(rep)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printTable(os.Stdout, rep)
	}
	return failures(rep.Results)
}

// failures is an error when a measurement that could run (not n/a) failed
// or measured nothing, so that a smoke run (and a script) sees it in the
// exit status, not only in a cell of the table.
func failures(rs []Result) error {
	n := 0
	for _, r := range rs {
		if r.NA == "" && (r.Error != "" || r.IOPS <= 0) {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("%d of %d measurements failed", n, len(rs))
	}
	return nil
}

// server is a started server and how to reach it.
type server struct {
	pid     int
	iscsi   string // iscsi://host:port/IQN/LUN, "" for NBD
	nbd     string // nbd://host:port/export, "" for iSCSI
	cmdline string
	stop    func()
}

func startServer(ctx context.Context, cfg *config, kind, dataDir string) (*server, error) {
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	switch kind {
	case TgtRdwr, TgtAIO:
		bs := "rdwr"
		if kind == TgtAIO {
			bs = "aio"
		}
		lf, err := os.OpenFile(filepath.Join(cfg.logDir, kind+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		s, err := tgtd.Start(sctx, tgtd.Options{Files: []string{cfg.file}, BSType: bs, Params: cfg.tgtParams, Log: lf})
		if err != nil {
			lf.Close()
			return nil, err
		}
		return &server{pid: s.Pid(), iscsi: fmt.Sprintf("iscsi://%s/%s/1", s.Addr, s.IQN),
			cmdline: fmt.Sprintf("tgtd -f --iscsi portal=%s; LUN 1 --bstype %s; params %v", s.Addr, bs, cfg.tgtParams),
			stop:    func() { s.Stop(); lf.Close() }}, nil
	case VMSAN, VMSANNBD:
		o := servers.Options{Binary: cfg.bin, DataDir: dataDir, Export: "bench", LogDir: cfg.logDir}
		var iport int
		if kind == VMSAN {
			p, err := servers.FreePort()
			if err != nil {
				return nil, err
			}
			iport = p
			// A loopback benchmark target: any initiator may log in.
			o.ExtraArgs = []string{"--iscsi-listen", fmt.Sprintf("127.0.0.1:%d", p), "--iscsi-allow-any"}
		}
		s, err := servers.Start(sctx, servers.VMSAN, o)
		if err != nil {
			return nil, err
		}
		sv := &server{pid: s.PID(), cmdline: "vmsan serve --data-dir DIR --listen " + s.Addr + " " + strings.Join(o.ExtraArgs, " "),
			stop: func() { _ = s.Stop() }}
		if kind == VMSANNBD {
			sv.nbd = s.URI
			return sv, nil
		}
		addr := fmt.Sprintf("127.0.0.1:%d", iport)
		uri, err := findLUN(sctx, addr)
		if err != nil {
			sv.stop()
			return nil, err
		}
		sv.iscsi = uri
		return sv, nil
	}
	return nil, fmt.Errorf("unknown server %q", kind)
}

// findLUN discovers vmsan's target and its first disk LUN.
func findLUN(ctx context.Context, addr string) (string, error) {
	var ts []initiator.Target
	var err error
	for i := 0; i < 50; i++ {
		if ts, err = initiator.Discover(ctx, addr, initiator.Config{}); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return "", fmt.Errorf("discovery on %s: %w", addr, err)
	}
	if len(ts) == 0 {
		return "", fmt.Errorf("discovery on %s lists no target", addr)
	}
	s, err := initiator.Dial(ctx, addr, initiator.Config{TargetName: ts[0].Name})
	if err != nil {
		return "", err
	}
	defer s.Logout(ctx)
	lun, err := s.FirstDisk(ctx)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("iscsi://%s/%s/%d", addr, ts[0].Name, lun), nil
}

// measure starts server k, runs job j, stops the server.
func measure(ctx context.Context, cfg *config, k string, j Job, dataDir string) (Result, string) {
	res := Result{Job: j.Name, Server: k}
	if k == VMSAN && !cfg.vmsanISCSI {
		res.NA = "vmsan serve has no --iscsi-listen"
		return res, ""
	}
	if k == VMSANNBD && j.Client == "iscsi-perf" {
		res.NA = "iscsi-perf speaks only iSCSI"
		return res, ""
	}
	s, err := startServer(ctx, cfg, k, dataDir)
	if err != nil {
		res.Error = err.Error()
		return res, ""
	}
	defer s.stop()
	uri := s.iscsi
	if uri == "" {
		uri = s.nbd
	}
	var ops int64
	var secs float64
	var cpu time.Duration
	switch j.Client {
	case "qemu-img":
		// Calibrate: a short run gives the rate, the measured run then
		// lasts about -runtime.
		n0 := int64(2000)
		if j.BS >= 1<<20 {
			n0 = 64
		}
		_, s0, err := qemuImgBench(ctx, uri, j, n0)
		if err != nil {
			res.Error = err.Error()
			return res, s.cmdline
		}
		n := max(n0, int64(float64(n0)/s0*cfg.rt.Seconds()))
		cpu0 := hostinfo.TreeCPU(s.pid)
		ops, secs, err = qemuImgBench(ctx, uri, j, n)
		cpu = hostinfo.TreeCPU(s.pid) - cpu0
		if err != nil {
			res.Error = err.Error()
			return res, s.cmdline
		}
	case "iscsi-perf":
		cpu0 := hostinfo.TreeCPU(s.pid)
		ops, secs, err = iscsiPerf(ctx, uri, j, cfg.rt)
		cpu = hostinfo.TreeCPU(s.pid) - cpu0
		if err != nil {
			res.Error = err.Error()
			return res, s.cmdline
		}
	case "vmsan-bench":
		cpu0 := hostinfo.TreeCPU(s.pid)
		var total int64
		ops, secs, total, err = vmsanBench(ctx, cfg, uri, j)
		cpu = hostinfo.TreeCPU(s.pid) - cpu0
		if err != nil {
			res.Error = err.Error()
			return res, s.cmdline
		}
		// CPU covers the whole run, warm-up and the write-protection
		// probe included: divide by every request.
		if total > 0 {
			res.ServerCPUus = cpu.Seconds() * 1e6 / float64(total)
		}
	}
	res.Ops, res.Seconds = ops, secs
	if secs > 0 {
		res.IOPS = float64(ops) / secs
		res.MBps = float64(ops) * float64(j.BS) / 1e6 / secs
	}
	if res.ServerCPUus == 0 && ops > 0 {
		res.ServerCPUus = cpu.Seconds() * 1e6 / float64(ops)
	}
	return res, s.cmdline
}

var qemuDone = regexp.MustCompile(`Run completed in ([0-9.]+) seconds`)

// qemuImgBench runs n requests of j through QEMU's block layer.
func qemuImgBench(ctx context.Context, uri string, j Job, n int64) (int64, float64, error) {
	args := []string{"bench", "-f", "raw", "-t", "none", "-d", strconv.Itoa(j.QD), "-s", strconv.Itoa(j.BS), "-c", strconv.FormatInt(n, 10)}
	if j.Write {
		args = append(args, "-w", "--pattern=0x5a")
	}
	args = append(args, uri)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(cctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("qemu-img %s: %v: %s", strings.Join(args, " "), err, out)
	}
	m := qemuDone.FindSubmatch(out)
	if m == nil {
		return 0, 0, fmt.Errorf("qemu-img bench output: %s", out)
	}
	s, _ := strconv.ParseFloat(string(m[1]), 64)
	if s <= 0 {
		s = 1e-3
	}
	return n, s, nil
}

var perfAvg = regexp.MustCompile(`iops average ([0-9]+)`)

// iscsiPerf runs libiscsi's iscsi-perf for rt, then interrupts it (it has
// no run time of its own) and reads its last average.
func iscsiPerf(ctx context.Context, uri string, j Job, rt time.Duration) (int64, float64, error) {
	// It prints its first average after its first whole second of I/O
	// (login and ramp-up come before): shorter runs have no figure.
	rt = max(rt, 3*time.Second)
	args := []string{"-m", strconv.Itoa(j.QD), "-b", strconv.Itoa(j.BS / 512)}
	if j.Random {
		args = append(args, "-r")
	}
	args = append(args, uri)
	cmd := exec.CommandContext(ctx, "iscsi-perf", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return 0, 0, fmt.Errorf("iscsi-perf exited early: %v: %s", err, out.String())
	case <-time.After(rt):
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	secs := time.Since(start).Seconds()
	ms := perfAvg.FindAllSubmatch(out.Bytes(), -1)
	if len(ms) == 0 {
		return 0, 0, fmt.Errorf("iscsi-perf printed no average: %s", out.String())
	}
	iops, _ := strconv.ParseFloat(string(ms[len(ms)-1][1]), 64)
	// iscsi-perf's average is over whole seconds of its run.
	return int64(iops * secs), secs, nil
}

// vmsanBench runs `vmsan bench --profile job` and returns the measured
// requests and seconds, and every request of the run.
func vmsanBench(ctx context.Context, cfg *config, uri string, j Job) (int64, float64, int64, error) {
	rw := "read"
	switch {
	case j.Write && j.Random:
		rw = "randwrite"
	case j.Write:
		rw = "write"
	case j.Random:
		rw = "randread"
	}
	args := []string{"bench", "--profile", "job", "--rw", rw, "--bs", strconv.Itoa(j.BS), "--iodepth", strconv.Itoa(j.QD),
		"--runtime", cfg.rt.String(), "--json", "-o", "none", "-q", "--force", "--keep", "--size", strconv.FormatInt(cfg.size, 10), uri}
	cctx, cancel := context.WithTimeout(ctx, cfg.rt+5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, cfg.benchBin, args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		return 0, 0, 0, fmt.Errorf("vmsan %s: %v: %s", strings.Join(args, " "), err, se.String())
	}
	var r struct {
		Ops []struct {
			Ops     int64   `json:"ops"`
			Seconds float64 `json:"seconds"`
		} `json:"ops"`
		Totals struct {
			Reads  int64 `json:"read_requests"`
			Writes int64 `json:"write_requests"`
		} `json:"io_totals"`
	}
	if err := json.Unmarshal(so.Bytes(), &r); err != nil || len(r.Ops) == 0 {
		return 0, 0, 0, fmt.Errorf("vmsan bench output: %v: %s", err, so.String())
	}
	return r.Ops[0].Ops, r.Ops[0].Seconds, r.Totals.Reads + r.Totals.Writes, nil
}

// medians picks, per job and server, the sample with the median figure.
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
	has := func(s string) bool {
		for _, x := range rep.Servers {
			if x == s {
				return true
			}
		}
		return false
	}
	val := func(j Job, r *Result) float64 {
		if r == nil || r.Error != "" || r.NA != "" {
			return 0
		}
		if j.Throughput {
			return r.MBps
		}
		return r.IOPS
	}
	cell := func(j Job, r *Result) string {
		switch {
		case r == nil:
			return "-"
		case r.NA != "":
			return "n/a"
		case r.Error != "":
			return "error"
		}
		return fmt.Sprintf("%.0f", val(j, r))
	}
	ratio := func(j Job, a, b string) string {
		if !has(a) || !has(b) {
			return ""
		}
		ra, rb := get(j.Name, a), get(j.Name, b)
		if ra != nil && ra.NA != "" || rb != nil && rb.NA != "" {
			return "n/a\t"
		}
		va, vb := val(j, ra), val(j, rb)
		if va == 0 || vb == 0 {
			return "-\t"
		}
		return fmt.Sprintf("%.2fx\t", va/vb)
	}
	fmt.Fprintf(w, "iscsi-compare: %s file, %s per job and server, median of %d, page-cache writeback on every server\n", hostinfo.Human(rep.Size), rep.Runtime, rep.Repeat)
	fmt.Fprintf(w, "machine: %s\n\n", rep.Machine["summary"])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	hdr := "job\tunit\t"
	for _, s := range rep.Servers {
		hdr += s + "\t"
	}
	for _, c := range [][2]string{{VMSAN, TgtRdwr}, {VMSAN, TgtAIO}, {VMSAN, VMSANNBD}} {
		if has(c[0]) && has(c[1]) {
			hdr += c[0] + "/" + c[1] + "\t"
		}
	}
	fmt.Fprintln(tw, hdr)
	for _, j := range rep.Jobs {
		unit := "IOPS"
		if j.Throughput {
			unit = "MB/s"
		}
		line := j.Name + "\t" + unit + "\t"
		for _, s := range rep.Servers {
			line += cell(j, get(j.Name, s)) + "\t"
		}
		line += ratio(j, VMSAN, TgtRdwr) + ratio(j, VMSAN, TgtAIO) + ratio(j, VMSAN, VMSANNBD)
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
			r := get(j.Name, s)
			switch {
			case r != nil && r.NA != "":
				line += "n/a\t"
			case r == nil || r.Error != "" || r.ServerCPUus == 0:
				line += "-\t"
			default:
				line += fmt.Sprintf("%.1f\t", r.ServerCPUus)
			}
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "qemu-img bench steps sequentially (no random mode); iscsi-perf only reads; vmsan-nbd is vmsan's NBD server on the same file.")
	fmt.Fprintln(w, "server command lines:")
	for _, s := range rep.Servers {
		if c := rep.Commands[s]; c != "" {
			fmt.Fprintf(w, "  %-10s %s\n", s, c)
		}
	}
	for _, r := range rep.Medians {
		if r.Error != "" {
			fmt.Fprintf(w, "error: %s / %s: %s\n", r.Job, r.Server, hostinfo.FirstLine(r.Error))
		}
	}
}

// The helpers below follow bench/nbd-compare's (a main package cannot be
// imported).

// prepareFile creates vmsan volume name in dataDir and fills it with
// random data once, then reads it so the page cache is warm.
func prepareFile(ctx context.Context, bin, dataDir, name string, size int64) (string, error) {
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
	file := matches[0]
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if st.Size() != size {
		return "", fmt.Errorf("%s is %d bytes, want %d: remove %s or pass the old -size", file, st.Size(), size, dataDir)
	}
	marker := filepath.Join(filepath.Dir(dataDir), "filled-"+name)
	if _, err := os.Stat(marker); err != nil {
		hostinfo.Logf("filling %s (%d MiB) with random data", file, size>>20)
		buf := make([]byte, 4<<20)
		if _, err := rand.Read(buf); err != nil {
			return "", err
		}
		for off := int64(0); off < size; off += int64(len(buf)) {
			n := min(int64(len(buf)), size-off)
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

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run iscsi-compare from inside the vmsan repository")
	}
	return filepath.Dir(mod), nil
}
