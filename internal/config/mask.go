package config

import (
	"strings"

	"gopkg.in/yaml.v3"
)

// Masked is what MarshalMasked prints instead of a secret.
const Masked = "********"

// secretWords are the last words of configuration keys that hold a
// secret in clear: "secret", "mutual_secret", a replication
// "shared_secret", a "password". Matching on the key's name, not on a
// list of fields, masks secrets added later without anyone remembering
// to list them. Keys that name where a secret is ("secret_file") end in
// another word and are shown.
var secretWords = map[string]bool{"secret": true, "password": true, "passphrase": true, "token": true, "psk": true}

// IsSecretKey reports whether a configuration key (a YAML mapping key,
// such as "mutual_secret") holds a secret.
func IsSecretKey(key string) bool {
	k := strings.ToLower(key)
	if i := strings.LastIndexAny(k, "_-."); i >= 0 {
		k = k[i+1:]
	}
	return secretWords[k]
}

// MarshalMasked is Marshal with every secret (IsSecretKey) replaced by
// Masked: what `vmsan serve --print-config` prints, which ends up in
// terminals, tickets and logs.
func (c *Config) MarshalMasked() ([]byte, error) {
	var n yaml.Node
	if err := n.Encode(c); err != nil {
		return nil, err
	}
	maskNode(&n)
	return yaml.Marshal(&n)
}

func maskNode(n *yaml.Node) {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if IsSecretKey(k.Value) && v.Kind == yaml.ScalarNode && v.Value != "" {
				v.Value, v.Tag, v.Style = Masked, "!!str", 0
				continue
			}
			maskNode(v)
		}
		return
	}
	for _, c := range n.Content {
		maskNode(c)
	}
}
