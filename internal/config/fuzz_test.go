package config

import "testing"

// FuzzParse: arbitrary bytes never panic the config parser, and whatever it
// accepts passes validation.
func FuzzParse(f *testing.F) {
	f.Add([]byte("data_dir: /x\nlisten: [\"127.0.0.1:1\", \"unix:/s\"]\nvolumes:\n  - {name: a, size: 1G, cache: none}\n"))
	f.Add([]byte("engine: {workers: 2, max_merge: 1M, gather_delay: 1ms}\n"))
	f.Add([]byte("tls: {mode: required, cert: c, key: k}\n"))
	f.Add([]byte("volumes: [{name: a, size: [1]}]"))
	f.Add([]byte("&a [*a, *a]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that does not validate: %v", err)
		}
	})
}
