package target

import (
	"bytes"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/vmsan/vmsan/internal/scsi"
)

// ramLU is a tiny SCSI disk for the session layer's tests: just enough of
// SPC/SBC (TEST UNIT READY, INQUIRY, READ CAPACITY 10/16, READ/WRITE
// 10/16, REPORT LUNS, SYNCHRONIZE CACHE, MODE SENSE 6) for libiscsi's
// tools and QEMU to attach. The real emulation is package scsi's.
type ramLU struct {
	mu    sync.Mutex
	disk  []byte
	block chan struct{} // when non-nil, commands wait on it (abort tests)
	tmfs  atomic.Int32
	lost  atomic.Int32
	execs atomic.Int32
	nexus atomic.Pointer[scsi.Nexus] // the last command's
}

func newRAMLU(size int) *ramLU { return &ramLU{disk: make([]byte, size)} }

// equal reports whether the disk starts with want. It locks like exec:
// a response read from the socket orders nothing for the race detector
// (the target gathers its writes with writev, which, unlike write, it
// does not annotate).
func (l *ramLU) equal(want []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Equal(l.disk[:len(want)], want)
}

func sense(key, asc, ascq byte) *scsi.Result {
	return &scsi.Result{Status: 0x02, Sense: senseFixed(key, asc, ascq)}
}

func (l *ramLU) Execute(t *scsi.Task, done func(*scsi.Result)) {
	l.execs.Add(1)
	l.nexus.Store(t.Nexus)
	if b := l.block; b != nil {
		go func() { <-b; done(l.run(t)) }()
		return
	}
	done(l.run(t))
}

func (l *ramLU) run(t *scsi.Task) *scsi.Result {
	r := l.exec(t)
	if len(r.DataIn) > int(t.ExpectedIn) {
		r.Overflow, r.Residual = true, uint32(len(r.DataIn))-t.ExpectedIn
		r.DataIn = r.DataIn[:t.ExpectedIn]
	} else if len(r.DataIn) < int(t.ExpectedIn) && r.Status == 0 {
		r.Underflow, r.Residual = true, t.ExpectedIn-uint32(len(r.DataIn))
	}
	return r
}

func (l *ramLU) exec(t *scsi.Task) *scsi.Result {
	if t.LUN != 0 && t.CDB[0] != 0xa0 && t.CDB[0] != 0x12 {
		return sense(0x05, 0x25, 0x00)
	}
	cdb := t.CDB
	blocks := uint64(len(l.disk) / 512)
	be := binary.BigEndian
	switch cdb[0] {
	case 0x00, 0x35, 0x91: // TEST UNIT READY, SYNCHRONIZE CACHE 10/16
		return &scsi.Result{}
	case 0x12: // INQUIRY
		if cdb[1]&1 != 0 {
			switch cdb[2] {
			case 0x00:
				return &scsi.Result{DataIn: []byte{0, 0, 0, 2, 0x00, 0x80}}
			case 0x80:
				return &scsi.Result{DataIn: []byte{0, 0x80, 0, 4, 'f', 'a', 'k', 'e'}}
			}
			return sense(0x05, 0x24, 0x00)
		}
		d := make([]byte, 36)
		if t.LUN != 0 {
			d[0] = 0x7f
		}
		d[2], d[3], d[4] = 5, 2, 31
		copy(d[8:], "VMSAN   FAKE            0001")
		return &scsi.Result{DataIn: d}
	case 0x1a: // MODE SENSE 6
		return &scsi.Result{DataIn: []byte{3, 0, 0, 0}}
	case 0x25: // READ CAPACITY 10
		d := make([]byte, 8)
		be.PutUint32(d, uint32(blocks-1))
		be.PutUint32(d[4:], 512)
		return &scsi.Result{DataIn: d}
	case 0x9e: // READ CAPACITY 16
		d := make([]byte, 32)
		be.PutUint64(d, blocks-1)
		be.PutUint32(d[8:], 512)
		return &scsi.Result{DataIn: d}
	case 0xa0: // REPORT LUNS
		d := make([]byte, 16)
		be.PutUint32(d, 8)
		return &scsi.Result{DataIn: d}
	case 0x28, 0x88, 0x2a, 0x8a: // READ/WRITE 10/16
		var lba, n uint64
		if cdb[0] == 0x28 || cdb[0] == 0x2a {
			lba, n = uint64(be.Uint32(cdb[2:])), uint64(be.Uint16(cdb[7:]))
		} else {
			lba, n = be.Uint64(cdb[2:]), uint64(be.Uint32(cdb[10:]))
		}
		if lba+n > blocks {
			return sense(0x05, 0x21, 0x00)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if cdb[0] == 0x28 || cdb[0] == 0x88 {
			return &scsi.Result{DataIn: append([]byte(nil), l.disk[lba*512:(lba+n)*512]...)}
		}
		if uint64(len(t.DataOut)) < n*512 {
			return sense(0x05, 0x24, 0x00)
		}
		copy(l.disk[lba*512:], t.DataOut[:n*512])
		return &scsi.Result{}
	}
	return sense(0x05, 0x20, 0x00)
}

func (l *ramLU) TaskManagement(fn uint8, n *scsi.Nexus, lun uint64) uint8 {
	l.tmfs.Add(1)
	return scsi.TMFComplete
}

func (l *ramLU) NexusLost(n *scsi.Nexus) { l.lost.Add(1) }
