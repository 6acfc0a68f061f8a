package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigErrorsInFileWords: bad files give errors with the file name,
// the line, the key as written, what was expected and, for a typo, the key
// meant; never a Go type name.
func TestConfigErrorsInFileWords(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "vmsan.yaml")
	for _, c := range []struct{ yaml, want string }{
		{"lisen: [\"127.0.0.1:10809\"]\n", `vmsan.yaml:1: unknown key "lisen" (did you mean "listen"?)`},
		{"tls:\n  mode: required\n  cret: /c.pem\n", `vmsan.yaml:3: unknown key "cret" in section "tls" (did you mean "cert"?)`},
		{"engine:\n  workres: 4\n", `vmsan.yaml:2: unknown key "workres" in section "engine" (did you mean "workers"?)`},
		{"volumes:\n  - name: vm1\n    size: 1G\n    replication:\n      peer: a:1\n      listne: b:2\n",
			`vmsan.yaml:6: unknown key "listne" in section "volumes.replication" (did you mean "listen"?)`},
		{"colour: blue\n", `vmsan.yaml:1: unknown key "colour" (valid keys: data_dir, engine, inflight_budget, iscsi, listen,`},
		{"log_level: info\n\n\n\n\n\nmax_payload: lots\n", `vmsan.yaml:7: "max_payload" must be a size like 32M or 20G, got "lots"`},
		{"engine: {workers: many}\n", `vmsan.yaml:1: "workers" must be a whole number, got "many"`},
		{"engine: {gather_delay: soon}\n", `vmsan.yaml:1: "gather_delay" must be a duration like 100us, 5ms or 2s, got "soon"`},
		{"pprof: maybe\n", `vmsan.yaml:1: "pprof" must be true or false, got "maybe"`},
		{"volumes:\n  - name: vm1\n    size: 1G\n    block_size: -512\n", `vmsan.yaml:4: "block_size" must be a whole number, 0 or more, got "-512"`},
		{"tls: required\n", `vmsan.yaml:1: "tls" must be a section of key: value lines, got "required"`},
		{"volumes: vm1\n", `vmsan.yaml:1: "volumes" must be a list (a list of "- name: ..." entries), got "vm1"`},
		{"data_dir: [a, b]\n", `vmsan.yaml:1: "data_dir" must be a single value (quote it if it contains : or #), got a list`},
	} {
		if err := os.WriteFile(p, []byte(c.yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(p)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error\n  %v\nwant it to contain\n  %s", c.yaml, err, c.want)
			continue
		}
		for _, jargon := range []string{"unmarshal", "!!", "int64", "uint32", "config.", "not found in type"} {
			if strings.Contains(err.Error(), jargon) {
				t.Errorf("%q: error %q speaks Go (%q)", c.yaml, err, jargon)
			}
		}
	}
	// Every problem is reported, not only the first.
	os.WriteFile(p, []byte("lisen: [x]\npprof: maybe\n"), 0o644)
	if _, err := Load(p); err == nil || strings.Count(err.Error(), "vmsan.yaml:") != 2 {
		t.Errorf("two problems, error: %v", err)
	}
	// Empty values keep the defaults, aliases work, good files still load.
	os.WriteFile(p, []byte("engine:\nsz: &s 1G\nvolumes:\n  - name: a\n    size: *s\n"), 0o644)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), `unknown key "sz"`) {
		t.Errorf("alias file: %v", err)
	}
	os.WriteFile(p, []byte("engine:\nvolumes:\n  - name: a\n    size: 1G\n    engine: {workers: 2, max_merge: 1M}\n"), 0o644)
	if _, err := Load(p); err != nil {
		t.Errorf("good file: %v", err)
	}
}

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		d    int
	}{{"lisen", "listen", 1}, {"listne", "listen", 1}, {"", "ab", 2}, {"kitten", "sitting", 3}} {
		if got := editDistance(c.a, c.b); got != c.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.d)
		}
	}
}
