package backend

import "testing"

// Cache modes are case-insensitive (users type QEMU's "writeback" as
// "WriteBack" too) and come back in canonical lower case.
func TestParseCacheModeCaseInsensitive(t *testing.T) {
	for in, want := range map[string]CacheMode{
		"none": CacheNone, "NONE": CacheNone, "WriteBack": CacheWriteback, " writethrough ": CacheWritethrough,
		"Unsafe": CacheUnsafe, "": CacheWriteback,
	} {
		got, err := ParseCacheMode(in)
		if err != nil || got != want {
			t.Errorf("ParseCacheMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseCacheMode("write-back"); err == nil {
		t.Error("write-back: want an error")
	}
}
