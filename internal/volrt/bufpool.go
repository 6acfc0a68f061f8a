package volrt

import "github.com/vmsan/vmsan/internal/alignbuf"

// GetBuf returns a pooled, page-aligned payload buffer of length n (aligned
// because the backend may use O_DIRECT). Give it back with PutBuf once no
// longer referenced; steady-state request handling then allocates nothing.
func GetBuf(n int) *[]byte { return alignbuf.Get(n) }

// PutBuf returns a buffer from GetBuf to the pool; nil is ignored.
func PutBuf(p *[]byte) { alignbuf.Put(p) }
