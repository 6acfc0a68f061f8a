// Command repl-compare measures what replication costs: the same fio jobs
// (fio's nbd engine) against one vmsan volume unreplicated, replicated with
// protocol C, and replicated with protocol A, in one run on loopback.
//
//	go run ./bench/repl-compare                   # 10 s per job
//	go run ./bench/repl-compare -runtime 5s -json > result.json
//
// Each configuration gets fresh data directories and fresh `vmsan serve`
// processes (two for the replicated ones, the secondary on its own data
// directory); volumes use the default writeback cache mode. Jobs run
// job-major (for each job, each configuration in turn) so drift of a shared
// machine affects all alike. The program stops every process it started.
package main

import (
	"encoding/json"
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
	size := flag.String("size", "1G", "volume size")
	asJSON := flag.Bool("json", false, "print JSON")
	flag.Parse()

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
				r.MBps, r.IOPS, err = fio(uri, j, *runtime)
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

// setup creates the volume(s), configures replication if proto is set,
// starts the server(s) and returns the primary's NBD URI once in sync.
func setup(bin, dir, size, proto string) (string, error) {
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	nbdA, nbdB := freeAddr(), freeAddr()
	if err := run(bin, "volume", "create", "vol", "--size", size, "--data-dir", a); err != nil {
		return "", err
	}
	if proto != "" {
		if err := run(bin, "volume", "create", "vol", "--size", size, "--data-dir", b); err != nil {
			return "", err
		}
		ra, rb := freeAddr(), freeAddr()
		// The link authenticates the peer with a shared secret.
		secret := filepath.Join(dir, "repl.secret")
		if err := os.WriteFile(secret, []byte("repl-compare-shared-secret\n"), 0o600); err != nil {
			return "", err
		}
		if err := run(bin, "repl", "configure", "vol", "--data-dir", a, "--listen", ra, "--peer", rb, "--dial", "yes", "--role", "primary", "--protocol", proto, "--shared-secret-file", secret); err != nil {
			return "", err
		}
		if err := run(bin, "repl", "configure", "vol", "--data-dir", b, "--listen", rb, "--peer", ra, "--dial", "no", "--role", "secondary", "--protocol", proto, "--shared-secret-file", secret); err != nil {
			return "", err
		}
	}
	if err := serve(bin, a, nbdA); err != nil {
		return "", err
	}
	if proto != "" {
		if err := serve(bin, b, nbdB); err != nil {
			return "", err
		}
		// Wait for the initial (hole-skipping) sync to finish.
		deadline := time.Now().Add(60 * time.Second)
		for {
			out, _ := exec.Command(bin, "repl", "status", "--data-dir", a).CombinedOutput()
			if strings.Contains(string(out), "Connected") && !strings.Contains(string(out), "Sync") {
				break
			}
			if time.Now().After(deadline) {
				return "", fmt.Errorf("replication did not connect: %s", out)
			}
			time.Sleep(100 * time.Millisecond)
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

func fio(uri string, j job, runtime time.Duration) (mbps, iops float64, err error) {
	args := []string{"--name=" + j.Name, "--ioengine=nbd", "--uri=" + uri, "--rw=" + j.RW, "--bs=" + j.BS,
		fmt.Sprintf("--iodepth=%d", j.IODepth), "--time_based", fmt.Sprintf("--runtime=%ds", int(runtime.Seconds())),
		"--size=512M", "--output-format=json"}
	out, err := exec.Command("fio", args...).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("fio: %v", err)
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
