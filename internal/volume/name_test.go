package volume

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	good := []string{"default", "vm1", "a", "A-b_c.d", "0", strings.Repeat("x", 64), "disk.img"}
	for _, n := range good {
		if err := ValidateName(n); err != nil {
			t.Errorf("ValidateName(%q) = %v, want ok", n, err)
		}
	}
	bad := []string{
		"", "..", ".", "../etc", "a/b", "/abs", "a..b", ".hidden", "-flag", "_x",
		strings.Repeat("x", 65), "sp ace", "tab\t", "nul\x00", "ünï", "a\\b",
		"x.raw", "x.json", "x.state", "q?x", "a%2f",
	}
	for _, n := range bad {
		err := ValidateName(n)
		if err == nil {
			t.Errorf("ValidateName(%q) = nil, want error", n)
			continue
		}
		if !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidateName(%q) error %v does not wrap ErrInvalidName", n, err)
		}
	}
}
