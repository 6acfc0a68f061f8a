package volume

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseSize: never panics; an accepted size is non-negative and
// survives a FormatSize round trip.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"20G", "512M", "1T", "4096", "1GiB", "1GB", "1.5G", "", "-1", "99999999999999999999E", "0.0000001K", "1e9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
		back, err := ParseSize(FormatSize(n))
		if err != nil || back != n {
			t.Fatalf("round trip %q -> %d -> %q -> %d, %v", s, n, FormatSize(n), back, err)
		}
	})
}

// FuzzValidateName: an accepted name is a single, non-hidden path element
// that stays inside the volumes directory.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"default", "../x", "a/b", ".", "..", "x.raw", "a..b", strings.Repeat("a", 65)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateName(s) != nil {
			return
		}
		p := filepath.Join("/data/volumes", s+rawExt)
		if filepath.Dir(p) != "/data/volumes" || filepath.Base(p) != s+rawExt || strings.HasPrefix(s, ".") || len(s) > MaxNameLen {
			t.Fatalf("accepted unsafe name %q", s)
		}
	})
}
