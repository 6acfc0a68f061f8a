package repl

import (
	"math/bits"
	"slices"
)

// ChunkSize is the granularity of the dirty bitmap: one bit per 64 KiB.
//
// Trade-off (documented in docs/replication.md): 1 bit per 4 KiB would
// resend exactly the 4 KiB blocks written while disconnected, but costs
// 32 MiB of bitmap per TiB (persisted and exchanged at every handshake);
// 1 bit per 64 KiB costs 2 MiB per TiB and resync sends at most 64 KiB per
// dirty bit, so a random 4 KiB workload resends up to 16x what it wrote
// while a sequential one resends ~1x. VM disks are dominated by sequential
// and clustered (filesystem-journal, 64 KiB+ cluster) writes, so 64 KiB.
const ChunkSize = 64 << 10

// Bitmap is a dirty bitmap over a volume: bit i set means bytes
// [i*ChunkSize, (i+1)*ChunkSize) may differ from the peer.
type Bitmap struct {
	words  []uint64
	chunks int64
	count  int64 // set bits, kept up to date
}

// NewBitmap returns an all-clear bitmap for a volume of size bytes.
func NewBitmap(size int64) *Bitmap {
	n := (size + ChunkSize - 1) / ChunkSize
	return &Bitmap{words: make([]uint64, (n+63)/64), chunks: n}
}

// Chunks is the number of bits.
func (b *Bitmap) Chunks() int64 { return b.chunks }

// Count is the number of set bits.
func (b *Bitmap) Count() int64 { return b.count }

// Words exposes the backing words (for persistence). Callers must not modify.
func (b *Bitmap) Words() []uint64 { return b.words }

// LoadWords replaces the content; extra or missing words are ignored/zero.
func (b *Bitmap) LoadWords(w []uint64) {
	clear(b.words)
	copy(b.words, w)
	b.maskTail()
	b.recount()
}

func (b *Bitmap) maskTail() {
	if r := b.chunks % 64; r != 0 && len(b.words) > 0 {
		b.words[len(b.words)-1] &= (1 << uint(r)) - 1
	}
}

func (b *Bitmap) recount() {
	b.count = 0
	for _, w := range b.words {
		b.count += int64(bits.OnesCount64(w))
	}
}

// Test reports bit i.
func (b *Bitmap) Test(i int64) bool {
	if i < 0 || i >= b.chunks {
		return false
	}
	return b.words[i/64]&(1<<uint(i%64)) != 0
}

// SetChunk sets bit i; it reports whether it changed.
func (b *Bitmap) SetChunk(i int64) bool {
	if i < 0 || i >= b.chunks || b.Test(i) {
		return false
	}
	b.words[i/64] |= 1 << uint(i%64)
	b.count++
	return true
}

// ClearChunk clears bit i; it reports whether it changed.
func (b *Bitmap) ClearChunk(i int64) bool {
	if !b.Test(i) {
		return false
	}
	b.words[i/64] &^= 1 << uint(i%64)
	b.count--
	return true
}

// SetRange marks every chunk touched by [off, off+length) dirty and returns
// how many bits changed.
func (b *Bitmap) SetRange(off, length int64) int64 {
	if length <= 0 {
		return 0
	}
	var n int64
	for i := off / ChunkSize; i <= (off+length-1)/ChunkSize; i++ {
		if b.SetChunk(i) {
			n++
		}
	}
	return n
}

// ClearRange clears the chunks wholly inside [off, off+length); a partial
// chunk at either end stays set (its other bytes may still differ). The last
// chunk of the volume counts as whole when the range reaches the end.
func (b *Bitmap) ClearRange(off, length, size int64) {
	first := (off + ChunkSize - 1) / ChunkSize
	end := off + length
	last := end/ChunkSize - 1
	if end >= size {
		last = b.chunks - 1
	}
	for i := first; i <= last; i++ {
		b.ClearChunk(i)
	}
}

// SetAll marks every chunk dirty (full sync).
func (b *Bitmap) SetAll() {
	for i := range b.words {
		b.words[i] = ^uint64(0)
	}
	b.maskTail()
	b.recount()
}

// Or merges o into b (sizes must match; extra bits in o are ignored).
func (b *Bitmap) Or(o *Bitmap) {
	for i := range b.words {
		if i < len(o.words) {
			b.words[i] |= o.words[i]
		}
	}
	b.maskTail()
	b.recount()
}

// NextSet returns the first set bit >= i, or -1.
func (b *Bitmap) NextSet(i int64) int64 {
	if i < 0 {
		i = 0
	}
	for i < b.chunks {
		w := b.words[i/64] >> uint(i%64)
		if w != 0 {
			j := i + int64(bits.TrailingZeros64(w))
			if j < b.chunks {
				return j
			}
			return -1
		}
		i = (i/64 + 1) * 64
	}
	return -1
}

// Runs returns the set bits as [start, end) chunk runs, for the handshake.
func (b *Bitmap) Runs() []Run {
	var out []Run
	for i := b.NextSet(0); i >= 0; {
		j := i + 1
		for j < b.chunks && b.Test(j) {
			j++
		}
		out = append(out, Run{i, j})
		i = b.NextSet(j)
	}
	return out
}

// Run is a half-open run of chunk indices.
type Run struct{ Start, End int64 }

// ALExtentSize is the activity log's extent: 4 MiB, as DRBD.
const ALExtentSize = 4 << 20

// activityLog tracks the extents ("hot" regions) that may hold writes not
// yet reflected in the on-disk bitmap. INVARIANT: every local write is
// submitted only after its extents are in the persisted AL, and an extent
// leaves the AL only when no write to it is in flight and its bitmap words
// are persisted. So after a crash, on-disk bitmap ∪ AL ⊇ every block that
// can differ from the peer.
type activityLog struct {
	cap   int
	ext   map[int64]*alEntry
	clock uint64 // deterministic LRU clock
}

type alEntry struct {
	lastTick int64 // node tick of the last write (for retirement)
	lastUse  uint64
	refs     int
}

func newActivityLog(capacity int) *activityLog {
	return &activityLog{cap: capacity, ext: make(map[int64]*alEntry)}
}

// acquire takes references on the extents of [off, off+length). It returns
// whether the AL set changed (needs persisting before the write) and the
// evicted extents (whose bitmap words must be persisted).
func (a *activityLog) acquire(off, length, tick int64) (changed bool, evicted []int64) {
	if length <= 0 {
		length = 1
	}
	for e := off / ALExtentSize; e <= (off+length-1)/ALExtentSize; e++ {
		a.clock++
		if en, ok := a.ext[e]; ok {
			en.refs++
			en.lastUse, en.lastTick = a.clock, tick
			continue
		}
		changed = true
		if len(a.ext) >= a.cap {
			if v, ok := a.victim(); ok {
				delete(a.ext, v)
				evicted = append(evicted, v)
			}
			// No idle extent: the AL grows past its capacity rather than
			// stall the write; it shrinks again on later misses.
		}
		a.ext[e] = &alEntry{lastUse: a.clock, lastTick: tick, refs: 1}
	}
	return changed, evicted
}

func (a *activityLog) release(off, length int64) {
	if length <= 0 {
		length = 1
	}
	for e := off / ALExtentSize; e <= (off+length-1)/ALExtentSize; e++ {
		if en, ok := a.ext[e]; ok && en.refs > 0 {
			en.refs--
		}
	}
}

// idle returns the extents with no write in flight last written at or
// before tick: every write to them has completed.
func (a *activityLog) idle(tick int64) []int64 {
	var out []int64
	for e, en := range a.ext {
		if en.refs == 0 && en.lastTick <= tick {
			out = append(out, e)
		}
	}
	return out
}

// retire drops those of cand that are still idle since tick (not written
// again) and reports whether any was dropped.
func (a *activityLog) retire(cand []int64, tick int64) bool {
	n := 0
	for _, e := range cand {
		if en, ok := a.ext[e]; ok && en.refs == 0 && en.lastTick <= tick {
			delete(a.ext, e)
			n++
		}
	}
	return n > 0
}

func (a *activityLog) victim() (int64, bool) {
	best, found := int64(0), false
	var bestUse uint64
	for e, en := range a.ext {
		if en.refs > 0 {
			continue
		}
		// Deterministic despite map order: lowest lastUse, then lowest extent.
		if !found || en.lastUse < bestUse || (en.lastUse == bestUse && e < best) {
			best, bestUse, found = e, en.lastUse, true
		}
	}
	return best, found
}

// extents returns the AL's extents in ascending order.
func (a *activityLog) extents() []int64 {
	out := make([]int64, 0, len(a.ext))
	for e := range a.ext {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}
