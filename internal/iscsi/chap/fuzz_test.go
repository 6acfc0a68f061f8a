package chap

import (
	"bytes"
	"math/rand"
	"strings"
	"testing"
)

// FuzzDecodeBinary: never panics, never returns more than max bytes, and
// hex output re-encodes to an equivalent value.
func FuzzDecodeBinary(f *testing.F) {
	for _, s := range []string{"0x0102", "0bAQI=", "0x7BBF01A9066BC2A1A23AFF4E4978B4F3", "0x", "0x1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := DecodeBinary(s, 64)
		if err != nil {
			return
		}
		if len(b) > 64 {
			t.Fatalf("%d bytes over 64", len(b))
		}
		again, err := DecodeBinary(EncodeBinary(b), 64)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-decode %x: %x %v", b, again, err)
		}
	})
}

// FuzzVerify: arbitrary CHAP_* values from an initiator never panic and
// are never accepted unless the response is right.
func FuzzVerify(f *testing.F) {
	f.Add("alice", "0x00", "1", "0x0102", "5")
	f.Add("alice", "0b", "", "", "5,7")
	f.Add("", "0x"+strings.Repeat("ab", 16), "300", "0x", "")
	f.Fuzz(func(t *testing.T, n, r, i, c, a string) {
		rnd := rand.New(rand.NewSource(3))
		ch, _, err := Begin(a, rnd)
		if err != nil {
			return
		}
		offers := map[string]string{"CHAP_N": n, "CHAP_R": r}
		if i != "" || c != "" {
			offers["CHAP_I"], offers["CHAP_C"] = i, c
		}
		sec := Secrets{Lookup: lookup, TargetName: "t", TargetSecret: []byte("target-secret-x")}
		if _, err := Verify(ch, offers, sec, nil); err == nil {
			want := Response(ch.ID, []byte("initiator-secret"), ch.Value)
			got, _ := DecodeBinary(r, MaxBinaryLen)
			if n != "alice" || !bytes.Equal(got, want[:]) {
				t.Fatalf("accepted N=%q R=%q", n, r)
			}
		}
	})
}
