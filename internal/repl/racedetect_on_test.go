//go:build race

package repl

// raceDetector is true when tests run with -race. The property test then
// runs fewer seeds: the Node is single-goroutine, so the detector finds
// nothing there and only makes it ~15x slower.
const raceDetector = true
