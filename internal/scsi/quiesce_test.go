package scsi

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/export/exporttest"
)

// quiesceCmds are the writing commands the target runs as more than one
// step (a chunked pattern WRITE SAME, an UNMAP of many descriptors, the
// read-then-write of COMPARE AND WRITE and ORWRITE); each returns its CDB
// and data-out for iteration i.
func quiesceCmds() map[string]func(i int) ([]byte, []byte) {
	const bs = 512
	return map[string]func(int) ([]byte, []byte){
		"WriteSame": func(int) ([]byte, []byte) {
			return cdb16(opWriteSame16, 0, 0, 3<<20/bs), bytes.Repeat([]byte{0xAB}, bs)
		},
		"Unmap": func(int) ([]byte, []byte) {
			const nd = 64
			p := make([]byte, 8+16*nd)
			binary.BigEndian.PutUint16(p[0:], uint16(len(p)-2))
			binary.BigEndian.PutUint16(p[2:], 16*nd)
			for j := range nd {
				binary.BigEndian.PutUint64(p[8+16*j:], uint64(6144+j*16))
				binary.BigEndian.PutUint32(p[8+16*j+8:], 8)
			}
			return cdb10(opUnmap, 0, 0, uint16(len(p))), p
		},
		"CompareAndWrite": func(i int) ([]byte, []byte) {
			d := make([]byte, 2*bs)
			if i > 0 {
				copy(d, bytes.Repeat([]byte{byte(i)}, bs))
			}
			copy(d[bs:], bytes.Repeat([]byte{byte(i + 1)}, bs))
			c := cdb16(opCompareAndWrite, 0, 7000, 0)
			c[13] = 1
			return c, d
		},
		"ORWrite": func(i int) ([]byte, []byte) {
			return cdb16(opORWrite, 0, 7500, 64), bytes.Repeat([]byte{byte(1 << (i % 8))}, 64*bs)
		},
	}
}

// TestMultiStepWritesVsQuiesce: multi-step writing commands looping
// against Quiesce (what a snapshot of a live volume does) on a fast
// backend, where the engine runs a command's first request inline on the
// submitting goroutine. Every command and every Quiesce completes, every
// COMPARE AND WRITE matches, and no write reaches the backend while
// quiesced.
func TestMultiStepWritesVsQuiesce(t *testing.T) {
	for name, next := range quiesceCmds() {
		t.Run(name, func(t *testing.T) {
			dev := exporttest.NewMemDevice(t, "vol", 8<<20)
			dev.Meta.MaxBlock = 1 << 20
			f := newFixtureDev(t, dev)
			n := nexus("iqn.q", 1)
			f.ready(n)
			stop := make(chan struct{})
			errc := make(chan error, 1)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						errc <- nil
						return
					default:
					}
					cdb, out := next(i)
					ch := make(chan res, 1)
					f.tg.Execute(&Task{Nexus: n, CDB: cdb, DataOut: out, ExpectedOut: uint32(len(out))}, func(r *Result) {
						c := res{status: r.Status, sense: append([]byte(nil), r.Sense...)}
						r.Release()
						ch <- c
					})
					select {
					case r := <-ch:
						if r.status != StatusGood {
							k, a, q := r.kcq()
							errc <- fmt.Errorf("#%d: status %#x sense %x/%02x/%02x", i, r.status, k, a, q)
							return
						}
					case <-time.After(10 * time.Second):
						errc <- fmt.Errorf("#%d: no completion in 10 s (hang)", i)
						return
					}
				}
			}()
			for i := 0; i < 200; i++ {
				q := make(chan func(), 1)
				go func() {
					resume, err := dev.Volume.Quiesce()
					if err != nil {
						t.Error(err)
					}
					q <- resume
				}()
				select {
				case resume := <-q:
					if resume == nil {
						t.FailNow()
					}
					before := dev.Engine.Stats().BytesWritten
					time.Sleep(100 * time.Microsecond)
					if after := dev.Engine.Stats().BytesWritten; after != before {
						t.Errorf("quiesce %d: %d bytes written while quiesced", i, after-before)
					}
					resume()
				case <-time.After(10 * time.Second):
					t.Fatalf("quiesce %d: no answer in 10 s (hang)", i)
				case err := <-errc:
					t.Fatal(err)
				}
			}
			close(stop)
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			wg.Wait()
		})
	}
}
