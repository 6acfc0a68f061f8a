package doctor

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestWrap(t *testing.T) {
	for _, c := range []struct {
		in    string
		width int
		want  []string
	}{
		{"", 10, nil},
		{"a b c", 10, []string{"a b c"}},
		{"aaaa bbbb cccc", 9, []string{"aaaa bbbb", "cccc"}},
		{"ab", 0, []string{"a", "b"}},
		{"x 0123456789abc y", 5, []string{"x", "01234", "56789", "abc y"}},
	} {
		got := wrap(c.in, c.width)
		if strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("wrap(%q, %d) = %q, want %q", c.in, c.width, got, c.want)
		}
	}
}

func TestWriteTableWidth(t *testing.T) {
	rs := []Result{
		{Check: "block.scheduler", Subject: "sda", Status: Warn, Evidence: strings.Repeat("evidence words ", 20), Fix: strings.Repeat("fix words ", 20)},
		{Check: "fs.type", Subject: "/var/lib/vmsan", Status: OK, Evidence: "ext2/3/4"},
		{Check: "fs.barrier", Subject: "/", Status: Fail, Evidence: "nobarrier", Fix: "mount -o remount,barrier /"},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, rs, 100); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > 100 {
			t.Errorf("line of %d runes > 100: %q", n, l)
		}
	}
	if !strings.HasPrefix(lines[0], "CHECK") || !strings.Contains(lines[0], "EVIDENCE") {
		t.Errorf("header %q", lines[0])
	}
	// Columns align: STATUS starts at the same offset on every first line.
	col := strings.Index(lines[0], "STATUS")
	for _, want := range []string{"warn", "ok", "fail"} {
		found := false
		for _, l := range lines[1:] {
			if len(l) > col+len(want) && l[col:col+len(want)] == want {
				found = true
			}
		}
		if !found {
			t.Errorf("no row with %q at column %d:\n%s", want, col, b.String())
		}
	}
	if last := lines[len(lines)-1]; last != "1 ok, 1 warn, 1 fail" {
		t.Errorf("summary %q", last)
	}
}

func TestWriteJSONShape(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJSON(&b, nil); err != nil || strings.TrimSpace(b.String()) != "[]" {
		t.Fatalf("empty: %q %v", b.String(), err)
	}
	b.Reset()
	WriteJSON(&b, []Result{{Check: "fs.type", Status: OK, Evidence: "xfs"}})
	var v []map[string]string
	if err := json.Unmarshal(b.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if len(v) != 1 || len(v[0]) != 5 || v[0]["subject"] != "" || v[0]["fix"] != "" || v[0]["status"] != "ok" {
		t.Fatalf("got %v", v)
	}
}

func TestParseMountinfo(t *testing.T) {
	m, ok := parseMountinfo(`36 35 98:0 /mnt1 /srv/vm\040disks rw,noatime master:1 shared:2 - ext4 /dev/sdb1 rw,nobarrier`)
	if !ok || m.Point != "/srv/vm disks" || m.FSType != "ext4" || m.Source != "/dev/sdb1" || m.Major != 98 || m.hasOption("nobarrier") == "" {
		t.Fatalf("got %+v %v", m, ok)
	}
	for _, bad := range []string{"", "1 2 3", "36 35 x:0 / / rw - ext4 /dev/a rw", "36 35 8:0 / / rw ext4 /dev/a rw"} {
		if _, ok := parseMountinfo(bad); ok {
			t.Errorf("parsed %q", bad)
		}
	}
	if unescapeMount(`a\0`) != `a\0` || unescapeMount(`\134x`) != `\x` {
		t.Error("unescape")
	}
}

func TestParseMultipath(t *testing.T) {
	root := parseMultipath(`
# comment "with quotes" {
devices {
	device {
		vendor "VMSAN"   # trailing
		hardware_handler "1 alua"
		features "1 queue_if_no_path" ! bang comment
	}
	device { vendor "OTHER"
	}
}
}}} stray braces are tolerated
blacklist {
`)
	ds := root.find("devices")
	if len(ds) != 1 {
		t.Fatalf("devices: %d", len(ds))
	}
	dev := ds[0].find("device")
	if len(dev) != 2 || dev[0].kv["vendor"] != "VMSAN" || dev[0].kv["hardware_handler"] != "1 alua" ||
		dev[0].kv["features"] != "1 queue_if_no_path" || dev[1].kv["vendor"] != "OTHER" {
		t.Fatalf("got %+v %+v", dev[0].kv, dev[1].kv)
	}
	if !vendorMatches("VMS.*") || !vendorMatches("VMSAN") || vendorMatches("EQLOGIC") || vendorMatches("(") {
		t.Error("vendorMatches")
	}
}

func TestParseIscsid(t *testing.T) {
	kv := parseIscsid("# c\nnode.session.timeo.replacement_timeout=10\n  node.conn[0].timeo.noop_out_interval = 3  \nbogus line\n")
	if kv[keyReplacement] != "10" || kv[keyNoopInterval] != "3" || len(kv) != 2 {
		t.Fatalf("got %v", kv)
	}
}
