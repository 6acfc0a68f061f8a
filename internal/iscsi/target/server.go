package target

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/scsi"
	"github.com/vmsan/vmsan/internal/volrt"
)

// LogicalUnits is what a session needs from the SCSI layer: package
// scsi's *Target implements it; tests use fakes.
type LogicalUnits interface {
	// Execute runs one task; done is called exactly once, on any
	// goroutine, possibly before Execute returns.
	Execute(t *scsi.Task, done func(*scsi.Result))
	// TaskManagement applies a task management function after the
	// transport has aborted (and waited for) the affected tasks; it
	// returns a scsi.TMF* response.
	TaskManagement(fn uint8, n *scsi.Nexus, lun uint64) uint8
	// NexusLost is called once a session has ended and its tasks are done.
	NexusLost(n *scsi.Nexus)
}

// CHAP is one direction pair of CHAP credentials. User/Secret are what
// the initiator must prove (one-way CHAP); MutualUser/MutualSecret, when
// set, are what the target answers with when the initiator asks for
// mutual CHAP (an initiator asking for it without them is refused).
type CHAP struct {
	User         string
	Secret       []byte
	MutualUser   string
	MutualSecret []byte
}

// Target is one iSCSI target node the server exposes.
type Target struct {
	Name  string // the iSCSI name (IQN)
	Alias string // TargetAlias, optional
	LUs   LogicalUnits
	// Auth, when non-nil, makes CHAP mandatory for normal sessions.
	Auth *CHAP
	// Initiators, when non-empty, is the ACL: only these InitiatorNames
	// may log in to (or discover) the target.
	Initiators []string
	// AllowAny lets any initiator in when the target has neither an ACL
	// nor CHAP. Without it such a target refuses every login (status
	// 0202) and discovery lists it to no one: an open target must be
	// asked for.
	AllowAny bool
	// Volumes are the volume names behind the target's LUNs, for the
	// front end's client list.
	Volumes []string
}

// refuses says why initiator may not log in to (or discover) the target,
// or "" when it may (CHAP, when set, is checked later in the login).
func (t *Target) refuses(initiator string) string {
	if len(t.Initiators) == 0 {
		if t.Auth == nil && !t.AllowAny {
			return "target has no ACL and no CHAP, and allow-any is off"
		}
		return ""
	}
	for _, n := range t.Initiators {
		if n == initiator {
			return ""
		}
	}
	return "initiator not in the target's ACL"
}

func (t *Target) allows(initiator string) bool { return t.refuses(initiator) == "" }

// Portal is an address SendTargets advertises.
type Portal struct {
	Addr string // host:port; an unspecified host is replaced by the connection's local address
	Tag  uint16 // target portal group tag
}

// Config configures a Server. Zero values take the defaults named.
type Config struct {
	// Targets returns the current targets (read at every login and
	// discovery, so volumes may come and go).
	Targets func() []Target
	// DiscoveryAuth, when non-nil, makes CHAP mandatory for discovery
	// sessions (SetDiscoveryAuth changes it later).
	DiscoveryAuth *CHAP
	// Portals, when non-nil, overrides the advertised portals (default:
	// every listener Serve was given, with its tag).
	Portals func() []Portal
	// QueueDepth is the CmdSN window: commands in flight per session
	// (default 128, open-iscsi's cmds_max).
	QueueDepth int
	// MaxRecvDataSegmentLength is what the target declares (default
	// 262144); data segments longer than this are refused.
	MaxRecvDataSegmentLength int
	// MaxBurstLength, FirstBurstLength and MaxOutstandingR2T are the
	// target's offers (defaults 1 MiB, 256 KiB, 8); negotiation takes the
	// minimum with the initiator's.
	MaxBurstLength    int
	FirstBurstLength  int
	MaxOutstandingR2T int
	// MaxTransfer bounds one command's expected data transfer length
	// (default 32 MiB); larger commands get CHECK CONDITION.
	MaxTransfer int
	// SessionBudget bounds the data bytes of in-flight commands of one
	// session (default 64 MiB).
	SessionBudget int64
	// Budget, when set, is the daemon-wide in-flight budget every
	// session's commands also reserve from (shared with other front
	// ends); a command that does not fit is answered TASK SET FULL (or
	// BUSY when its session has nothing in flight). It must be at least
	// MaxTransfer.
	Budget *volrt.Budget
	// MaxSessions bounds the sessions (normal and discovery) open at once
	// (default 256); a login past it is answered "out of resources"
	// (0x0302). Reinstating an existing session is always allowed.
	MaxSessions int
	// NopInterval is how long a connection may be silent before the
	// target pings it with a NOP-In (default 1s; negative disables pings,
	// and with them the closing of silent connections), and NopTimeout
	// how long it then waits for any PDU before closing the connection
	// (default 1s). Their sum must stay below the initiators' detection
	// plus recovery timeout (3 s at the earliest with the settings `vmsan
	// iscsi multipath-conf` prints): a silent path must be closed before
	// its I/O is resent on another one, or commands the network still
	// holds execute over newer data when it returns.
	NopInterval time.Duration
	NopTimeout  time.Duration
	// LoginTimeout bounds the login phase (default 15s): a connection
	// that has not reached full feature phase by then is closed.
	LoginTimeout time.Duration
	// MaxPendingLogins bounds the connections accepted and still logging
	// in (default 64): past it a new connection is closed at once, so
	// connections that never log in (a flood of silent TCP connections)
	// hold at most this many file descriptors, each for at most
	// LoginTimeout.
	MaxPendingLogins int
	// DataOutTimeout is how long a command may wait for the next part of
	// its write data (after an R2T, or for announced unsolicited data)
	// before the connection is closed (default 3s, LIO's dataout_timeout;
	// negative: never). At ErrorRecoveryLevel 0 that ends the session and
	// releases its in-flight budget: an initiator that announces writes
	// and withholds their data cannot pin the daemon's memory budget.
	DataOutTimeout time.Duration
	// AwaitingDataShare bounds, as a fraction of Budget's limit (default
	// 1/2), what the commands of all sessions that are still waiting for
	// their write data may hold together: past it such a command is
	// answered BUSY or TASK SET FULL (unless none is waiting). Data that
	// has arrived is no longer waiting; the rest of the budget stays for
	// other front ends, reads and writes whose data is in.
	AwaitingDataShare float64
	Logger            *slog.Logger
	// Sessions receives the clients (one entry per session and volume).
	Sessions *volrt.Sessions
	// Rand is the CHAP challenge source (default crypto/rand).
	Rand io.Reader
}

// The default NOP timers: a silent connection is closed 2-2.2 s after
// the last PDU arrived, before an initiator with the recommended timers
// (NOP-Out 1 s + 1 s, recovery 2 s) resends its I/O elsewhere (3 s at
// the earliest). An initiator's kernel answers a NOP-In in well under a
// millisecond on a healthy link, so 1 s leaves a loaded machine margin.
const (
	DefaultNopInterval = time.Second
	DefaultNopTimeout  = time.Second
)

// SafeNopTotal is the most NopInterval + NopTimeout may add up to and
// still close a silent connection before an initiator with the timers
// `vmsan iscsi multipath-conf` recommends can have resent its I/O on
// another path: the sum must stay below the host's noop_out_timeout +
// recovery timeout (1 s + 2 s; the host's noop_out_interval cancels out,
// see cmd/vmsan targetNopLimit), less 0.5 s for the pinger's tick and
// scheduling.
const SafeNopTotal = 2500 * time.Millisecond

// DefaultDataOutTimeout is Config.DataOutTimeout's default.
const DefaultDataOutTimeout = 3 * time.Second

func (c *Config) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.QueueDepth, 128)
	def(&c.MaxRecvDataSegmentLength, 262144)
	def(&c.MaxBurstLength, 1<<20)
	def(&c.FirstBurstLength, 256<<10)
	def(&c.MaxOutstandingR2T, 8)
	def(&c.MaxTransfer, 32<<20)
	def(&c.MaxSessions, 256)
	def(&c.MaxPendingLogins, 64)
	c.MaxRecvDataSegmentLength = min(max(c.MaxRecvDataSegmentLength, 512), pdu.MaxDataSegmentLength)
	c.MaxBurstLength = min(max(c.MaxBurstLength, 512), pdu.MaxDataSegmentLength)
	c.FirstBurstLength = min(max(c.FirstBurstLength, 512), c.MaxBurstLength)
	if c.SessionBudget <= 0 {
		c.SessionBudget = 64 << 20
	}
	if c.NopInterval == 0 {
		c.NopInterval = DefaultNopInterval
	}
	if c.NopTimeout <= 0 {
		c.NopTimeout = DefaultNopTimeout
	}
	if c.LoginTimeout <= 0 {
		c.LoginTimeout = 15 * time.Second
	}
	if c.DataOutTimeout == 0 {
		c.DataOutTimeout = DefaultDataOutTimeout
	}
	if c.AwaitingDataShare <= 0 || c.AwaitingDataShare > 1 {
		c.AwaitingDataShare = 0.5
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	if c.Targets == nil {
		c.Targets = func() []Target { return nil }
	}
}

// Stats are the server's counters.
type Stats struct {
	Accepted      uint64            `json:"accepted"`
	ActiveConns   int64             `json:"active_connections"`
	Sessions      int               `json:"sessions"`
	Logins        uint64            `json:"logins"`
	LoginFailures uint64            `json:"login_failures"`
	Commands      uint64            `json:"commands"`
	CheckStatus   uint64            `json:"check_conditions"`
	Rejects       uint64            `json:"rejects"`
	BytesRead     uint64            `json:"bytes_read"`
	BytesWritten  uint64            `json:"bytes_written"`
	Reinstated    uint64            `json:"reinstated"`
	NopTimeouts   uint64            `json:"nop_timeouts"`
	LoginStatuses map[string]uint64 `json:"login_statuses,omitempty"`
	// LoginFailureReasons counts failed logins by LoginFailureReason.
	LoginFailureReasons map[string]uint64 `json:"login_failure_reasons,omitempty"`

	// SessionsRefused counts logins refused for MaxSessions;
	// BudgetRefused commands answered BUSY/TASK SET FULL because the
	// daemon-wide budget was spent.
	SessionsRefused uint64 `json:"sessions_refused"`
	BudgetRefused   uint64 `json:"budget_refused"`
	// PendingRefused counts connections closed at accept because
	// MaxPendingLogins connections were logging in; DataOutTimeouts
	// connections closed for DataOutTimeout.
	PendingRefused  uint64 `json:"pending_logins_refused"`
	DataOutTimeouts uint64 `json:"dataout_timeouts"`
	// AwaitingData is what commands waiting for write data hold of the
	// daemon-wide budget now.
	AwaitingData int64 `json:"awaiting_data_bytes"`
}

// errTooManySessions refuses a login past Config.MaxSessions.
var errTooManySessions = errors.New("iscsi target: too many sessions")

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("iscsi target: server closed")

// sessionKey identifies a session for reinstatement (RFC 7143 6.3.5:
// InitiatorName + ISID + target).
type sessionKey struct {
	initiator string
	isid      pdu.ISID
	target    string
}

// Server is an iSCSI target server.
type Server struct {
	cfg       Config
	chapCache chap.Cache

	mu       sync.Mutex
	closed   bool
	lns      map[net.Listener]uint16
	lnOrder  []net.Listener
	conns    map[*conn]struct{}
	sessions map[sessionKey]*session
	byTSIH   map[uint16]*session
	nextTSIH uint16
	wg       sync.WaitGroup

	accepted, logins, loginFailures, commands, checks, rejects atomic.Uint64
	bytesRead, bytesWritten, reinstated, nopTimeouts           atomic.Uint64
	sessionsRefused, budgetRefused                             atomic.Uint64
	pendingRefused, dataOutTimeouts                            atomic.Uint64
	active                                                     atomic.Int64
	// pending counts connections accepted and not yet past login
	// (MaxPendingLogins).
	pending    atomic.Int64
	pendingLog volrt.RateLog
	// awaiting is the budget held by commands still waiting for write
	// data, over all sessions (AwaitingDataShare).
	awaiting      atomic.Int64
	awaitLimit    int64 // 0: none (no daemon-wide budget)
	statusMu      sync.Mutex
	loginStatuses map[string]uint64 // under statusMu
	loginReasons  map[string]uint64 // under statusMu
	discAuth      atomic.Pointer[CHAP]
	refusalLog    volrt.RateLog
}

// logRefusal logs a login refused for a limit, at most once per 10 s.
func (s *Server) logRefusal(c *conn, err error) {
	if ok, n := s.refusalLog.Allow(); ok {
		s.cfg.Logger.Warn("iscsi: login refused: session limit reached (iscsi.max_sessions)",
			"remote", c.log(), "max_sessions", s.cfg.MaxSessions, "refused_since_last_line", n, "err", err)
	}
}

// New returns a server; call Serve for each listener.
func New(cfg Config) *Server {
	cfg.setDefaults()
	s := &Server{cfg: cfg, lns: map[net.Listener]uint16{}, conns: map[*conn]struct{}{},
		sessions: map[sessionKey]*session{}, byTSIH: map[uint16]*session{}, loginStatuses: map[string]uint64{},
		loginReasons: map[string]uint64{}}
	s.discAuth.Store(cfg.DiscoveryAuth)
	if cfg.Budget != nil {
		s.awaitLimit = int64(float64(cfg.Budget.Stats().Limit) * cfg.AwaitingDataShare)
	}
	return s
}

// takeAwaiting counts n more bytes held by commands waiting for write
// data if they fit in the awaiting share, or if none is waiting (so a
// command as large as the share can always be admitted, alone).
func (s *Server) takeAwaiting(n int64) bool {
	for {
		cur := s.awaiting.Load()
		if s.awaitLimit > 0 && cur > 0 && cur+n > s.awaitLimit {
			return false
		}
		if s.awaiting.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// Serve accepts connections on ln, a portal of portal group tag tpgt,
// until Shutdown or Close (ErrServerClosed) or an accept error. The
// portal's relative target port identifier is its position in Serve
// order, from 1: a caller that starts several Serve goroutines should use
// ServePort, since goroutines start in no particular order.
func (s *Server) Serve(ln net.Listener, tpgt uint16) error { return s.ServePort(ln, tpgt, 0) }

// ServePort is Serve with an explicit relative target port identifier
// (SPC-4 VPD 83 designator type 4, reported with the portal's sessions and
// in REPORT TARGET PORT GROUPS); 0 means the position in Serve order.
// Identifiers must be unique per target, and across the nodes of a
// replicated pair (both report one logical unit).
func (s *Server) ServePort(ln net.Listener, tpgt, rel uint16) error {
	// An accept error (EMFILE when the process ran out of descriptors,
	// ...) is logged and retried, never the end of the portal.
	ln = netutil.Retry(ln, s.cfg.Logger, "iscsi")
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = tpgt
	s.lnOrder = append(s.lnOrder, ln)
	relPort := rel
	if relPort == 0 {
		relPort = uint16(len(s.lnOrder))
	}
	s.mu.Unlock()
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			return err
		}
		s.accepted.Add(1)
		if s.pending.Add(1) > int64(s.cfg.MaxPendingLogins) {
			s.pending.Add(-1)
			s.pendingRefused.Add(1)
			if ok, n := s.pendingLog.Allow(); ok {
				s.cfg.Logger.Warn("iscsi: connection refused: too many connections logging in (iscsi.max_pending_logins)",
					"remote", nc.RemoteAddr().String(), "max_pending_logins", s.cfg.MaxPendingLogins, "refused_since_last_line", n)
			}
			nc.Close()
			continue
		}
		c := newConn(s, nc, tpgt, relPort)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			s.pending.Add(-1)
			nc.Close()
			return ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		s.active.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.active.Add(-1)
			c.serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Shutdown stops accepting, asks every connection to finish (in-flight
// commands complete and are answered, then the connection closes) and
// waits for them, bounded by ctx (then connections are closed hard).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for ln := range s.lns {
		ln.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.drain()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.Close()
		<-done
		return ctx.Err()
	}
}

// Close closes listeners and connections without draining. Idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
}

// Addrs returns the listener addresses in Serve order.
func (s *Server) Addrs() []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]net.Addr, 0, len(s.lnOrder))
	for _, ln := range s.lnOrder {
		out = append(out, ln.Addr())
	}
	return out
}

// Stats snapshots the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	n := len(s.byTSIH)
	s.mu.Unlock()
	st := Stats{Accepted: s.accepted.Load(), ActiveConns: s.active.Load(), Sessions: n,
		Logins: s.logins.Load(), LoginFailures: s.loginFailures.Load(), Commands: s.commands.Load(),
		CheckStatus: s.checks.Load(), Rejects: s.rejects.Load(), BytesRead: s.bytesRead.Load(),
		BytesWritten: s.bytesWritten.Load(), Reinstated: s.reinstated.Load(), NopTimeouts: s.nopTimeouts.Load(),
		SessionsRefused: s.sessionsRefused.Load(), BudgetRefused: s.budgetRefused.Load(),
		PendingRefused: s.pendingRefused.Load(), DataOutTimeouts: s.dataOutTimeouts.Load(), AwaitingData: s.awaiting.Load(),
		LoginStatuses: map[string]uint64{}, LoginFailureReasons: map[string]uint64{}}
	s.statusMu.Lock()
	for k, v := range s.loginStatuses {
		st.LoginStatuses[k] = v
	}
	for k, v := range s.loginReasons {
		st.LoginFailureReasons[k] = v
	}
	s.statusMu.Unlock()
	return st
}

func (s *Server) countLoginStatus(st pdu.LoginStatus) {
	s.statusMu.Lock()
	s.loginStatuses[st.String()]++
	s.loginReasons[LoginFailureReason(st)]++
	s.statusMu.Unlock()
}

// portals returns what SendTargets advertises, unspecified hosts replaced
// by local (the address the initiator reached us on).
func (s *Server) portals(local net.Addr) []Portal {
	var ps []Portal
	if s.cfg.Portals != nil {
		ps = s.cfg.Portals()
	} else {
		s.mu.Lock()
		for _, ln := range s.lnOrder {
			ps = append(ps, Portal{Addr: ln.Addr().String(), Tag: s.lns[ln]})
		}
		s.mu.Unlock()
	}
	lhost := ""
	if ta, ok := local.(*net.TCPAddr); ok {
		lhost = ta.IP.String()
	}
	out := make([]Portal, 0, len(ps))
	for _, p := range ps {
		h, port, err := net.SplitHostPort(p.Addr)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(h); (h == "" || ip != nil && ip.IsUnspecified()) && lhost != "" {
			h = lhost
		}
		out = append(out, Portal{Addr: net.JoinHostPort(h, port), Tag: p.Tag})
	}
	return out
}

// lookup returns the named target.
func (s *Server) lookup(name string) (Target, bool) {
	for _, t := range s.cfg.Targets() {
		if t.Name == name {
			return t, true
		}
	}
	return Target{}, false
}

// register installs a newly logged-in session, closing a session it
// reinstates (same initiator, ISID and target) first and waiting for that
// session's tasks to end. It returns the TSIH.
func (s *Server) register(ss *session, tsih uint16) (uint16, error) {
	k := sessionKey{ss.nexus.InitiatorName, ss.isid, ss.nexus.TargetName}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, ErrServerClosed
	}
	old := s.sessions[k]
	s.mu.Unlock()
	if old != nil {
		// Session reinstatement (RFC 7143 6.3.5): the old session's
		// connection is closed and its tasks aborted before the new one
		// is usable; wait bounded so a stuck engine cannot wedge logins.
		s.reinstated.Add(1)
		old.c.abort()
		select {
		case <-old.ended:
		case <-time.After(30 * time.Second):
			return 0, errors.New("iscsi target: reinstated session did not end")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.sessions[k]; cur != nil && cur != old {
		// A concurrent login reinstated it first.
		return 0, errors.New("iscsi target: concurrent login for the same session")
	}
	if old == nil && len(s.byTSIH) >= s.cfg.MaxSessions {
		s.sessionsRefused.Add(1)
		return 0, errTooManySessions
	}
	if tsih == 0 {
		for {
			s.nextTSIH++
			if s.nextTSIH == 0 {
				continue
			}
			if _, used := s.byTSIH[s.nextTSIH]; !used {
				break
			}
		}
		tsih = s.nextTSIH
	}
	ss.tsih = tsih
	s.sessions[k] = ss
	s.byTSIH[tsih] = ss
	return tsih, nil
}

func (s *Server) unregister(ss *session) {
	s.mu.Lock()
	k := sessionKey{ss.nexus.InitiatorName, ss.isid, ss.nexus.TargetName}
	if s.sessions[k] == ss {
		delete(s.sessions, k)
	}
	if s.byTSIH[ss.tsih] == ss {
		delete(s.byTSIH, ss.tsih)
	}
	s.mu.Unlock()
}

// sessionsOf returns the live sessions of a target (for LUN and target
// resets, which abort every nexus's tasks).
func (s *Server) sessionsOf(target string) []*session {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*session
	for _, ss := range s.byTSIH {
		if ss.nexus.TargetName == target {
			out = append(out, ss)
		}
	}
	return out
}

// AbortNexus aborts the tasks of the session behind n on lun without
// waiting for them (their responses are dropped): what SCSI's PREEMPT AND
// ABORT asks of the transport (scsi.Config.Abort). Safe to call from
// inside LogicalUnits.Execute.
func (s *Server) AbortNexus(n *scsi.Nexus, lun uint64) {
	s.mu.Lock()
	var target *session
	for _, ss := range s.byTSIH {
		if ss.nexus == n {
			target = ss
			break
		}
	}
	s.mu.Unlock()
	if target != nil {
		target.abortTasks(func(t *task) bool { return t.lun == lun })
	}
}

// NotifyCapacityChanged sends an Asynchronous Message (SCSI async event
// with the sense CAPACITY DATA HAS CHANGED, 06/2A/09) about lun to every
// session of the named target, so initiators that are idle learn of an
// online resize without waiting for the unit attention on their next
// command (which the SCSI layer still reports). It returns the number of
// sessions told.
func (s *Server) NotifyCapacityChanged(target string, lun uint64) int {
	n := 0
	for _, ss := range s.sessionsOf(target) {
		if ss.discovery {
			continue
		}
		ss.c.post(&out{h: &pdu.AsyncMessage{LUN: encodeLUN(lun), AsyncEvent: pdu.AsyncSCSIEvent},
			data: pdu.SenseData(senseFixed(0x06, 0x2a, 0x09)), status: true})
		n++
	}
	return n
}

// encodeLUN is decodeLUN's inverse: peripheral addressing below 256, flat
// addressing up to 16383.
func encodeLUN(lun uint64) uint64 {
	if lun < 256 {
		return lun << 48
	}
	return (0x4000 | lun&0x3fff) << 48
}

// findTSIH returns the session with a TSIH (a login for an existing session).
func (s *Server) findTSIH(tsih uint16) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byTSIH[tsih]
}

func initiatorPort(name string, isid pdu.ISID) string {
	const d = "0123456789abcdef"
	b := []byte(name + ",i,0x")
	for _, c := range isid {
		b = append(b, d[c>>4], d[c&15])
	}
	return string(b)
}

func tpgtString(t uint16) string { return strconv.Itoa(int(t)) }
