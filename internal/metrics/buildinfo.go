package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmsan/vmsan/internal/version"
)

// buildInfo is the conventional always-1 gauge whose labels say which
// binary is running, so dashboards can show versions across nodes and
// alerts can join on them:
//
//	vmsan_build_info{version="v0.3.0-2-gabc",goversion="go1.26.8",revision="abc..."} 1
func buildInfo() prometheus.Collector {
	i := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "vmsan_build_info",
		Help:        "Always 1; the labels identify the vmsan binary (vmsan version).",
		ConstLabels: prometheus.Labels{"version": i.Version, "goversion": i.GoVersion, "revision": i.Revision},
	})
	g.Set(1)
	return g
}
