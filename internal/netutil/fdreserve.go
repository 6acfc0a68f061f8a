package netutil

import (
	"errors"
	"os"
	"sync"
	"syscall"
)

// FDReserve is a handful of file descriptors held open (on /dev/null) so
// that an operation which must not fail for want of a descriptor (a
// replication metadata write: without it acknowledgements stop) can get
// some while a flood of connections has taken all the others: on EMFILE
// or ENFILE the operation calls Release, retries at once, and calls Refill
// afterwards. The freed descriptors are the lowest free numbers and the
// accept loops are pausing (Retry's backoff) after their own EMFILE, so
// the retry almost always gets them; when it does not, the caller still
// waits and retries (the reserve shortens the wait, it is not the safety).
// The zero value holds nothing; NewFDReserve opens n.
type FDReserve struct {
	mu    sync.Mutex
	want  int
	files []*os.File
}

// NewFDReserve opens up to n descriptors (fewer if the limit is reached:
// Refill tops it up later).
func NewFDReserve(n int) *FDReserve {
	r := &FDReserve{want: n}
	r.Refill()
	return r
}

// Release closes every held descriptor and reports how many it freed.
func (r *FDReserve) Release() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.files)
	for _, f := range r.files {
		f.Close()
	}
	r.files = r.files[:0]
	return n
}

// Refill reopens held descriptors up to the reserve's size, stopping at
// the first failure (still out of descriptors: a later Refill retries).
// It reports how many are held.
func (r *FDReserve) Refill() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.files) < r.want {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		r.files = append(r.files, f)
	}
	return len(r.files)
}

// Held is how many descriptors the reserve holds now.
func (r *FDReserve) Held() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.files)
}

// OutOfFDs reports whether err says the process (EMFILE) or the system
// (ENFILE) has no file descriptor left.
func OutOfFDs(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}
