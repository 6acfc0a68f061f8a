// Command pathproxy is the scenarios' network between a guest and an
// iSCSI target: one fault-injecting TCP proxy per path
// (internal/testutil/faultproxy, the proxy the guest tests cut paths
// with), controlled over HTTP, with each path's traffic sampled to a file.
//
//	go run ./scenarios/pathproxy -ctl 127.0.0.1:C -samples s.tsv \
//	    a1=127.0.0.1:P1=127.0.0.1:T1 a2=127.0.0.1:P2=127.0.0.1:T2 ...
//
// Each argument is NAME=LISTEN=TARGET. Control (curl):
//
//	GET /cut?path=NAME&how=blackhole|drop   cut the path (409 if it is cut)
//	GET /restore?path=NAME                 restore it
//	GET /ready                             200 once every proxy listens
//
// "blackhole" stalls the path's connections (a cable pulled, a switch
// port dead: TCP keeps retransmitting and only the initiator's NOP-Out
// ping notices), "drop" closes them and refuses new ones (a port that went
// away). Every 250 ms each path's forwarded byte count (both directions,
// cumulative) is appended to the samples file as
// "UNIX_MS<TAB>NAME<TAB>BYTES", from which the scenario draws per-path
// throughput around the cut.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmsan/vmsan/internal/testutil/faultproxy"
)

type path struct {
	name string
	p    *faultproxy.Proxy
	how  string // how it is cut now, "" when up
}

// proxies is the set of paths and their control handler.
type proxies struct {
	paths map[string]*path
	order []*path
	mu    sync.Mutex // serializes cuts and restores
}

// newProxies starts one proxy per NAME=LISTEN=TARGET spec.
func newProxies(specs []string) (*proxies, error) {
	ps := &proxies{paths: map[string]*path{}}
	for _, a := range specs {
		f := strings.SplitN(a, "=", 3)
		if len(f) != 3 || f[0] == "" {
			ps.Close()
			return nil, fmt.Errorf("%q: want NAME=LISTEN=TARGET", a)
		}
		if ps.paths[f[0]] != nil {
			ps.Close()
			return nil, fmt.Errorf("%q: path %s given twice", a, f[0])
		}
		p, err := faultproxy.New(f[1], f[2])
		if err != nil {
			ps.Close()
			return nil, fmt.Errorf("%s: %v", f[0], err)
		}
		pp := &path{name: f[0], p: p}
		ps.paths[f[0]] = pp
		ps.order = append(ps.order, pp)
	}
	return ps, nil
}

// Close stops every proxy.
func (ps *proxies) Close() {
	for _, pp := range ps.order {
		pp.p.Close()
	}
}

// ServeHTTP answers /ready, /cut and /restore.
func (ps *proxies) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.URL.Path == "/ready" {
		fmt.Fprintln(w, "ok")
		return
	}
	if r.URL.Path != "/cut" && r.URL.Path != "/restore" {
		http.NotFound(w, r)
		return
	}
	pp := ps.paths[q.Get("path")]
	if pp == nil {
		http.Error(w, "unknown path", http.StatusNotFound)
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if r.URL.Path == "/restore" {
		switch pp.how {
		case "drop":
			pp.p.Refuse(false)
		case "blackhole":
			pp.p.Blackhole(false)
		}
		pp.how = ""
		fmt.Fprintln(w, pp.name+" restored")
		return
	}
	how := q.Get("how")
	if pp.how != "" {
		http.Error(w, pp.name+" is already cut ("+pp.how+")", http.StatusConflict)
		return
	}
	n := pp.p.Conns()
	switch how {
	case "drop":
		pp.p.Refuse(true)
	case "blackhole":
		pp.p.Blackhole(true)
	default:
		http.Error(w, "how: blackhole or drop", http.StatusBadRequest)
		return
	}
	pp.how = how
	fmt.Fprintf(w, "%s cut (%s, %d connections)\n", pp.name, how, n)
}

// sample appends every path's cumulative byte count to w every interval.
func (ps *proxies) sample(w io.Writer, interval time.Duration) {
	bw := bufio.NewWriter(w)
	for t := range time.Tick(interval) {
		for _, pp := range ps.order {
			fmt.Fprintf(bw, "%d\t%s\t%d\n", t.UnixMilli(), pp.name, pp.p.Bytes.Load())
		}
		bw.Flush()
	}
}

func main() {
	ctl := flag.String("ctl", "127.0.0.1:0", "control HTTP address")
	samples := flag.String("samples", "", "file for the per-path byte samples (none if empty)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: pathproxy -ctl ADDR [-samples FILE] NAME=LISTEN=TARGET ...")
		os.Exit(2)
	}
	ps, err := newProxies(flag.Args())
	if err != nil {
		fatal("%v", err)
	}
	if *samples != "" {
		f, err := os.Create(*samples)
		if err != nil {
			fatal("%v", err)
		}
		go ps.sample(f, 250*time.Millisecond)
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		ps.Close()
		os.Exit(0)
	}()
	srv := &http.Server{Addr: *ctl, Handler: ps, ReadHeaderTimeout: 5 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fatal("control: %v", err)
	}
}

func fatal(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "pathproxy: "+format+"\n", a...)
	os.Exit(1)
}
