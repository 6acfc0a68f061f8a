package volrt

import (
	"github.com/vmsan/vmsan/internal/alignbuf"
	"github.com/vmsan/vmsan/internal/export"
)

// Piece is a run of a read reply: data, or a hole the client may read as
// zeroes without the bytes being sent.
type Piece struct {
	Off, N uint64
	Hole   bool
}

// MinHole is the smallest range sent as a hole: below a page the chunk
// header costs about what the zeroes do.
const MinHole = 4096

// SplitHoles splits a completed read of data at off into data and hole
// pieces using dev's extents, appending to ps[:0] (pass the previous
// result to reuse its storage: no allocation in steady state). A range is
// a hole only if the extent says zero AND the bytes actually read are all
// zero, so a stale extent answer (a write racing with the read) can never
// make the client see zeroes instead of data. It returns ps[:0] (send
// everything as data) when the extents are unusable (error, gaps, or not
// covering the read).
func SplitHoles(ps []Piece, dev export.Device, off uint64, data []byte) []Piece {
	ps = ps[:0]
	exts, err := dev.Extents(int64(off), int64(len(data)))
	if err != nil {
		return ps
	}
	end := off + uint64(len(data))
	for _, e := range exts {
		s, f := max(uint64(e.Offset), off), min(uint64(e.Offset+e.Length), end)
		if e.Length <= 0 || f <= s {
			continue
		}
		hole := e.Zero && f-s >= MinHole && alignbuf.IsZero(data[s-off:f-off])
		if n := len(ps); n > 0 && ps[n-1].Hole == hole && ps[n-1].Off+ps[n-1].N == s {
			ps[n-1].N += f - s
			continue
		}
		if n := len(ps); n > 0 && ps[n-1].Off+ps[n-1].N != s {
			return ps[:0] // extents with gaps: do not trust them
		}
		ps = append(ps, Piece{Off: s, N: f - s, Hole: hole})
	}
	if len(ps) == 0 || ps[0].Off != off || ps[len(ps)-1].Off+ps[len(ps)-1].N != end {
		return ps[:0]
	}
	return ps
}
