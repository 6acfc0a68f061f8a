package daemon

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/volrt"
)

func (d *Daemon) startControl() error {
	// Only the owner (root, normally) may create or delete volumes: the
	// socket is ControlSocketMode from the start (see netutil.ListenUnix). Bind
	// under a temporary name, then rename it into place, so a client never
	// finds a socket under the real name that is not yet served.
	// (Holding the data-dir lock means no other daemon uses either name.)
	tmp := filepath.Join(d.cfg.DataDir, ".control.sock.tmp")
	ln, err := netutil.ListenUnix(tmp, ControlSocketMode)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if err := os.Rename(tmp, d.ControlPath()); err != nil {
		ln.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	d.ctlLn = ln
	mux := http.NewServeMux()
	control.Register(mux, controlOps{d.vo, d}, d.log, d.eventsStop)
	// Metrics are also on the control socket, so they are available without
	// opening a TCP port: curl --unix-socket DATA_DIR/control.sock http://x/metrics
	mux.Handle("GET /metrics", metrics.Handler(metricsSource{d}))
	if d.cfg.Pprof {
		metrics.RegisterPprof(mux)
	}
	d.ctlMux = mux
	d.ctlSrv = &http.Server{Handler: control.WithBodyDeadline(mux), ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: control.IdleTimeout, MaxHeaderBytes: 64 << 10, ErrorLog: netutil.HTTPErrorLog(d.log)}
	d.ctlSrv.RegisterOnShutdown(func() { close(d.eventsStop) })
	return nil
}

// status assembles the /v1/status document.
func (d *Daemon) status() Status {
	st := Status{APIVersion: APIVersion, PID: os.Getpid(), DataDir: d.cfg.DataDir}
	st.FrontEnds = d.frontEndStats()
	bs := d.budget.Stats()
	st.InflightBudget = &bs
	clients := map[string][]volrt.Session{}
	for _, fs := range st.FrontEnds {
		st.Listeners = append(st.Listeners, fs.Listeners...)
		for _, c := range fs.Clients {
			clients[c.Volume] = append(clients[c.Volume], c)
		}
		if fs.Name == "nbd" {
			st.Server = fs.Detail // kept for API version 1 readers
		}
	}
	if a := d.MetricsAddr(); a != nil {
		st.Metrics = "http://" + a.String() + "/metrics"
	}
	list, _ := d.store.List()
	vols := *d.vols.Load()
	for _, m := range list {
		cs := clients[m.Name]
		vs := VolumeStatus{VolumeInfo: d.vo.InfoOf(m), Connections: len(cs), Clients: cs}
		if v := vols[m.Name]; v != nil {
			es := control.EngineStatsOf(v.EngineStats())
			vs.Engine = &es
		}
		vs.NoSpace = d.noSpace.Status(m.Name)
		st.Volumes = append(st.Volumes, vs)
	}
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	for k, fn := range d.statusFn {
		// nil: the section has nothing to show now (replication with no
		// replicated volume), so it is left out.
		if v := fn(); v != nil {
			if st.Extra == nil {
				st.Extra = map[string]any{}
			}
			st.Extra[k] = v
		}
	}
	return st
}
