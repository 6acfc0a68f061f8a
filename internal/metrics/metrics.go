// Package metrics exports vmsan's counters to Prometheus.
//
// Simplest use:
//
//	h := metrics.Handler(src)           // src implements Source
//	http.Handle("/metrics", h)
//
// Nothing is recorded here: the I/O engine and the NBD server keep their own
// cheap counters (atomics and fixed histograms) and this package reads
// snapshots at scrape time, so the data path never touches a Prometheus
// type. That keeps per-request cost at a few atomic adds and means a slow
// scraper cannot slow I/O.
//
// Metric names (all prefixed vmsan_):
//
//	volume_size_bytes, volume_allocated_bytes, volume_connections    {volume}
//	engine_requests_total, engine_backend_ops_total                  {volume, op}
//	engine_merged_requests_total, engine_errors_total, engine_rejected_total {volume}
//	engine_bytes_total                                               {volume, direction}
//	engine_queue_depth, engine_in_flight                             {volume}
//	engine_request_latency_seconds (histogram)                       {volume}
//	engine_backend_write_size_bytes, engine_backend_read_size_bytes (histograms) {volume}
//	nbd_connections_accepted_total, nbd_connections_active, nbd_handshake_failures_total,
//	nbd_tls_handshakes_total, nbd_requests_total{command: read, write, flush, ...}, nbd_error_replies_total,
//	nbd_bytes_total{direction}, nbd_protocol_errors_total, nbd_panics_total,
//	nbd_hole_chunks_total, nbd_inflight_requests
//	build_info{version, goversion, revision} (always 1)
//
// Concurrency: the collector is safe for concurrent scrapes as long as the
// Source is.
package metrics

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/nbd/server"
)

// Volume is one volume's snapshot.
type Volume struct {
	Name        string
	Size        int64
	Allocated   int64
	Connections int
	// Engine is nil when the volume is not open.
	Engine *ioengine.Stats
}

// Source supplies snapshots at scrape time.
type Source interface {
	Volumes() []Volume
	// ServerStats returns the NBD server's counters; ok=false if there is
	// no server.
	ServerStats() (st server.Stats, ok bool)
}

// NewRegistry returns a Prometheus registry with vmsan's collector plus the
// standard Go runtime and process collectors.
func NewRegistry(src Source) *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(NewCollector(src))
	r.MustRegister(buildInfo())
	r.MustRegister(collectors.NewGoCollector())
	r.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Handler serves the registry in the Prometheus text format.
func Handler(src Source) http.Handler {
	return promhttp.HandlerFor(NewRegistry(src), promhttp.HandlerOpts{})
}

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src Source
}

// NewCollector returns a collector reading src at every scrape.
func NewCollector(src Source) *Collector { return &Collector{src: src} }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("vmsan_"+name, help, labels, nil)
}

var (
	dVolSize   = desc("volume_size_bytes", "Volume size in bytes.", "volume")
	dVolAlloc  = desc("volume_allocated_bytes", "Bytes allocated to the volume's sparse file on the host filesystem.", "volume")
	dVolConns  = desc("volume_connections", "NBD connections currently open to the volume.", "volume")
	dReqs      = desc("engine_requests_total", "Requests accepted by the volume's I/O engine.", "volume", "op")
	dOps       = desc("engine_backend_ops_total", "Backend calls made by the I/O engine (a merged run counts once).", "volume", "op")
	dMerged    = desc("engine_merged_requests_total", "Requests that shared a backend call with another request.", "volume")
	dErrors    = desc("engine_errors_total", "Requests completed with an error.", "volume")
	dRejected  = desc("engine_rejected_total", "Requests rejected before queueing.", "volume")
	dBytes     = desc("engine_bytes_total", "Payload bytes moved by backend reads and writes.", "volume", "direction")
	dQueue     = desc("engine_queue_depth", "Requests submitted and not yet completed.", "volume")
	dInFlight  = desc("engine_in_flight", "Backend calls running now.", "volume")
	dLatency   = desc("engine_request_latency_seconds", "Submit-to-completion latency per request.", "volume")
	dWriteSize = desc("engine_backend_write_size_bytes", "Bytes per backend write call.", "volume")
	dReadSize  = desc("engine_backend_read_size_bytes", "Bytes per backend read call.", "volume")

	dAccepted = desc("nbd_connections_accepted_total", "NBD connections accepted.")
	dActive   = desc("nbd_connections_active", "NBD connections open now.")
	dHSFail   = desc("nbd_handshake_failures_total", "Connections that ended before the transmission phase.")
	dTLS      = desc("nbd_tls_handshakes_total", "Successful TLS upgrades.")
	dNBDReqs  = desc("nbd_requests_total", "NBD requests by command.", "command")
	dErrReply = desc("nbd_error_replies_total", "NBD replies carrying an error.")
	dNBDBytes = desc("nbd_bytes_total", "NBD payload bytes (read = sent to clients, write = received).", "direction")
	dProtoErr = desc("nbd_protocol_errors_total", "Connections closed for protocol violations.")
	dPanics   = desc("nbd_panics_total", "Recovered panics in connection handlers (each one is a bug).")
	dHoles    = desc("nbd_hole_chunks_total", "Structured-read OFFSET_HOLE chunks sent.")
	dNBDInfl  = desc("nbd_inflight_requests", "NBD requests received and not yet replied.")
	allDescs  = []*prometheus.Desc{dVolSize, dVolAlloc, dVolConns, dReqs, dOps, dMerged, dErrors, dRejected, dBytes, dQueue, dInFlight, dLatency, dWriteSize, dReadSize, dAccepted, dActive, dHSFail, dTLS, dNBDReqs, dErrReply, dNBDBytes, dProtoErr, dPanics, dHoles, dNBDInfl}
	opNames   = []string{"read", "write", "flush", "trim", "write_zeroes", "cache"}
	cmdNames  = [8]string{}
)

func init() {
	for i := range cmdNames {
		// "NBD_CMD_WRITE_ZEROES" -> "write_zeroes", matching the engine's op label.
		cmdNames[i] = strings.ToLower(strings.TrimPrefix(proto.Cmd(i).String(), "NBD_CMD_"))
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

func opValues(o ioengine.OpCounts) []uint64 {
	return []uint64{o.Read, o.Write, o.Flush, o.Trim, o.WriteZeroes, o.Cache}
}

// histogram converts an engine histogram (non-cumulative log2 buckets) to a
// Prometheus const histogram, dividing bounds and sum by div (1e9 turns
// nanoseconds into the seconds Prometheus expects; dividing rather than
// multiplying by 1e-9 keeps bounds like 1e-06 exact in the output).
func histogram(d *prometheus.Desc, h ioengine.Histogram, div float64, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.UpperBounds))
	var cum uint64
	for i, ub := range h.UpperBounds {
		if i < len(h.Counts) {
			cum += h.Counts[i]
		}
		buckets[float64(ub)/div] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.Count, float64(h.Sum)/div, buckets, labels...)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	for _, v := range c.src.Volumes() {
		gauge(dVolSize, float64(v.Size), v.Name)
		gauge(dVolAlloc, float64(v.Allocated), v.Name)
		gauge(dVolConns, float64(v.Connections), v.Name)
		e := v.Engine
		if e == nil {
			continue
		}
		reqs, ops := opValues(e.Requests), opValues(e.BackendOps)
		for i, op := range opNames {
			counter(dReqs, reqs[i], v.Name, op)
			counter(dOps, ops[i], v.Name, op)
		}
		counter(dMerged, e.Merged, v.Name)
		counter(dErrors, e.Errors, v.Name)
		counter(dRejected, e.Rejected, v.Name)
		counter(dBytes, e.BytesRead, v.Name, "read")
		counter(dBytes, e.BytesWritten, v.Name, "write")
		gauge(dQueue, float64(e.QueueDepth), v.Name)
		gauge(dInFlight, float64(e.InFlight), v.Name)
		ch <- histogram(dLatency, e.Latency, 1e9, v.Name)
		ch <- histogram(dWriteSize, e.WriteSizes, 1, v.Name)
		ch <- histogram(dReadSize, e.ReadSizes, 1, v.Name)
	}
	st, ok := c.src.ServerStats()
	if !ok {
		return
	}
	counter(dAccepted, st.Accepted)
	gauge(dActive, float64(st.ActiveConns))
	counter(dHSFail, st.HandshakeFails)
	counter(dTLS, st.TLSHandshakes)
	for i, n := range st.Requests {
		counter(dNBDReqs, n, cmdNames[i])
	}
	counter(dErrReply, st.ErrorReplies)
	counter(dNBDBytes, st.BytesRead, "read")
	counter(dNBDBytes, st.BytesWritten, "write")
	counter(dProtoErr, st.ProtocolErrors)
	counter(dPanics, st.Panics)
	counter(dHoles, st.HoleChunks)
	gauge(dNBDInfl, float64(st.InflightRequests))
}
