package chap

import (
	"bytes"
	"crypto/md5"
	"errors"
	"math/rand"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// RFC 1994's response is MD5(id || secret || challenge), checked against
// crypto/md5 over the concatenation (the pdu package's golden test checks
// it against libiscsi's real CHAP_R values).
func TestResponse(t *testing.T) {
	id, secret, c := byte(7), []byte("secretsecret"), []byte{1, 2, 3, 4}
	want := md5.Sum(append(append([]byte{id}, secret...), c...))
	if got := Response(id, secret, c); got != want {
		t.Fatalf("%x != %x", got, want)
	}
	if !Check(id, secret, c, want[:]) || Check(id+1, secret, c, want[:]) || Check(id, secret, c, want[:15]) {
		t.Error("Check")
	}
}

func TestDecodeBinary(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []byte
	}{
		{"0x0102ff", []byte{1, 2, 0xff}},
		{"0XAbCd", []byte{0xab, 0xcd}},
		{"0x102", []byte{1, 2}}, // odd digit count: implied leading zero
		{"0bAQL/", []byte{1, 2, 0xff}},
	} {
		got, err := DecodeBinary(c.in, 16)
		if err != nil || !bytes.Equal(got, c.want) {
			t.Errorf("%q: %x %v", c.in, got, err)
		}
	}
	for _, in := range []string{"", "0x", "1234", "0xzz", "0b!!", "0q12", "0x" + strings.Repeat("00", 17), "0b" + strings.Repeat("AAAA", 6), "0B\r\r", "0b\nAQI="} {
		if _, err := DecodeBinary(in, 16); !errors.Is(err, ErrFormat) {
			t.Errorf("%q accepted (%v)", in, err)
		}
	}
}

func lookup(name string) ([]byte, bool) {
	return []byte("initiator-secret"), name == "alice"
}

// One-way and mutual exchanges end to end, target and initiator sides.
func TestExchange(t *testing.T) {
	rnd := rand.New(rand.NewSource(1))
	ch, out, err := Begin("7,5", rnd)
	if err != nil || out[0].Value != "5" {
		t.Fatalf("Begin: %v %v", out, err)
	}
	targetKeys := map[string]string{}
	for _, p := range out {
		targetKeys[p.Key] = p.Value
	}
	mutual := Challenge{ID: 9, Value: []byte("initiator-challenge")}
	ans, err := Answer(targetKeys, "alice", []byte("initiator-secret"), &mutual)
	if err != nil {
		t.Fatal(err)
	}
	offers := map[string]string{}
	for _, p := range ans {
		offers[p.Key] = p.Value
	}
	sec := Secrets{Lookup: lookup, TargetName: "tgt", TargetSecret: []byte("target-secret-x")}
	var cache Cache
	resp, err := Verify(ch, offers, sec, &cache)
	if err != nil {
		t.Fatal(err)
	}
	back := map[string]string{}
	for _, p := range resp {
		back[p.Key] = p.Value
	}
	if err := CheckTarget(mutual, back, "tgt", []byte("target-secret-x")); err != nil {
		t.Fatal(err)
	}
	if err := CheckTarget(mutual, back, "tgt", []byte("target-secret-y")); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("wrong target secret: %v", err)
	}
	// The same initiator challenge again is refused (reuse).
	if _, err := Verify(ch, offers, sec, &cache); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("reused challenge: %v", err)
	}
	// Reflection: the initiator sends the target's own challenge back.
	refl := map[string]string{"CHAP_N": offers["CHAP_N"], "CHAP_R": offers["CHAP_R"], "CHAP_I": "1", "CHAP_C": EncodeBinary(ch.Value)}
	if _, err := Verify(ch, refl, sec, nil); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("reflected challenge: %v", err)
	}
	// Identical secrets both ways.
	same := sec
	same.TargetSecret = []byte("initiator-secret")
	if _, err := Verify(ch, offers, same, nil); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("identical secrets: %v", err)
	}
	// Wrong secret, unknown name, missing keys.
	bad := map[string]string{"CHAP_N": "alice", "CHAP_R": EncodeBinary(make([]byte, 16))}
	if _, err := Verify(ch, bad, sec, nil); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("wrong response: %v", err)
	}
	bad["CHAP_N"] = "mallory"
	if _, err := Verify(ch, bad, sec, nil); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("unknown name: %v", err)
	}
	if _, err := Verify(ch, map[string]string{"CHAP_N": "alice"}, sec, nil); !errors.Is(err, ErrFormat) {
		t.Errorf("missing CHAP_R: %v", err)
	}
	// One-way: no CHAP_I/CHAP_C, no answer.
	oneway := map[string]string{"CHAP_N": offers["CHAP_N"], "CHAP_R": offers["CHAP_R"]}
	if r, err := Verify(ch, oneway, Secrets{Lookup: lookup}, nil); err != nil || r != nil {
		t.Errorf("one-way: %v %v", r, err)
	}
	// Mutual asked but not configured.
	if _, err := Verify(ch, map[string]string{"CHAP_N": offers["CHAP_N"], "CHAP_R": offers["CHAP_R"], "CHAP_I": "3", "CHAP_C": "0x0101"},
		Secrets{Lookup: lookup}, nil); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("unconfigured mutual: %v", err)
	}
}

func TestBeginRejectsNonMD5(t *testing.T) {
	_, out, err := Begin("7,6", rand.New(rand.NewSource(1)))
	if !errors.Is(err, ErrAuthFailed) || len(out) != 1 || out[0] != (text.Pair{Key: "CHAP_A", Value: text.Reject}) {
		t.Errorf("%v %v", out, err)
	}
}

func TestParseID(t *testing.T) {
	for in, want := range map[string]int{"0": 0, "255": 255, "0xff": 255, "256": -1, "-1": -1, "": -1, "x": -1} {
		got, err := ParseID(in)
		if (err != nil) != (want < 0) || (want >= 0 && int(got) != want) {
			t.Errorf("%q: %d %v", in, got, err)
		}
	}
}

func TestCheckSecrets(t *testing.T) {
	if err := CheckSecrets([]byte("short"), nil); !errors.Is(err, ErrSecret) {
		t.Errorf("short: %v", err)
	}
	if err := CheckSecrets([]byte("long-enough-1"), nil); err != nil {
		t.Errorf("one-way: %v", err)
	}
	if err := CheckSecrets([]byte("long-enough-1"), []byte("long-enough-1")); !errors.Is(err, ErrSecret) {
		t.Errorf("identical: %v", err)
	}
	if err := CheckSecrets([]byte("long-enough-1"), []byte("long-enough-2")); err != nil {
		t.Errorf("distinct: %v", err)
	}
}

func TestCacheBounded(t *testing.T) {
	c := Cache{Max: 4}
	for i := 0; i < 10; i++ {
		if !c.Add([]byte{byte(i)}) {
			t.Fatalf("%d not new", i)
		}
	}
	if len(c.seen) != 4 || len(c.ring) != 4 {
		t.Errorf("cache holds %d/%d", len(c.seen), len(c.ring))
	}
	if c.Add([]byte{9}) || !c.Add([]byte{0}) {
		t.Error("recent kept, oldest forgotten")
	}
}
