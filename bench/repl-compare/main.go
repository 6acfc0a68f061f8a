// Command repl-compare measures what replication costs: the same fio jobs
// (fio's nbd engine) against one vmsan volume unreplicated, replicated with
// protocol C, and replicated with protocol A, in one run on loopback.
//
//	go run ./bench/repl-compare                   # 10 s per job
//	go run ./bench/repl-compare -runtime 5s -json > result.json
//	go run ./bench/repl-compare -runtime 1s -size 64M  # smoke run (make test)
//
// Each configuration gets fresh data directories and fresh `vmsan serve`
// processes (two for the replicated ones, the secondary on its own data
// directory); volumes use the default writeback cache mode. Jobs run
// job-major (for each job, each configuration in turn) so drift of a shared
// machine affects all alike. The program stops every process it started.
// It exits non-zero when any cell failed (its error is in the table/JSON).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vmsan/vmsan/bench/internal/hostinfo"
)

type job struct {
	Name       string `json:"name"`
	RW, BS     string
	IODepth    int
	Throughput bool
}

var jobs = []job{
	{"seq-write-1M-QD8", "write", "1m", 8, true},
	{"rand-write-4K-QD32", "randwrite", "4k", 32, false},
}

type config struct {
	Name     string `json:"name"`
	Protocol string `json:"protocol"` // "" = unreplicated
}

var configs = []config{{"unreplicated", ""}, {"protocol C", "C"}, {"protocol A", "A"}}

type result struct {
	Job    string  `json:"job"`
	Config string  `json:"config"`
	MBps   float64 `json:"mb_per_s"`
	IOPS   float64 `json:"iops"`
	Err    string  `json:"error,omitempty"`
}

var procs []*exec.Cmd

func main() {
	bin := flag.String("vmsan", "", "vmsan binary (default: go build ./cmd/vmsan into a temp dir)")
	runtime := flag.Duration("runtime", 10*time.Second, "fio runtime per job")
	size := flag.String("size", "1G", "volume size (fio writes min(512M, size) of it)")
	asJSON := flag.Bool("json", false, "print JSON")
	flag.Parse()
	sizeBytes, err := hostinfo.ParseSize(*size)
	check(err)
	fioSize := min(sizeBytes, 512<<20)

	tmp, err := os.MkdirTemp("", "repl-compare-")
	check(err)
	defer os.RemoveAll(tmp)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; stopAll(); os.RemoveAll(tmp); os.Exit(1) }()
	defer stopAll()
	if *bin == "" {
		*bin = filepath.Join(tmp, "vmsan")
		out, err := exec.Command("go", "build", "-o", *bin, "./cmd/vmsan").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	var results []result
	for _, j := range jobs {
		for i, c := range configs {
			r := result{Job: j.Name, Config: c.Name}
			dir := filepath.Join(tmp, fmt.Sprintf("%s-%d", j.Name, i))
			uri, err := setup(*bin, dir, *size, c.Protocol)
			if err == nil {
				r.MBps, r.IOPS, err = fio(uri, j, *runtime, fioSize)
			}
			if err != nil {
				r.Err = err.Error()
			}
			stopAll()
			os.RemoveAll(dir)
			results = append(results, r)
			fmt.Fprintf(os.Stderr, "%-20s %-13s %8.1f MB/s %9.0f IOPS %s\n", r.Job, r.Config, r.MBps, r.IOPS, r.Err)
		}
	}
	defer exitIfFailed(results)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(results)
		return
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tCONFIG\tMB/s\tIOPS\tvs unreplicated")
	base := map[string]result{}
	for _, r := range results {
		if r.Config == "unreplicated" {
			base[r.Job] = r
		}
	}
	for _, r := range results {
		ratio := "-"
		if b := base[r.Job]; b.IOPS > 0 && r.IOPS > 0 {
			ratio = fmt.Sprintf("%.2fx", r.IOPS/b.IOPS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.0f\t%s\n", r.Job, r.Config, r.MBps, r.IOPS, ratio)
	}
	tw.Flush()
}

// exitIfFailed exits with status 1 when a cell failed, so a smoke run (and
// a script) sees a broken configuration, not only a line in the table.
func exitIfFailed(results []result) {
	n := 0
	for _, r := range results {
		if r.Err != "" || r.IOPS <= 0 {
			n++
		}
	}
	if n > 0 {
		fmt.Fprintf(os.Stderr, "repl-compare: %d of %d cells failed\n", n, len(results))
		stopAll()
		os.Exit(1)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		stopAll()
		os.Exit(1)
	}
}

// Ports come from 25000-25999, below the kernel's ephemeral range: a port
// picked with ":0" and released can be taken by any outgoing connection on
// the machine before the server binds it.
var nextPort = 25000 + os.Getpid()%1000

func freeAddr() string {
	for range 1000 {
		port := nextPort
		nextPort = 25000 + (nextPort+1-25000)%1000
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return addr
		}
	}
	check(fmt.Errorf("no free port in 25000-25999"))
	return ""
}

func run(bin string, args ...string) error {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("vmsan %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// node is one side of a replicated pair: its data directory and addresses.
type node struct {
	dir    string
	listen string // replication
	role   string
	dial   string // "yes": this node dials its peer
}

// replConfigure writes the replication configuration of vol on a and b,
// each naming the other as peer. Every setting of the pair is made here
// (one place to add a new one, such as a shared secret).
func replConfigure(bin string, a, b node, proto string) error {
	// The link authenticates the peer with a shared secret, the same file
	// for both nodes.
	secret := filepath.Join(filepath.Dir(a.dir), "repl.secret")
	if err := os.WriteFile(secret, []byte("repl-compare-shared-secret\n"), 0o600); err != nil {
		return err
	}
	for _, p := range [][2]node{{a, b}, {b, a}} {
		self, peer := p[0], p[1]
		if err := run(bin, "repl", "configure", "vol", "--data-dir", self.dir, "--listen", self.listen, "--peer", peer.listen,
			"--dial", self.dial, "--role", self.role, "--protocol", proto, "--shared-secret-file", secret); err != nil {
			return err
		}
	}
	return nil
}

// replState is the part of `vmsan repl status --json` this program reads.
type replState struct {
	Volume   string `json:"volume"`
	Disk     string `json:"disk"`
	Conn     string `json:"connection"`
	PeerDisk string `json:"peer_disk"`
}

// waitInSync polls `vmsan repl status --json` on the primary until vol is
// Connected with both disks UpToDate (the initial sync is done).
func waitInSync(bin, dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		out, err := exec.Command(bin, "repl", "status", "vol", "--json", "--data-dir", dir).Output()
		var st []replState
		switch {
		case err != nil:
			last = err.Error()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				last += ": " + strings.TrimSpace(string(ee.Stderr))
			}
		case json.Unmarshal(out, &st) != nil || len(st) != 1:
			last = "unexpected repl status --json output: " + string(out)
		default:
			s := st[0]
			if s.Conn == "Connected" && s.Disk == "UpToDate" && s.PeerDisk == "UpToDate" {
				return nil
			}
			last = fmt.Sprintf("connection %s, disk %s, peer disk %s", s.Conn, s.Disk, s.PeerDisk)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replication did not connect and sync within %v: %s", timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// setup creates the volume(s), configures replication if proto is set,
// starts the server(s) and returns the primary's NBD URI once in sync.
func setup(bin, dir, size, proto string) (string, error) {
	a := node{dir: filepath.Join(dir, "a"), role: "primary", dial: "yes"}
	b := node{dir: filepath.Join(dir, "b"), role: "secondary", dial: "no"}
	nbdA, nbdB := freeAddr(), freeAddr()
	if err := run(bin, "volume", "create", "vol", "--size", size, "--data-dir", a.dir); err != nil {
		return "", err
	}
	if proto != "" {
		if err := run(bin, "volume", "create", "vol", "--size", size, "--data-dir", b.dir); err != nil {
			return "", err
		}
		a.listen, b.listen = freeAddr(), freeAddr()
		if err := replConfigure(bin, a, b, proto); err != nil {
			return "", err
		}
	}
	if err := serve(bin, a.dir, nbdA); err != nil {
		return "", err
	}
	if proto != "" {
		if err := serve(bin, b.dir, nbdB); err != nil {
			return "", err
		}
		// Wait for the initial (hole-skipping) sync to finish.
		if err := waitInSync(bin, a.dir, 60*time.Second); err != nil {
			return "", err
		}
	}
	return "nbd://" + nbdA + "/vol", nil
}

func serve(bin, dir, addr string) error {
	logf, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "serve", "--data-dir", dir, "--listen", addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	procs = append(procs, cmd)
	for i := 0; i < 200; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("vmsan serve on %s did not start", addr)
}

func stopAll() {
	for _, p := range procs {
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			p.Process.Kill()
			<-done
		}
	}
	procs = nil
}

func fio(uri string, j job, runtime time.Duration, size int64) (mbps, iops float64, err error) {
	args := []string{"--name=" + j.Name, "--ioengine=nbd", "--uri=" + uri, "--rw=" + j.RW, "--bs=" + j.BS,
		fmt.Sprintf("--iodepth=%d", j.IODepth), "--time_based", fmt.Sprintf("--runtime=%dms", max(runtime.Milliseconds(), 1)),
		fmt.Sprintf("--size=%d", size), "--output-format=json"}
	var stderr strings.Builder
	cmd := exec.Command("fio", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, 0, fmt.Errorf("fio: %v: %s", err, hostinfo.FirstLine(stderr.String()))
	}
	// fio may print warnings before the JSON document.
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:]
	}
	var doc struct {
		Jobs []struct {
			Write struct {
				BwBytes float64 `json:"bw_bytes"`
				IOPS    float64 `json:"iops"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || len(doc.Jobs) == 0 {
		return 0, 0, fmt.Errorf("fio output: %v", err)
	}
	w := doc.Jobs[0].Write
	return w.BwBytes / 1e6, w.IOPS, nil
}
