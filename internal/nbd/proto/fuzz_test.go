package proto

import (
	"errors"
	"testing"
)

// seedsFromTranscripts extracts every client option (header+data) and every
// request header from the captured sessions in testdata.
func seedsFromTranscripts(t testing.TB) (opts, reqs [][]byte) {
	for _, name := range []string{"nbdkit-nbdinfo-json.txt", "nbdkit-qemu-io.txt", "nbdkit-nbdinfo-map.txt", "qemu-nbd-nbdinfo-list.txt", "qemu-nbd-map-read.txt"} {
		for _, s := range loadTranscript(t, name) {
			c := s.c[ClientFlagsSize:]
			for len(c) >= OptionHeaderSize {
				h, err := ParseOptionHeader(c)
				if err != nil || len(c) < OptionHeaderSize+int(h.Length) {
					break
				}
				n := OptionHeaderSize + int(h.Length)
				opts = append(opts, append([]byte(nil), c[:n]...))
				c = c[n:]
				if h.Opt == OptGo || h.Opt == OptExportName {
					break
				}
			}
			for len(c) >= RequestSize {
				r, err := ParseRequest(c)
				if err != nil {
					break
				}
				reqs = append(reqs, append([]byte(nil), c[:RequestSize]...))
				c = c[RequestSize:]
				if r.Type == CmdWrite {
					c = c[min(len(c), int(r.Length)):]
				}
			}
		}
	}
	if len(opts) == 0 || len(reqs) == 0 {
		t.Fatal("no seeds extracted")
	}
	return opts, reqs
}

// FuzzParseOption: handshake option parsing must never panic, never accept
// more data than the header claims, and must re-encode what it accepts.
func FuzzParseOption(f *testing.F) {
	opts, _ := seedsFromTranscripts(f)
	for _, o := range opts {
		f.Add(o)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := ParseOption(b)
		if err != nil {
			if !errors.Is(err, ErrShort) && !errors.Is(err, ErrBadMagic) && !errors.Is(err, ErrTooLong) && !errors.Is(err, ErrInvalid) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		h, _ := ParseOptionHeader(b)
		if len(o.Data) != int(h.Length) || h.Length > MaxOptionLength {
			t.Fatalf("data %d, header %d", len(o.Data), h.Length)
		}
		var data []byte
		switch o.Opt {
		case OptInfo, OptGo:
			data = AppendInfoRequest(nil, o.Name, o.InfoRequests)
		case OptListMetaContext, OptSetMetaContext:
			data = AppendMetaContextRequest(nil, o.Name, o.Queries)
		default:
			return
		}
		if string(data) != string(o.Data) {
			t.Fatalf("re-encode %x != %x", data, o.Data)
		}
	})
}

// FuzzParseRequest: request parsing never panics and round-trips.
func FuzzParseRequest(f *testing.F) {
	_, reqs := seedsFromTranscripts(f)
	for _, r := range reqs {
		f.Add(r)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			if !errors.Is(err, ErrShort) && !errors.Is(err, ErrBadMagic) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if string(AppendRequest(nil, r)) != string(b[:RequestSize]) {
			t.Fatal("round trip mismatch")
		}
	})
}
