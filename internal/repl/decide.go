package repl

// Hello is what each side reports at connect time (DRBD's ReportParams +
// ReportUUIDs).
type Hello struct {
	NodeID         uint64
	Gens           Generations
	Role           Role
	Disk           DiskState
	Protocol       Protocol
	CrashedPrimary bool
	PromotedAt     int64
	Size           int64
	Dirty          int64 // set bits in the sender's bitmap (changes since the split)
	// DiscardMyData: the sender asked (one-shot) to be discarded should
	// this handshake find split brain (Node.ConnectDiscardMyData).
	DiscardMyData bool
}

// SyncKind is the outcome of the connect-time comparison.
type SyncKind uint8

const (
	NoSync       SyncKind = iota // identical generations: just replicate
	BitmapSource                 // we send the chunks in (our ∪ peer) bitmap
	BitmapTarget                 // we receive them
	FullSource                   // we send everything (holes and zeroes skipped)
	FullTarget
	SplitBrain // both wrote since the last common generation
	Unrelated  // no common history: refuse
	Refused    // handshake parameters incompatible (size, both primary...)
)

func (k SyncKind) String() string {
	return [...]string{"no-sync", "bitmap-source", "bitmap-target", "full-source", "full-target", "split-brain", "unrelated", "refused"}[k]
}

// Decision is the handshake result, from our point of view.
type Decision struct {
	Kind SyncKind
	// Rule is the DRBD-style rule number that matched, for logs and tests.
	Rule int
	// Resolved is set when split brain was resolved by policy; Kind then
	// holds the resolved direction.
	Resolved bool
	Reason   string
}

// Decide compares generations like DRBD's uuid_compare and applies the
// split-brain policy. It is a pure function of both Hellos, symmetric: the
// peer computes the mirror result from the same two Hellos.
func Decide(self, peer Hello, policy SplitBrainPolicy) Decision {
	if self.Size != peer.Size {
		return Decision{Kind: Refused, Rule: 1, Reason: "volume sizes differ"}
	}
	if self.Protocol != peer.Protocol {
		return Decision{Kind: Refused, Rule: 1, Reason: "protocols differ (" + self.Protocol.String() + " here, " + peer.Protocol.String() + " on the peer)"}
	}
	if self.Role == Primary && peer.Role == Primary {
		// Dual primary is not supported: one side must demote first. Still
		// report split brain when the generations show it, since that is
		// what the operator has to resolve.
		self.Role, peer.Role = Secondary, Secondary
		if d := Decide(self, peer, SBDisconnect); d.Kind == SplitBrain {
			d.Reason += " (and both nodes are primary)"
			return d
		}
		return Decision{Kind: Refused, Rule: 2, Reason: "both nodes are primary"}
	}
	s, p := self.Gens, peer.Gens
	switch {
	case s.Current == 0 && p.Current == 0:
		// Two fresh (sparse, all-zero) replicas are identical.
		return Decision{Kind: NoSync, Rule: 10}
	case s.Current == 0:
		return Decision{Kind: FullTarget, Rule: 20}
	case p.Current == 0:
		return Decision{Kind: FullSource, Rule: 30}
	case s.Current == p.Current:
		// Same generation. A node that crashed while primary may hold
		// writes the peer never saw (and vice versa): resync its activity
		// log from it.
		switch {
		case self.CrashedPrimary && !peer.CrashedPrimary:
			return Decision{Kind: BitmapSource, Rule: 40}
		case peer.CrashedPrimary && !self.CrashedPrimary:
			return Decision{Kind: BitmapTarget, Rule: 40}
		case self.CrashedPrimary && peer.CrashedPrimary:
			if self.NodeID < peer.NodeID {
				return Decision{Kind: BitmapSource, Rule: 41}
			}
			return Decision{Kind: BitmapTarget, Rule: 41}
		}
		if self.Dirty > 0 || peer.Dirty > 0 {
			// Same generation but bits set (e.g. interrupted resync or
			// verify marked blocks): the UpToDate side sources.
			if sourceWins(self, peer) {
				return Decision{Kind: BitmapSource, Rule: 42}
			}
			return Decision{Kind: BitmapTarget, Rule: 42}
		}
		return Decision{Kind: NoSync, Rule: 43}
	case p.Bitmap == s.Current && s.Bitmap != p.Current:
		// The peer started a new generation from ours and tracked changes.
		return Decision{Kind: BitmapTarget, Rule: 50}
	case s.Bitmap == p.Current && p.Bitmap != s.Current:
		return Decision{Kind: BitmapSource, Rule: 60}
	case p.inHistory(s.Current) && !s.inHistory(p.Current):
		// We are an older generation than the peer's bitmap base: the
		// bitmap does not cover us, so full sync.
		return Decision{Kind: FullTarget, Rule: 70}
	case s.inHistory(p.Current) && !p.inHistory(s.Current):
		return Decision{Kind: FullSource, Rule: 80}
	case s.Bitmap != 0 && s.Bitmap == p.Bitmap:
		// Both started new generations from the same base: split brain
		// where both bitmaps together cover every difference.
		return resolveSplitBrain(self, peer, policy, 90)
	case s.inHistory(p.Bitmap) || p.inHistory(s.Bitmap) || (s.History[0] != 0 && s.History[0] == p.History[0]):
		// Split brain with older common ancestry: bitmaps don't cover it,
		// so a resolved split brain would need a full sync.
		d := resolveSplitBrain(self, peer, policy, 100)
		if d.Resolved {
			if d.Kind == BitmapSource {
				d.Kind = FullSource
			} else if d.Kind == BitmapTarget {
				d.Kind = FullTarget
			}
		}
		return d
	}
	return Decision{Kind: Unrelated, Rule: 110, Reason: "no common data generation"}
}

func resolveSplitBrain(self, peer Hello, policy SplitBrainPolicy, rule int) Decision {
	sb := Decision{Kind: SplitBrain, Rule: rule, Reason: "split brain: both sides wrote since generation " + hexGen(self.Gens.Bitmap)}
	// loser==true means we are discarded (become sync target).
	var loser, ok bool
	by := policy.String()
	switch {
	case self.DiscardMyData && peer.DiscardMyData:
		// Both asked to be discarded: there is no survivor to sync from.
		sb.Reason += "; both nodes asked to discard their data (use discard-my-data on one only)"
		return sb
	case self.DiscardMyData || peer.DiscardMyData:
		// The operator's one-shot choice wins over any policy.
		loser, ok, by = self.DiscardMyData, true, "discard-my-data"
	case policy == SBDiscardZeroChanges:
		switch {
		case self.Dirty == 0 && peer.Dirty > 0:
			loser, ok = true, true
		case peer.Dirty == 0 && self.Dirty > 0:
			loser, ok = false, true
		case self.Dirty == 0 && peer.Dirty == 0:
			// Neither actually wrote: any direction is lossless.
			loser, ok = self.NodeID > peer.NodeID, true
		}
	case policy == SBDiscardYoungerPrimary:
		if self.PromotedAt != peer.PromotedAt {
			loser, ok = self.PromotedAt > peer.PromotedAt, true
		} else {
			loser, ok = self.NodeID > peer.NodeID, true
		}
	case policy == SBDiscardLeastChanges:
		if self.Dirty != peer.Dirty {
			loser, ok = self.Dirty < peer.Dirty, true
		} else {
			loser, ok = self.NodeID > peer.NodeID, true
		}
	}
	if !ok {
		return sb
	}
	// Never throw away the data a running primary is serving.
	if (loser && self.Role == Primary) || (!loser && peer.Role == Primary) {
		sb.Reason += "; " + by + " would discard the current primary"
		return sb
	}
	if loser {
		return Decision{Kind: BitmapTarget, Rule: rule, Resolved: true, Reason: "split brain resolved by " + by}
	}
	return Decision{Kind: BitmapSource, Rule: rule, Resolved: true, Reason: "split brain resolved by " + by}
}

func hexGen(u uint64) string {
	const digits = "0123456789abcdef"
	if u == 0 {
		return "0"
	}
	var b [16]byte
	i := len(b)
	for u > 0 {
		i--
		b[i] = digits[u&15]
		u >>= 4
	}
	return string(b[i:])
}

// sourceWins breaks a same-generation tie: the primary, else the better
// disk state, else the lower node id sources.
func sourceWins(self, peer Hello) bool {
	switch {
	case self.Role != peer.Role:
		return self.Role == Primary
	case self.Disk != peer.Disk:
		return self.Disk > peer.Disk
	}
	return self.NodeID < peer.NodeID
}
