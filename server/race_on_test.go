//go:build race

package server

// raceEnabled: the race detector multiplies memory use, so heap bounds
// measured by tests only hold without it.
const raceEnabled = true
