package text

import (
	"strings"
	"testing"
)

// FuzzParse: parsing never panics; accepted text re-encodes and re-parses
// to the same pairs, every key and value within its bound.
func FuzzParse(f *testing.F) {
	for _, d := range capturedOffers(f) {
		f.Add(d)
	}
	f.Add([]byte("a=1\x00a=2\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := Parse(data)
		if err != nil {
			return
		}
		for _, p := range ps {
			if len(p.Key) > MaxKeyLen || len(p.Value) > MaxLen(p.Key) {
				t.Fatalf("%q over its bound", p.Key)
			}
		}
		enc, err := Append(nil, ps...)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(enc)
		if err != nil || len(again) != len(ps) {
			t.Fatalf("re-parse: %v", err)
		}
		for i := range ps {
			if again[i] != ps[i] {
				t.Fatalf("pair %d: %v != %v", i, again[i], ps[i])
			}
		}
	})
}

// FuzzNegotiate: for any offer, answers are well-formed and consistent with
// the offer by the offerer's own check (Settle), and the resulting
// parameters obey the cross-key rules.
func FuzzNegotiate(f *testing.F) {
	for _, d := range capturedOffers(f) {
		f.Add(d, false)
		f.Add(d, true)
	}
	f.Add([]byte("MaxBurstLength=512\x00FirstBurstLength=16777215\x00"), false)
	f.Fuzz(func(t *testing.T, data []byte, discovery bool) {
		offers, err := Parse(data)
		if err != nil {
			return
		}
		p := Defaults()
		ans := Negotiate(&p, offers, map[string]string{"HeaderDigest": "CRC32C,None"}, discovery)
		byKey := map[string]string{}
		for _, o := range offers {
			byKey[o.Key] = o.Value
		}
		for _, a := range ans {
			if strings.ContainsRune(a.Value, 0) || a.Value == "" {
				t.Fatalf("answer %q=%q", a.Key, a.Value)
			}
			if _, err := Settle(a.Key, byKey[a.Key], a.Value); err != nil {
				t.Fatalf("offer %s=%q answered %q: %v", a.Key, byKey[a.Key], a.Value, err)
			}
		}
		if err := p.Check(); err != nil {
			t.Fatalf("params after negotiation: %v", err)
		}
	})
}
