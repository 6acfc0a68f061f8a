package repl

import "math/bits"

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
