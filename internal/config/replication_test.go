package config

import (
	"strings"
	"testing"
	"time"
)

func TestReplicationParse(t *testing.T) {
	c, err := Parse([]byte(`
volumes:
  - name: vm1
    size: 1G
    replication:
      listen: 10.0.0.1:7789
      peer: 10.0.0.2:7789
      role: primary
      protocol: A
      ping_interval: 500ms
      ping_timeout: 3s
      ko_timeout: 7s
      resync_rate: 100M
      resync_min_rate: 10M
      split_brain_policy: discard-younger-primary
      checksum_resync: true
      shared_secret: "sixteen+bytes-secret"
      accept_from: [10.0.0.2, 10.1.0.0/16]
  - name: vm2
    size: 1G
    replication: {listen: "[::1]:7790", peer: "[::1]:7791", insecure: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := *c.Volumes[0].Replication
	if r.Listen != "10.0.0.1:7789" || r.Peer != "10.0.0.2:7789" || r.Role != "primary" || r.Protocol != "A" ||
		time.Duration(r.PingInterval) != 500*time.Millisecond || time.Duration(r.PingTimeout) != 3*time.Second ||
		time.Duration(r.KoTimeout) != 7*time.Second || r.ResyncRate != 100<<20 || r.ResyncMinRate != 10<<20 ||
		r.SplitBrain != "discard-younger-primary" || !r.Checksum {
		t.Fatalf("parsed %+v", r)
	}
	d := c.Volumes[1].Replication.Settings().WithDefaults()
	if d.Role != "secondary" || d.Protocol != "C" || d.Dial != "auto" || d.SplitBrain != "disconnect" ||
		time.Duration(d.PingInterval) != time.Second || time.Duration(d.PingTimeout) != 6*time.Second ||
		time.Duration(d.KoTimeout) != 10*time.Second {
		t.Fatalf("defaults %+v", d)
	}
	if s := c.Volumes[0].Replication.Settings(); s.Protocol != "A" || time.Duration(s.PingTimeout) != 3*time.Second || s.ResyncMinRate != 10<<20 {
		t.Fatalf("converted %+v", s)
	}
	if s := c.Volumes[0].Replication.Settings(); s.SharedSecret != "sixteen+bytes-secret" || len(s.AcceptFrom) != 2 || !c.Volumes[1].Replication.Settings().Insecure {
		t.Fatalf("authentication settings %+v", s)
	}
	// The inline secret is never printed (serve --print-config).
	if b, err := c.Marshal(); err != nil || strings.Contains(string(b), "sixteen+bytes-secret") || !strings.Contains(string(b), "shared_secret: '"+Masked+"'") {
		t.Fatalf("print-config shows the secret or drops the key: %v\n%s", err, b)
	}
	if c.Volumes[1].Replication.Protocol != "" {
		t.Fatal("defaults must not be written back into the parsed config")
	}
}

// Every bad value is reported, with the volume and key, in one error.
func TestReplicationValidate(t *testing.T) {
	cases := []struct{ repl, want string }{
		{`{peer: 10.0.0.2:7789}`, "replication.listen: required"},
		{`{listen: 10.0.0.1:7789}`, "replication.peer: required"},
		{`{listen: 10.0.0.1, peer: 10.0.0.2:7789}`, `replication.listen "10.0.0.1": want HOST:PORT`},
		{`{listen: 10.0.0.1:0, peer: 10.0.0.2:7789}`, `port "0": want 1..65535`},
		{`{listen: 10.0.0.1:7789, peer: "10.0.0.2:http"}`, `port "http"`},
		{`{listen: 10.0.0.1:7789, peer: 10.0.0.1:7789}`, "must differ from listen"},
		{`{listen: a:1, peer: b:2, protocol: D}`, `protocol "D": want A, B or C`},
		{`{listen: a:1, peer: b:2, role: master}`, `role "master": want primary or secondary`},
		{`{listen: a:1, peer: b:2, dial: maybe}`, `dial "maybe"`},
		{`{listen: a:1, peer: b:2, split_brain_policy: discard-everything}`, `split_brain_policy "discard-everything"`},
		{`{listen: a:1, peer: b:2, ping_interval: 1s, ping_timeout: 1s}`, "ping_timeout 1s: want more than ping_interval"},
		{`{listen: a:1, peer: b:2, ping_interval: 1ms}`, "ping_interval 1ms"},
		{`{listen: a:1, peer: b:2, ko_timeout: 2h}`, "ko_timeout 2h0m0s"},
		{`{listen: a:1, peer: b:2, resync_min_rate: 10M}`, "resync_min_rate"},
		{`{listen: a:1, peer: b:2, resync_rate: 10M, resync_min_rate: 20M}`, "resync_min_rate"},
		// Peer authentication: a secret (or insecure) is required, with
		// the key to set in the message; a short secret never appears in it.
		{`{listen: a:1, peer: b:2}`, "replication.shared_secret_file: no shared secret configured"},
		{`{listen: a:1, peer: b:2, shared_secret: short-secret}`, "shared_secret: 12 bytes, want 16 to 1024"},
		{`{listen: a:1, peer: b:2, shared_secret: sixteen+bytes-secret, shared_secret_file: /x}`, "set at most one of shared_secret and shared_secret_file"},
		{`{listen: a:1, peer: b:2, shared_secret: sixteen+bytes-secret, insecure: true}`, "insecure: set together with a shared secret"},
		{`{listen: a:1, peer: b:2, insecure: true, accept_from: [10.0.0.300]}`, `accept_from "10.0.0.300": want an IP address or a CIDR prefix`},
	}
	for _, c := range cases {
		_, err := Parse([]byte("volumes:\n  - name: vm1\n    size: 1G\n    replication: " + c.repl + "\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "(vm1)") || strings.Contains(err.Error(), "short-secret") {
			t.Errorf("%s: got %v, want an error with %q", c.repl, err, c.want)
		}
	}
	// Unknown keys are errors like everywhere else in the file.
	if _, err := Parse([]byte("volumes:\n  - name: vm1\n    size: 1G\n    replication: {listen: a:1, peer: b:2, protocl: A}\n")); err == nil || !strings.Contains(err.Error(), "protocl") {
		t.Errorf("typo in a replication key: %v", err)
	}
	// Two volumes may listen on one address (one listener per node, the
	// volumes multiplexed by the hello).
	if _, err := Parse([]byte(`
volumes:
  - {name: a, size: 1G, replication: {listen: "h:1", peer: "p:1", insecure: true}}
  - {name: b, size: 1G, replication: {listen: "h:1", peer: "p:1", insecure: true}}
`)); err != nil {
		t.Errorf("shared listen address: %v", err)
	}
}
