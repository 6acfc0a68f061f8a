package backend

import (
	"sort"
	"sync"
)

// memPage is the allocation unit of Mem.
const memPage = 4096

// Mem is an in-memory Backend, sparse by 4 KiB pages: pages never written
// (or trimmed whole) are holes and Extents reports them as such. It is meant
// for tests of every package above the backend.
//
// Concurrency: safe for concurrent use (one RWMutex; reads share it).
// Sync, FUA and Close have nothing to do; data survives Close.
type Mem struct {
	mu    sync.RWMutex
	size  int64
	pages map[int64]*[memPage]byte // page index -> data
}

// NewMem returns an empty (all-hole) Mem of the given size.
func NewMem(size int64) *Mem {
	return &Mem{size: size, pages: make(map[int64]*[memPage]byte)}
}

func (m *Mem) check(off, length int64) error {
	if off < 0 || length < 0 || off > m.size-length {
		return ErrOutOfRange
	}
	return nil
}

// Size implements Backend.
func (m *Mem) Size() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.size
}

// ReadvAt implements Backend.
func (m *Mem) ReadvAt(bufs [][]byte, off int64) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if err := m.check(off, totalLen(bufs)); err != nil {
		return err
	}
	for _, b := range bufs {
		for len(b) > 0 {
			idx, in := off/memPage, off%memPage
			n := min(int64(len(b)), memPage-in)
			if p := m.pages[idx]; p != nil {
				copy(b[:n], p[in:])
			} else {
				clear(b[:n])
			}
			b = b[n:]
			off += n
		}
	}
	return nil
}

// WritevAt implements Backend.
func (m *Mem) WritevAt(bufs [][]byte, off int64, fua bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, totalLen(bufs)); err != nil {
		return err
	}
	for _, b := range bufs {
		for len(b) > 0 {
			idx, in := off/memPage, off%memPage
			n := min(int64(len(b)), memPage-in)
			p := m.pages[idx]
			if p == nil {
				p = new([memPage]byte)
				m.pages[idx] = p
			}
			copy(p[in:], b[:n])
			b = b[n:]
			off += n
		}
	}
	return nil
}

// Sync implements Backend (nothing to do).
func (m *Mem) Sync() error { return nil }

// zeroLocked zeroes [off, off+length); whole pages are dropped if punch,
// partial pages are cleared in place (and allocated if !punch).
func (m *Mem) zeroLocked(off, length int64, punch bool) {
	end := off + length
	for off < end {
		idx, in := off/memPage, off%memPage
		n := min(end-off, memPage-in)
		p := m.pages[idx]
		switch {
		case n == memPage && punch:
			delete(m.pages, idx)
		case p != nil:
			clear(p[in : in+n])
		case !punch:
			m.pages[idx] = new([memPage]byte)
		}
		off += n
	}
}

// Trim implements Backend.
func (m *Mem) Trim(off, length int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, length); err != nil {
		return err
	}
	m.zeroLocked(off, length, true)
	return nil
}

// WriteZeroes implements Backend; it is always fast.
func (m *Mem) WriteZeroes(off, length int64, mayTrim, fast bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, length); err != nil {
		return err
	}
	m.zeroLocked(off, length, mayTrim)
	return nil
}

// Extents implements Backend: allocated pages are data, others holes.
func (m *Mem) Extents(off, length int64) ([]Extent, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if err := m.check(off, length); err != nil {
		return nil, err
	}
	end := off + length
	// Walk allocated pages in order rather than every page of the range,
	// so a 10 GiB mostly-empty range is cheap.
	var idxs []int64
	first, last := off/memPage, (end-1)/memPage
	if int64(len(m.pages)) < last-first+1 {
		for i := range m.pages {
			if i >= first && i <= last {
				idxs = append(idxs, i)
			}
		}
		sort.Slice(idxs, func(a, b int) bool { return idxs[a] < idxs[b] })
	} else {
		for i := first; i <= last && length > 0; i++ {
			if m.pages[i] != nil {
				idxs = append(idxs, i)
			}
		}
	}
	var out []Extent
	add := func(s, e int64, hole bool) {
		s, e = max(s, off), min(e, end)
		if e <= s {
			return
		}
		if k := len(out); k > 0 && out[k-1].Hole == hole && out[k-1].Offset+out[k-1].Length == s {
			out[k-1].Length += e - s
			return
		}
		out = append(out, Extent{Offset: s, Length: e - s, Hole: hole, Zero: hole})
	}
	pos := off
	for _, i := range idxs {
		add(pos, i*memPage, true)
		add(i*memPage, (i+1)*memPage, false)
		pos = max(pos, (i+1)*memPage)
	}
	add(pos, end, true)
	return out, nil
}

// Resize implements Backend; shrinking drops data past the new end.
func (m *Mem) Resize(size int64) error {
	if size < 0 {
		return ErrOutOfRange
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if size < m.size {
		// Clear the tail of a partial last page, drop whole pages beyond.
		if in := size % memPage; in != 0 {
			if p := m.pages[size/memPage]; p != nil {
				clear(p[in:])
			}
		}
		for i := range m.pages {
			if i*memPage >= size {
				delete(m.pages, i)
			}
		}
	}
	m.size = size
	return nil
}

// Close implements Backend (nothing to release; data stays readable).
func (m *Mem) Close() error { return nil }

// Allocated returns the number of bytes held in allocated pages.
func (m *Mem) Allocated() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return int64(len(m.pages)) * memPage
}

var (
	_ Backend = (*Mem)(nil)
	_ Backend = (*File)(nil)
)
