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
//	GET /cut?path=NAME&how=blackhole|drop   cut the path
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
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/vmsan/vmsan/internal/testutil/faultproxy"
)

type path struct {
	name string
	p    *faultproxy.Proxy
	how  string // how it is cut now, "" when up
}

func main() {
	ctl := flag.String("ctl", "127.0.0.1:0", "control HTTP address")
	samples := flag.String("samples", "", "file for the per-path byte samples (none if empty)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: pathproxy -ctl ADDR [-samples FILE] NAME=LISTEN=TARGET ...")
		os.Exit(2)
	}
	paths := map[string]*path{}
	var order []*path
	for _, a := range flag.Args() {
		f := strings.SplitN(a, "=", 3)
		if len(f) != 3 {
			fatal("%q: want NAME=LISTEN=TARGET", a)
		}
		p, err := faultproxy.New(f[1], f[2])
		if err != nil {
			fatal("%s: %v", f[0], err)
		}
		pp := &path{name: f[0], p: p}
		paths[f[0]] = pp
		order = append(order, pp)
	}
	// The handlers run one at a time: a cut and a restore never interleave.
	ops := make(chan func(), 1)
	go func() {
		for op := range ops {
			op()
		}
	}()
	do := func(w http.ResponseWriter, r *http.Request, f func(*path) string) {
		pp := paths[r.URL.Query().Get("path")]
		if pp == nil {
			http.Error(w, "unknown path", http.StatusNotFound)
			return
		}
		done := make(chan string)
		ops <- func() { done <- f(pp) }
		fmt.Fprintln(w, <-done)
	}
	http.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	http.HandleFunc("/cut", func(w http.ResponseWriter, r *http.Request) {
		how := r.URL.Query().Get("how")
		if how != "blackhole" && how != "drop" {
			http.Error(w, "how: blackhole or drop", http.StatusBadRequest)
			return
		}
		do(w, r, func(pp *path) string {
			n := pp.p.Conns()
			if how == "drop" {
				pp.p.Drop(true)
			} else {
				pp.p.Blackhole(true)
			}
			pp.how = how
			return fmt.Sprintf("%s cut (%s, %d connections)", pp.name, how, n)
		})
	})
	http.HandleFunc("/restore", func(w http.ResponseWriter, r *http.Request) {
		do(w, r, func(pp *path) string {
			switch pp.how {
			case "drop":
				pp.p.Drop(false)
			case "blackhole":
				pp.p.Blackhole(false)
			}
			pp.how = ""
			return pp.name + " restored"
		})
	})
	if *samples != "" {
		f, err := os.Create(*samples)
		if err != nil {
			fatal("%v", err)
		}
		go func() {
			w := bufio.NewWriter(f)
			for t := range time.Tick(250 * time.Millisecond) {
				for _, pp := range order {
					fmt.Fprintf(w, "%d\t%s\t%d\n", t.UnixMilli(), pp.name, pp.p.Bytes.Load())
				}
				w.Flush()
			}
		}()
	}
	srv := &http.Server{Addr: *ctl, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		for _, pp := range order {
			pp.p.Close()
		}
		os.Exit(0)
	}()
	if err := srv.ListenAndServe(); err != nil {
		fatal("control: %v", err)
	}
}

func fatal(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "pathproxy: "+format+"\n", a...)
	os.Exit(1)
}
