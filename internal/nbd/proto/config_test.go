package proto_test

import (
	"testing"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// config repeats the NBD default payload limit rather than importing this
// package (config imports no front end): the copy must stay equal.
func TestConfigDefaultMaxPayloadIsTheSpecs(t *testing.T) {
	if config.DefaultMaxPayload != proto.DefaultMaxPayload {
		t.Fatalf("config.DefaultMaxPayload = %d, nbd/proto.DefaultMaxPayload = %d", config.DefaultMaxPayload, proto.DefaultMaxPayload)
	}
}
