package metrics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/version"
)

func TestBuildInfo(t *testing.T) {
	old := version.Version
	version.Version = "v9.8.7-test"
	defer func() { version.Version = old }()
	out := scrape(t, fakeSource{})
	i := version.Get()
	want := fmt.Sprintf(`vmsan_build_info{goversion=%q,revision=%q,version="v9.8.7-test"} 1`, i.GoVersion, i.Revision)
	if !strings.Contains(out, want) {
		t.Fatalf("scrape lacks %s:\n%s", want, out)
	}
}
