package config

import "testing"

// A config file's cache mode is case-insensitive and Validate stores the
// canonical spelling, so the daemon's comparison with a volume's metadata
// ("writeback") sees no change.
func TestCacheModeCaseInsensitive(t *testing.T) {
	c, err := Parse([]byte("volumes:\n  - name: vm1\n    size: 1G\n    cache: WriteBack\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Volumes[0].Cache != "writeback" {
		t.Fatalf("cache %q, want writeback", c.Volumes[0].Cache)
	}
}
