package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// echoServer answers every connection by echoing what it reads.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends a line through addr and reports whether it came back
// within d.
func roundTrip(addr string, d time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return false
	}
	b := make([]byte, 5)
	_, err = io.ReadFull(c, b)
	return err == nil && string(b) == "ping\n"
}

func get(t *testing.T, h http.Handler, url string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", url, nil))
	return rec.Code, rec.Body.String()
}

// TestCutRestore: a path forwards, stops forwarding while cut (drop:
// connections refused; blackhole: nothing arrives), and forwards again
// once restored; the other path is untouched; bad requests are refused.
func TestCutRestore(t *testing.T) {
	target := echoServer(t)
	ps, err := newProxies([]string{"a=127.0.0.1:0=" + target, "b=127.0.0.1:0=" + target})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	a, b := ps.paths["a"].p.Addr(), ps.paths["b"].p.Addr()
	if !roundTrip(a, 5*time.Second) || !roundTrip(b, 5*time.Second) {
		t.Fatal("paths do not forward before any cut")
	}
	for _, how := range []string{"drop", "blackhole"} {
		if code, body := get(t, ps, "/cut?path=a&how="+how); code != 200 || !strings.Contains(body, "a cut ("+how) {
			t.Fatalf("cut %s: %d %q", how, code, body)
		}
		if code, _ := get(t, ps, "/cut?path=a&how="+how); code != http.StatusConflict {
			t.Errorf("second cut of a: %d, want 409", code)
		}
		if roundTrip(a, 300*time.Millisecond) {
			t.Errorf("%s: path a still forwards", how)
		}
		if !roundTrip(b, 5*time.Second) {
			t.Errorf("%s: path b stopped forwarding", how)
		}
		if code, _ := get(t, ps, "/restore?path=a"); code != 200 {
			t.Fatalf("restore: %d", code)
		}
		if !roundTrip(a, 5*time.Second) {
			t.Errorf("%s: path a does not forward after the restore", how)
		}
	}
	for url, want := range map[string]int{
		"/cut?path=zz&how=drop": http.StatusNotFound,
		"/cut?path=a&how=melt":  http.StatusBadRequest,
		"/restore?path=":        http.StatusNotFound,
		"/ready":                http.StatusOK,
	} {
		if code, _ := get(t, ps, url); code != want {
			t.Errorf("%s: %d, want %d", url, code, want)
		}
	}
	if _, err := newProxies([]string{"a=127.0.0.1:0"}); err == nil {
		t.Error("a spec without a target was accepted")
	}
}
