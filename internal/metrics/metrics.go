// Package metrics exports vmsan's counters to Prometheus.
//
// Simplest use:
//
//	h := metrics.Handler(src)           // src implements Source
//	http.Handle("/metrics", h)
//
// Nothing is recorded here: the I/O engine and the front ends keep their own
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
//	engine_no_space_errors_total (ENOSPC/EDQUOT from the host filesystem) {volume}
//	engine_bytes_total                                               {volume, direction}
//	engine_queue_depth, engine_in_flight                             {volume}
//	engine_request_latency_seconds (histogram)                       {volume}
//	engine_backend_write_size_bytes, engine_backend_read_size_bytes (histograms) {volume}
//	nbd_connections_accepted_total, nbd_connections_active, nbd_handshake_failures_total,
//	nbd_tls_handshakes_total, nbd_requests_total{command: read, write, flush, ...}, nbd_error_replies_total,
//	nbd_bytes_total{direction}, nbd_protocol_errors_total, nbd_panics_total,
//	nbd_hole_chunks_total, nbd_inflight_requests   (from the front end named "nbd":
//	                                               its volrt.FrontEndStats; this package
//	                                               imports no front end)
//	build_info{version, goversion, revision} (always 1)
//
// Front ends, protocol-neutral (when the Source also implements
// FrontEndSource; NBD is frontend="nbd", iSCSI will add its own):
//
//	frontend_connections_accepted_total, frontend_connections_active  {frontend}
//	frontend_requests_total, frontend_error_replies_total             {frontend}
//	frontend_bytes_total                                              {frontend, direction}
//	frontend_volume_clients                                           {frontend, volume}
//	frontend_connections_refused_total (connection/session limit)     {frontend}
//	iscsi_login_failures_total{reason}  (from the front end named "iscsi"):
//	    authentication, authorization, not_found, missing_parameter,
//	    unsupported_version, session_type, session_not_found,
//	    initiator_error, out_of_resources, service_unavailable,
//	    target_error, protocol
//
// The daemon-wide in-flight budget (when the Source also implements
// BudgetSource):
//
//	inflight_budget_bytes, inflight_budget_used_bytes
//	inflight_budget_waits_total (NBD readers paused), inflight_budget_refused_total (iSCSI BUSY/TASK SET FULL)
//
// Client addresses are not labels (unbounded cardinality): `vmsan status`
// and /v1/status list them.
//
// Replication (one set per replicated volume, when the Source also
// implements ReplicaSource). States are enum gauges: one series per
// possible state, 1 for the current one and 0 for the others; peer states
// are "Unknown" while not connected.
//
//	repl_role{volume, role}, repl_peer_role{volume, role}            Primary, Secondary (peer: also Unknown)
//	repl_disk_state{volume, state}, repl_peer_disk_state{volume, state} Diskless .. UpToDate (peer: also Unknown)
//	repl_connection_state{volume, state}                              StandAlone, Connecting, Handshake, Connected, Sync*, Verify*
//	repl_out_of_sync_bytes, repl_pending_writes                       {volume}
//	repl_metadata_write_held                                          {volume}: 1 while a metadata write is retried
//	repl_resync_rate_bytes_per_second                                 {volume} (as sync source or target; 0 otherwise)
//	repl_resync_bytes_total{volume, kind: data, zero, hash_match}     (resynced as source)
//	repl_replicated_bytes_total                                       {volume}
//	repl_disconnects_total{volume, reason}                            reason: admin, ping_timeout, ko_timeout,
//	                                                                  peer_closed, io_error, protocol_error,
//	                                                                  split_brain, handshake_refused, other
//	repl_peer_ack_latency_seconds (histogram)                         {volume}: replicated write sent to first peer ack
//
// Concurrency: the collector is safe for concurrent scrapes as long as the
// Source is.
package metrics

import (
	"net/http"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/volrt"
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

// Replica is one replicated volume's snapshot. State fields hold the repl
// package's state names (Role.String() etc.).
type Replica struct {
	Volume                                string
	Role, Disk, Conn, PeerRole, PeerDisk  string
	OutOfSync                             int64
	ResyncRate                            float64 // bytes/s
	ResyncBytes, ResyncZeroBytes          int64   // counters
	ResyncHashMatchBytes, ReplicatedBytes int64   // counters
	PendingWrites                         int64
	// MetadataHeld: a metadata write failed transiently and is retried;
	// acknowledgements wait for it.
	MetadataHeld bool
	// Disconnects by reason kind; the producer keeps the key set bounded
	// and fixed (zeros included) so rate() works from the first scrape.
	Disconnects map[string]uint64
	// AckLatency in nanoseconds.
	AckLatency ioengine.Histogram
}

// ReplicaSource is implemented by Sources that have replicated volumes.
type ReplicaSource interface {
	Replicas() []Replica
}

// FrontEndSource is implemented by Sources that report front ends
// (daemon's: one entry per front end in its list).
type FrontEndSource interface {
	FrontEnds() []volrt.FrontEndStats
}

// BudgetSource is implemented by Sources with a daemon-wide in-flight
// budget (the daemon's inflight_budget).
type BudgetSource interface {
	Budget() volrt.BudgetStats
}

// Source supplies snapshots at scrape time. Front ends come through
// FrontEndSource (the vmsan_nbd_* series from the front end named "nbd"),
// replicas through ReplicaSource.
type Source interface {
	Volumes() []Volume
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
	dVolConns  = desc("volume_connections", "Client connections (all front ends) currently open to the volume.", "volume")
	dReqs      = desc("engine_requests_total", "Requests accepted by the volume's I/O engine.", "volume", "op")
	dOps       = desc("engine_backend_ops_total", "Backend calls made by the I/O engine (a merged run counts once).", "volume", "op")
	dMerged    = desc("engine_merged_requests_total", "Requests that shared a backend call with another request.", "volume")
	dErrors    = desc("engine_errors_total", "Requests completed with an error.", "volume")
	dNoSpace   = desc("engine_no_space_errors_total", "Requests failed with ENOSPC or EDQUOT by the host filesystem (thin volume out of space).", "volume")
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

	dRRole     = desc("repl_role", "Replication role of this node (1 for the current role).", "volume", "role")
	dRPeerRole = desc("repl_peer_role", "Replication role of the peer (Unknown while not connected).", "volume", "role")
	dRDisk     = desc("repl_disk_state", "Disk state of the local replica.", "volume", "state")
	dRPeerDisk = desc("repl_peer_disk_state", "Disk state of the peer's replica (Unknown while not connected).", "volume", "state")
	dRConn     = desc("repl_connection_state", "Replication connection state.", "volume", "state")
	dROOS      = desc("repl_out_of_sync_bytes", "Bytes marked out of sync with the peer.", "volume")
	dRPending  = desc("repl_pending_writes", "Client writes accepted by replication and not yet answered.", "volume")
	dRMetaHeld = desc("repl_metadata_write_held", "1 while a replication metadata write failed for a transient reason (out of descriptors, memory, space) and is retried: no write is acknowledged meanwhile.", "volume")
	dRRate     = desc("repl_resync_rate_bytes_per_second", "Resync rate since the resync started (as sync source or target).", "volume")
	dRResync   = desc("repl_resync_bytes_total", "Bytes resynced to the peer as sync source, by how they travelled.", "volume", "kind")
	dRSent     = desc("repl_replicated_bytes_total", "Client write payload bytes replicated to the peer.", "volume")
	dRDisc     = desc("repl_disconnects_total", "Replication disconnects by reason kind.", "volume", "reason")
	dRAckLat   = desc("repl_peer_ack_latency_seconds", "Time from sending a replicated write to the peer's first ack.", "volume")

	dFEAccepted     = desc("frontend_connections_accepted_total", "Connections accepted by the front end.", "frontend")
	dFEActive       = desc("frontend_connections_active", "Connections open now on the front end.", "frontend")
	dFEReqs         = desc("frontend_requests_total", "Requests received by the front end.", "frontend")
	dFEErrs         = desc("frontend_error_replies_total", "Replies carrying an error.", "frontend")
	dFEBytes        = desc("frontend_bytes_total", "Payload bytes (read = sent to clients, write = received).", "frontend", "direction")
	dFEClients      = desc("frontend_volume_clients", "Clients using the volume through the front end now.", "frontend", "volume")
	dFERefused      = desc("frontend_connections_refused_total", "Connections (NBD) or logins (iSCSI) refused for the daemon's connection/session limit.", "frontend")
	dISCSILoginFail = desc("iscsi_login_failures_total", "iSCSI logins refused, by reason (authentication: CHAP; authorization: ACL or no access control configured).", "reason")

	dBudgetLimit   = desc("inflight_budget_bytes", "Daemon-wide bound on request payload bytes held in flight (inflight_budget).")
	dBudgetUsed    = desc("inflight_budget_used_bytes", "Request payload bytes held in flight now, over all clients of all front ends.")
	dBudgetWaits   = desc("inflight_budget_waits_total", "Reservations that waited for the daemon-wide budget (NBD: a connection stopped reading requests until memory freed).")
	dBudgetRefused = desc("inflight_budget_refused_total", "Reservations refused because the daemon-wide budget was spent (iSCSI: a command answered BUSY or TASK SET FULL).")

	allDescs = []*prometheus.Desc{dISCSILoginFail, dFERefused, dBudgetLimit, dBudgetUsed, dBudgetWaits, dBudgetRefused, dFEAccepted, dFEActive, dFEReqs, dFEErrs, dFEBytes, dFEClients, dVolSize, dVolAlloc, dVolConns, dReqs, dOps, dMerged, dErrors, dNoSpace, dRejected, dBytes, dQueue, dInFlight, dLatency, dWriteSize, dReadSize, dAccepted, dActive, dHSFail, dTLS, dNBDReqs, dErrReply, dNBDBytes, dProtoErr, dPanics, dHoles, dNBDInfl,
		dRRole, dRPeerRole, dRDisk, dRPeerDisk, dRConn, dROOS, dRPending, dRMetaHeld, dRRate, dRResync, dRSent, dRDisc, dRAckLat}
	opNames = []string{"read", "write", "flush", "trim", "write_zeroes", "cache"}

	// Every state an enum gauge reports, from the repl package's names.
	roleNames, peerRoleNames, diskNames, peerDiskNames, connNames []string
)

func init() {
	for _, r := range []repl.Role{repl.Primary, repl.Secondary} {
		roleNames = append(roleNames, r.String())
	}
	peerRoleNames = append(append([]string(nil), roleNames...), repl.RoleUnknown.String())
	for d := repl.Diskless; d <= repl.UpToDate; d++ {
		diskNames = append(diskNames, d.String())
	}
	peerDiskNames = append(append([]string(nil), diskNames...), repl.DiskUnknown.String())
	for c := repl.StandAlone; c <= repl.VerifyTarget; c++ {
		connNames = append(connNames, c.String())
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
		counter(dNoSpace, e.NoSpaceErrors, v.Name)
		counter(dRejected, e.Rejected, v.Name)
		counter(dBytes, e.BytesRead, v.Name, "read")
		counter(dBytes, e.BytesWritten, v.Name, "write")
		gauge(dQueue, float64(e.QueueDepth), v.Name)
		gauge(dInFlight, float64(e.InFlight), v.Name)
		ch <- histogram(dLatency, e.Latency, 1e9, v.Name)
		ch <- histogram(dWriteSize, e.WriteSizes, 1, v.Name)
		ch <- histogram(dReadSize, e.ReadSizes, 1, v.Name)
	}
	if fs, ok := c.src.(FrontEndSource); ok {
		for _, f := range fs.FrontEnds() {
			counter(dFEAccepted, f.Accepted, f.Name)
			gauge(dFEActive, float64(f.Active), f.Name)
			counter(dFERefused, f.Refused, f.Name)
			counter(dFEReqs, f.Requests, f.Name)
			counter(dFEErrs, f.ErrorReplies, f.Name)
			counter(dFEBytes, f.BytesRead, f.Name, "read")
			counter(dFEBytes, f.BytesWritten, f.Name, "write")
			per := map[string]int{}
			for _, cl := range f.Clients {
				per[cl.Volume]++
			}
			for vol, n := range per {
				gauge(dFEClients, float64(n), f.Name, vol)
			}
			if f.Name == "nbd" {
				collectNBD(ch, f)
			}
			if f.Name == "iscsi" {
				reasons := make([]string, 0, len(f.LoginFailures))
				for r := range f.LoginFailures {
					reasons = append(reasons, r)
				}
				sort.Strings(reasons)
				for _, r := range reasons {
					counter(dISCSILoginFail, f.LoginFailures[r], r)
				}
			}
		}
	}
	if bs, ok := c.src.(BudgetSource); ok {
		b := bs.Budget()
		gauge(dBudgetLimit, float64(b.Limit))
		gauge(dBudgetUsed, float64(b.Used))
		counter(dBudgetWaits, b.Waits)
		counter(dBudgetRefused, b.Refused)
	}
	if rs, ok := c.src.(ReplicaSource); ok {
		for _, r := range rs.Replicas() {
			collectReplica(ch, r)
		}
	}
}

// collectNBD emits the vmsan_nbd_* series (older than the per-front-end
// vmsan_frontend_* ones, kept under their names) from the NBD front end's
// neutral stats.
func collectNBD(ch chan<- prometheus.Metric, st volrt.FrontEndStats) {
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	counter(dAccepted, st.Accepted)
	gauge(dActive, float64(st.Active))
	counter(dHSFail, st.HandshakeFails)
	counter(dTLS, st.TLSHandshakes)
	for _, c := range st.Commands {
		counter(dNBDReqs, c.Count, c.Command)
	}
	counter(dErrReply, st.ErrorReplies)
	counter(dNBDBytes, st.BytesRead, "read")
	counter(dNBDBytes, st.BytesWritten, "write")
	counter(dProtoErr, st.ProtocolErrors)
	counter(dPanics, st.Panics)
	counter(dHoles, st.HoleChunks)
	gauge(dNBDInfl, float64(st.Inflight))
}

// collectReplica emits one replicated volume's series.
func collectReplica(ch chan<- prometheus.Metric, r Replica) {
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	enum := func(d *prometheus.Desc, names []string, cur string) {
		for _, n := range names {
			v := 0.0
			if n == cur {
				v = 1
			}
			gauge(d, v, r.Volume, n)
		}
	}
	enum(dRRole, roleNames, r.Role)
	enum(dRPeerRole, peerRoleNames, r.PeerRole)
	enum(dRDisk, diskNames, r.Disk)
	enum(dRPeerDisk, peerDiskNames, r.PeerDisk)
	enum(dRConn, connNames, r.Conn)
	gauge(dROOS, float64(r.OutOfSync), r.Volume)
	gauge(dRPending, float64(r.PendingWrites), r.Volume)
	held := 0.0
	if r.MetadataHeld {
		held = 1
	}
	gauge(dRMetaHeld, held, r.Volume)
	gauge(dRRate, r.ResyncRate, r.Volume)
	counter(dRResync, float64(r.ResyncBytes), r.Volume, "data")
	counter(dRResync, float64(r.ResyncZeroBytes), r.Volume, "zero")
	counter(dRResync, float64(r.ResyncHashMatchBytes), r.Volume, "hash_match")
	counter(dRSent, float64(r.ReplicatedBytes), r.Volume)
	reasons := make([]string, 0, len(r.Disconnects))
	for k := range r.Disconnects {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	for _, k := range reasons {
		counter(dRDisc, float64(r.Disconnects[k]), r.Volume, k)
	}
	ch <- histogram(dRAckLat, r.AckLatency, 1e9, r.Volume)
}
