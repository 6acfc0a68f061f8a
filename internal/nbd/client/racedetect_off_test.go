//go:build !race

package client

const raceDetector = false
