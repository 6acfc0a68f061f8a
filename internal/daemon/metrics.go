package daemon

import (
	"fmt"
	"html"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/version"
	"github.com/vmsan/vmsan/internal/volrt"
)

func (d *Daemon) startMetrics() error {
	ln, err := net.Listen("tcp", d.cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(metricsSource{d}))
	mux.HandleFunc("GET /{$}", d.metricsIndex)
	if d.cfg.Pprof {
		registerPprof(mux)
	}
	d.metricsLn = ln
	d.metricsServed = limitedListener(ln, d, "metrics", fdShare(0, metricsMaxConns, 16))
	d.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: metricsReadTimeout,
		WriteTimeout: metricsWriteTimeout, IdleTimeout: metricsIdleTimeout, MaxHeaderBytes: 64 << 10,
		ErrorLog: httpErrorLog(d.log)}
	return nil
}

// metricsIndex answers GET / on the metrics listener with links to what it
// serves, so a person pointing a browser at the port (or a load balancer
// health check) gets a page rather than a 404. Other paths stay 404.
func (d *Daemon) metricsIndex(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprint(w, `<!DOCTYPE html>
<html><head><title>vmsan</title></head>
<body>
<h1>vmsan</h1>
<p>Version `+html.EscapeString(version.Get().Version)+`</p>
<ul>
<li><a href="/metrics">/metrics</a>: Prometheus metrics</li>
`)
	if d.cfg.Pprof {
		fmt.Fprint(w, `<li><a href="/debug/pprof/">/debug/pprof/</a>: Go profiling</li>
`)
	}
	fmt.Fprint(w, `</ul>
</body></html>
`)
}

// replMetricsFn supplies replication series (see SetReplicaMetrics).
type replMetricsFn = func() []metrics.Replica

// Replicas implements metrics.ReplicaSource.
func (s metricsSource) Replicas() []metrics.Replica {
	if fn := s.d.replMetrics.Load(); fn != nil {
		return (*fn)()
	}
	return nil
}

// metricsSource adapts the daemon to metrics.Source (and ReplicaSource).
type metricsSource struct{ d *Daemon }

func (s metricsSource) Volumes() []metrics.Volume {
	vols := *s.d.vols.Load()
	conns := map[string]int{}
	for _, fe := range s.d.frontEnds {
		for _, c := range fe.Stats().Clients {
			conns[c.Volume]++
		}
	}
	out := make([]metrics.Volume, 0, len(vols))
	for name, v := range vols {
		es := v.EngineStats()
		mv := metrics.Volume{Name: name, Size: v.Size(), Allocated: control.AllocatedBytes(s.d.store.RawPath(name)), Engine: &es}
		mv.Connections = conns[name]
		out = append(out, mv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FrontEnds implements metrics.FrontEndSource.
func (s metricsSource) FrontEnds() []volrt.FrontEndStats { return s.d.frontEndStats() }

// Budget implements metrics.BudgetSource.
func (s metricsSource) Budget() volrt.BudgetStats { return s.d.budget.Stats() }
