package iscsifront

import (
	"strings"
	"testing"
	"time"
)

// TestNopWarning: the defaults are safe; disabled pings and timers above
// the failover bound are warned about.
func TestNopWarning(t *testing.T) {
	for _, c := range []struct {
		iv, to time.Duration
		want   string
	}{
		{0, 0, ""},
		{time.Second, time.Second, ""},
		{-1, 0, "never closed"},
		{2 * time.Second, 0, "above 2.5s"},
		{5 * time.Second, 15 * time.Second, "above 2.5s"},
	} {
		got := nopWarning(c.iv, c.to)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("nopWarning(%v, %v) = %q, want %q", c.iv, c.to, got, c.want)
		}
	}
}
