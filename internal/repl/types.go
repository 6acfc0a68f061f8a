package repl

import (
	"fmt"

	"github.com/vmsan/vmsan/internal/replset"
)

// Role is a node's role for one volume.
type Role uint8

const (
	Secondary Role = iota // receives the stream; refuses client writes
	Primary               // serves clients read-write, sends the stream
	// RoleUnknown is only ever the peer's role while we do not hear from
	// it (not connected, or before its Hello): never persisted or sent.
	RoleUnknown
)

func (r Role) String() string {
	switch r {
	case Primary:
		return "Primary"
	case Secondary:
		return "Secondary"
	}
	return "Unknown"
}

// DiskState is DRBD's disk state of the local replica.
type DiskState uint8

const (
	Diskless     DiskState = iota // no usable local data (e.g. detached after an I/O error)
	Inconsistent                  // mid-resync target or never synced: not usable on its own
	Outdated                      // consistent, but known to be older than the peer
	UpToDate                      // consistent and (as far as we know) newest
	// DiskUnknown is only ever the peer's disk state while we do not hear
	// from it: never persisted or sent (DRBD's DUnknown).
	DiskUnknown
)

func (d DiskState) String() string {
	switch d {
	case Diskless:
		return "Diskless"
	case Inconsistent:
		return "Inconsistent"
	case Outdated:
		return "Outdated"
	case UpToDate:
		return "UpToDate"
	case DiskUnknown:
		return "Unknown"
	}
	return fmt.Sprintf("DiskState(%d)", d)
}

// ConnState is DRBD's connection state.
type ConnState uint8

const (
	StandAlone   ConnState = iota // not trying to connect (admin, split brain, unrelated data)
	Connecting                    // waiting for the transport (WFConnection)
	Handshake                     // transport up, exchanging Hello and bitmaps (WFReportParams)
	Connected                     // in sync, replicating
	SyncSource                    // replicating and sending resync data
	SyncTarget                    // replicating and receiving resync data
	VerifySource                  // online verify, we compare
	VerifyTarget                  // online verify, peer compares
)

func (c ConnState) String() string {
	switch c {
	case StandAlone:
		return "StandAlone"
	case Connecting:
		return "Connecting"
	case Handshake:
		return "Handshake"
	case Connected:
		return "Connected"
	case SyncSource:
		return "SyncSource"
	case SyncTarget:
		return "SyncTarget"
	case VerifySource:
		return "VerifySource"
	case VerifyTarget:
		return "VerifyTarget"
	}
	return fmt.Sprintf("ConnState(%d)", c)
}

// up reports whether the peer receives the replication stream in this state.
func (c ConnState) up() bool { return c >= Connected }

// Protocol is the replication protocol (replset.Protocol: the settings
// package owns the enumeration and its parser, so config validates without
// importing this package).
type Protocol = replset.Protocol

const (
	ProtoC = replset.ProtoC // durable on both (default)
	ProtoA = replset.ProtoA // locally durable and handed to the send path
	ProtoB = replset.ProtoB // locally durable and received (in memory) by the peer
)

// ParseProtocol accepts "A", "B", "C" (empty means C).
func ParseProtocol(s string) (Protocol, error) { return replset.ParseProtocol(s) }

// SplitBrainPolicy says what to do when the handshake finds split brain
// (replset.SplitBrainPolicy).
type SplitBrainPolicy = replset.SplitBrainPolicy

const (
	SBDisconnect            = replset.SBDisconnect
	SBDiscardZeroChanges    = replset.SBDiscardZeroChanges
	SBDiscardYoungerPrimary = replset.SBDiscardYoungerPrimary
	SBDiscardLeastChanges   = replset.SBDiscardLeastChanges
)

// ParseSplitBrainPolicy parses the drbd.conf-style names.
func ParseSplitBrainPolicy(s string) (SplitBrainPolicy, error) {
	return replset.ParseSplitBrainPolicy(s)
}

// Generations are DRBD's generation identifiers ("UUIDs"). Current names the
// data generation we hold; Bitmap is the generation our dirty bitmap is
// relative to (0 when we track nothing); History holds older generations.
// 0 in Current means "just created, never written as a replica".
type Generations struct {
	Current uint64
	Bitmap  uint64
	History [2]uint64
}

func (g Generations) String() string {
	return fmt.Sprintf("%x:%x:%x:%x", g.Current, g.Bitmap, g.History[0], g.History[1])
}

func (g Generations) inHistory(u uint64) bool {
	return u != 0 && (g.History[0] == u || g.History[1] == u)
}

// pushHistory shifts u into History.
func (g *Generations) pushHistory(u uint64) {
	if u == 0 {
		return
	}
	g.History[1] = g.History[0]
	g.History[0] = u
}

// newCurrent starts a new data generation (we are about to write without
// the peer): the old one becomes the bitmap base if we were not tracking yet.
func (g *Generations) newCurrent(u uint64) {
	if g.Bitmap == 0 {
		g.Bitmap = g.Current
	} else {
		g.pushHistory(g.Current)
	}
	g.Current = u
}

// Meta is the state of a Node that must survive restarts. The driver writes
// it atomically (temp file, fsync, rename, fsync dir) whenever Ready.Persist
// carries it.
type Meta struct {
	NodeID uint64
	Gens   Generations
	Role   Role
	Disk   DiskState
	// CrashedPrimary is set while we are primary and cleared on a clean
	// demote/shutdown. Found set at start-up it means the activity log's
	// extents may differ from the peer and must be resynced.
	CrashedPrimary bool
	// PromotedAt is the wall time (driver-supplied, unix ns) of the last
	// promotion; used by discard-younger-primary.
	PromotedAt int64
	// Clean is true when the bitmap on disk is complete (clean shutdown).
	// When false, the activity log's extents are added to the bitmap at start.
	Clean bool
	// DataID is the local volume's data identity (volume.Meta.DataID) when
	// this state was last written. The node carries it unchanged; the
	// driver compares it at start: a different one means the data file
	// was replaced under us, so this state no longer describes the data.
	DataID string `json:",omitempty"`
}
