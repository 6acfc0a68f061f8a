//go:build race

package client

// raceDetector is true when tests run with -race, which defeats sync.Pool
// and so allocation bounds (added by the daemon/CI owner so `make test`,
// which runs this package with -race, passes).
const raceDetector = true
