package daemon

import (
	"fmt"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/volrt"
)

func (d *Daemon) startMetrics() error {
	ln, err := net.Listen("tcp", d.cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(metricsSource{d}))
	if d.cfg.Pprof {
		registerPprof(mux)
	}
	d.metricsLn = ln
	d.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return nil
}

// replMetricsFn supplies replication series (see SetReplicaMetrics).
type replMetricsFn = func() []metrics.Replica

// SetReplicaMetrics makes /metrics include replication series: fn is
// called at every scrape and must be safe for concurrent use (the
// replication plugin sets it; the daemon does not know the repl packages).
func (d *Daemon) SetReplicaMetrics(fn func() []metrics.Replica) { d.replMetrics.Store(&fn) }

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
		mv := metrics.Volume{Name: name, Size: v.Size(), Allocated: allocatedBytes(s.d.store.RawPath(name)), Engine: &es}
		mv.Connections = conns[name]
		out = append(out, mv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FrontEnds implements metrics.FrontEndSource.
func (s metricsSource) FrontEnds() []volrt.FrontEndStats { return s.d.frontEndStats() }
