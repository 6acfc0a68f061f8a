package version

import (
	"runtime/debug"
	"testing"
)

func TestGet(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	read := func() (*debug.BuildInfo, bool) { return bi, true }
	i := get("", "", read)
	if i.Version != "devel-0123456789ab-dirty" || i.GoVersion != "go1.99" || i.Revision != "0123456789abcdef0123" || i.Time != "2026-01-02T03:04:05Z" || !i.Modified {
		t.Fatalf("devel build: %+v", i)
	}
	// The Makefile's -X override wins over the build info.
	if i := get("v1.2.3-4-gabc", "feed", read); i.Version != "v1.2.3-4-gabc" || i.Revision != "feed" {
		t.Fatalf("override: %+v", i)
	}
	// `go install module@v1.0.0`: the module version.
	bi.Main.Version = "v1.0.0"
	if i := get("", "", read); i.Version != "v1.0.0" {
		t.Fatalf("module version: %+v", i)
	}
	// No build info at all (stripped): still a non-empty version.
	if i := get("", "", func() (*debug.BuildInfo, bool) { return nil, false }); i.Version != "devel" || i.GoVersion == "" {
		t.Fatalf("no build info: %+v", i)
	}
}
