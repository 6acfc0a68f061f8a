package daemon

import (
	"os"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/volrt"
)

func (d *Daemon) startControl() error {
	srv, err := control.Listen(d.cfg.DataDir, ControlSocketMode, controlOps{d.vo, d}, d.log, d.eventsStop)
	if err != nil {
		return err
	}
	d.ctl = srv
	// Metrics are also on the control socket, so they are available without
	// opening a TCP port: curl --unix-socket DATA_DIR/control.sock http://x/metrics
	srv.Mux.Handle("GET /metrics", metrics.Handler(metricsSource{d}))
	if d.cfg.Pprof {
		metrics.RegisterPprof(srv.Mux)
	}
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
