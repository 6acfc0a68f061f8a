package pdu

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// goldenPDUs returns every captured PDU (raw bytes, digests included) and
// the digests in force for it.
func goldenPDUs(t testing.TB) (pdus [][]byte, digests []Digests) {
	files := []string{}
	for _, sc := range scenarios() {
		files = append(files, sc.file)
	}
	for _, v := range openiscsiVectors() {
		files = append(files, v.file)
	}
	for _, file := range files {
		for _, l := range loadTranscript(t, file) {
			_, h, _ := strings.Cut(l, " ")
			b, err := hex.DecodeString(h)
			if err != nil {
				t.Fatal(err)
			}
			pdus = append(pdus, b)
		}
	}
	if len(pdus) == 0 {
		t.Fatal("no golden PDUs")
	}
	return pdus, nil
}

// FuzzDecodeBHS: Decode never panics; what it accepts re-encodes to a BHS
// that decodes to the same struct (reserved bits are dropped, so the bytes
// may differ, the meaning may not).
func FuzzDecodeBHS(f *testing.F) {
	pdus, _ := goldenPDUs(f)
	for _, p := range pdus {
		f.Add(p[:BHSLen])
	}
	for _, p := range every() {
		var b [BHSLen]byte
		p.Encode(b[:])
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Decode(b)
		if err != nil {
			if p != nil {
				t.Fatal("error with a PDU")
			}
			return
		}
		var out [BHSLen]byte
		if err := p.Encode(out[:]); err != nil {
			t.Fatalf("%s: decoded but does not encode: %v", p.Opcode(), err)
		}
		q, err := Decode(out[:])
		if err != nil || !reflect.DeepEqual(p, q) {
			t.Fatalf("%s: round trip %+v != %+v (%v)", p.Opcode(), p, q, err)
		}
		// Re-encoding is a fixed point.
		var again [BHSLen]byte
		q.Encode(again[:])
		if again != out {
			t.Fatalf("%s: encoding not stable", p.Opcode())
		}
	})
}

// FuzzReadPDU: reading a byte stream with limits never panics, never
// allocates for a segment over the limit, and whatever it reads without
// error re-encodes to as many bytes as it consumed (reserved bits and
// padding contents are not kept, so the bytes themselves may differ).
func FuzzReadPDU(f *testing.F) {
	pdus, _ := goldenPDUs(f)
	for _, p := range pdus {
		f.Add(p, false, uint16(4096))
		f.Add(p, true, uint16(8192))
	}
	// Streams of several PDUs as open-iscsi sent them: its side of the
	// small-burst session (the write with R2Ts answered by Data-Outs) and
	// the target's (Data-Ins of 512 bytes).
	for _, dir := range []string{"C", "S"} {
		var stream []byte
		for _, l := range loadTranscript(f, "openiscsi-vmsan-session-chap-mutual-small-burst.txt") {
			if d, h, _ := strings.Cut(l, " "); d == dir {
				b, _ := hex.DecodeString(h)
				stream = append(stream, b...)
			}
		}
		f.Add(stream, false, uint16(512))
	}
	f.Fuzz(func(t *testing.T, stream []byte, hdrDigest bool, maxData uint16) {
		d := Digests{Header: hdrDigest}
		br := bytes.NewReader(stream)
		r := Reader{R: br, MaxData: int(maxData), Digests: d}
		// Every other PDU's data segment goes to a caller's buffer (as
		// a target reads write data into its command's buffer).
		scratch := make([]byte, 1<<16)
		for i := 0; i < 8; i++ {
			r.DataBuffer = nil
			if i%2 == 1 {
				r.DataBuffer = func(_ PDU, n int) []byte { return scratch[:n] }
			}
			start := len(stream) - br.Len()
			// A declared segment over the limit must be refused as such,
			// whatever follows it (not read first and then refused).
			overLimit := false
			if _, l, perr := PeekLengths(stream[start:]); perr == nil && int(l.TotalAHSLength)*4 <= MaxTotalAHSLength {
				limit := int(maxData)
				if limit == 0 {
					limit = DefaultMaxRecvDataSegmentLength
				}
				overLimit = int(l.DataSegmentLength) > limit
			}
			fr, err := r.Read()
			if overLimit && !errors.Is(err, ErrTooLong) {
				t.Fatalf("declared segment over the limit: got %v", err)
			}
			if err != nil {
				if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrTooLong) ||
					errors.Is(err, ErrDigest) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnknownOpcode) {
					return
				}
				t.Fatalf("unexpected error class: %v", err)
			}
			limit := int(maxData)
			if limit == 0 {
				limit = DefaultMaxRecvDataSegmentLength
			}
			if len(fr.Data) > limit || cap(fr.Data) > limit {
				t.Fatalf("data segment %d over limit %d", len(fr.Data), limit)
			}
			consumed := stream[start : len(stream)-br.Len()]
			re, err := AppendPDU(nil, fr.Header, fr.AHS, fr.Data, d)
			if err != nil {
				t.Fatal(err)
			}
			if len(re) != len(consumed) {
				t.Fatalf("re-encoded %d bytes, consumed %d", len(re), len(consumed))
			}
			if segs, err := ParseAHS(fr.AHS); err == nil {
				for _, s := range segs {
					if len(s.Specific) > len(fr.AHS) {
						t.Fatal("AHS segment larger than the area")
					}
				}
			}
		}
	})
}

// FuzzParseAHS: AHS parsing never panics and its segments re-encode into
// an area that parses the same.
func FuzzParseAHS(f *testing.F) {
	a, _ := AppendAHS(nil, ExtendedCDB(make([]byte, 24)))
	a, _ = AppendAHS(a, BidiReadLength(1))
	f.Add(a)
	f.Add([]byte{0, 5, 2, 0, 0, 0, 0x10, 0})
	f.Fuzz(func(t *testing.T, area []byte) {
		segs, err := ParseAHS(area)
		if err != nil {
			return
		}
		var out []byte
		for _, s := range segs {
			if out, err = AppendAHS(out, s); err != nil {
				t.Fatal(err)
			}
		}
		again, err := ParseAHS(out)
		if err != nil || len(again) != len(segs) {
			t.Fatalf("re-parse: %v", err)
		}
		for i := range segs {
			if again[i].Type != segs[i].Type || !bytes.Equal(again[i].Specific, segs[i].Specific) {
				t.Fatalf("segment %d differs", i)
			}
		}
	})
}
