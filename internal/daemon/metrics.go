package daemon

import (
	"sort"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/volrt"
)

func (d *Daemon) startMetrics() error {
	l, err := metrics.Listen(d.cfg.MetricsListen, metricsSource{d}, d.cfg.Pprof, fdShare(0, metrics.MaxConns, 16), d.log)
	if err != nil {
		return err
	}
	d.metrics = l
	return nil
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
