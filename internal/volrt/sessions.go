package volrt

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Session is one client connected to a volume through a front end.
type Session struct {
	FrontEnd string    `json:"front_end"`
	Volume   string    `json:"volume"`
	Remote   string    `json:"remote"` // client address as the front end sees it
	Since    time.Time `json:"since"`
	// ID tells sessions apart within the front end (events pair a
	// client's connect with its disconnect by it).
	ID uint64 `json:"id"`
}

// SessionChange is what a watcher (Sessions.Watch) sees: a client that
// connected, or one that disconnected with how long it stayed.
type SessionChange struct {
	Session
	Connected bool
	Duration  time.Duration // on disconnect: since Session.Since
}

// Sessions tracks a front end's connected clients, by volume and address,
// in a form every front end shares (status, metrics). A front end calls
// Add when a connection starts using a volume (NBD: transmission phase;
// iSCSI: login to a target) and Remove when it ends.
//
// Concurrency: safe for concurrent use; a nil *Sessions ignores Add and
// Remove, so a front end built without one (tests) need not check.
// Add and Remove take a mutex once per connection, never per request.
// They are the one place every front end reports clients, so the daemon's
// connect/disconnect log lines and client events hang off them (Watch).
type Sessions struct {
	frontEnd string
	mu       sync.Mutex
	next     uint64
	m        map[uint64]Session
	watch    atomic.Pointer[func(SessionChange)]
}

// Watch makes Add and Remove call fn (after releasing the tracker's mutex,
// in the connection's goroutine; fn must not block). One watcher; a later
// call replaces it.
func (s *Sessions) Watch(fn func(SessionChange)) { s.watch.Store(&fn) }

func (s *Sessions) notify(c SessionChange) {
	if fn := s.watch.Load(); fn != nil {
		(*fn)(c)
	}
}

// NewSessions returns an empty tracker for the named front end.
func NewSessions(frontEnd string) *Sessions {
	return &Sessions{frontEnd: frontEnd, m: map[uint64]Session{}}
}

// Add records a client of volume at remote and returns the id to Remove.
func (s *Sessions) Add(volume, remote string) uint64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	s.next++
	ss := Session{FrontEnd: s.frontEnd, Volume: volume, Remote: remote, Since: time.Now(), ID: s.next}
	s.m[s.next] = ss
	s.mu.Unlock()
	s.notify(SessionChange{Session: ss, Connected: true})
	return ss.ID
}

// Remove forgets the session Add returned id for; unknown ids are ignored.
func (s *Sessions) Remove(id uint64) {
	if s == nil {
		return
	}
	s.mu.Lock()
	ss, ok := s.m[id]
	delete(s.m, id)
	s.mu.Unlock()
	if ok {
		s.notify(SessionChange{Session: ss, Duration: time.Since(ss.Since)})
	}
}

// List returns the sessions ordered by volume, then connection time.
func (s *Sessions) List() []Session {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	out := make([]Session, 0, len(s.m))
	for _, v := range s.m {
		out = append(out, v)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Volume != out[j].Volume {
			return out[i].Volume < out[j].Volume
		}
		if !out[i].Since.Equal(out[j].Since) {
			return out[i].Since.Before(out[j].Since)
		}
		return out[i].Remote < out[j].Remote
	})
	return out
}

// PerVolume counts sessions by volume.
func (s *Sessions) PerVolume() map[string]int {
	out := map[string]int{}
	if s == nil {
		return out
	}
	s.mu.Lock()
	for _, v := range s.m {
		out[v.Volume]++
	}
	s.mu.Unlock()
	return out
}

// FrontEndStats is what every front end reports, whatever its protocol:
// the daemon's status and metrics read only this (plus Detail, which
// status shows as is).
type FrontEndStats struct {
	Name string `json:"name"`
	// Listeners are the addresses served ("127.0.0.1:10809", "unix:/p").
	Listeners []string `json:"listeners,omitempty"`
	// Accepted counts connections accepted; Active is open now.
	Accepted uint64 `json:"accepted"`
	Active   int64  `json:"active"`
	// Requests, ErrorReplies and the payload bytes are over all volumes.
	Requests     uint64 `json:"requests"`
	ErrorReplies uint64 `json:"error_replies"`
	BytesRead    uint64 `json:"bytes_read"`
	BytesWritten uint64 `json:"bytes_written"`
	// Clients are the connections using a volume now.
	Clients []Session `json:"clients"`
	// Detail is the front end's own counters (NBD: server.Stats), shown
	// by status as is; nothing else reads it.
	Detail any `json:"detail,omitempty"`

	// Protocol counters, for metrics (which keeps the NBD front end's
	// vmsan_nbd_* series under their names without importing the NBD
	// server). Status shows them through Detail, so they are not repeated
	// in JSON.
	HandshakeFails uint64 `json:"-"` // connections that ended before serving a volume (NBD negotiation, iSCSI login)
	TLSHandshakes  uint64 `json:"-"` // successful TLS upgrades
	ProtocolErrors uint64 `json:"-"` // connections closed for protocol violations
	Panics         uint64 `json:"-"` // recovered panics in connection handlers (each is a bug)
	HoleChunks     uint64 `json:"-"` // hole pieces sent in reads (NBD: OFFSET_HOLE chunks)
	Inflight       int64  `json:"-"` // requests received and not yet replied
	// Refused counts connections (NBD) or logins (iSCSI) refused for the
	// daemon's connection/session limit.
	Refused uint64 `json:"refused"`
	// Commands counts requests by the protocol's command name (lower
	// case), every command listed, zeros included, so a rate works from
	// the first scrape.
	Commands []CommandCount `json:"-"`
	// LoginFailures counts refused logins by reason (iSCSI: every reason
	// listed, zeros included).
	LoginFailures map[string]uint64 `json:"-"`
}

// CommandCount is the number of requests of one protocol command.
type CommandCount struct {
	Command string
	Count   uint64
}
