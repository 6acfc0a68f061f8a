//go:build race

package server

// sync.Pool drops items at random under the race detector.
const raceEnabled = true
