//go:build !race

package repl

const raceDetector = false
