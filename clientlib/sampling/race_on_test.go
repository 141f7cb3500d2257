//go:build race

package sampling

// raceEnabled shortens the 1e6-decision fraction tests under the race
// detector (10× slower), which `make test` runs on top of the plain run that
// checks every combination.
const raceEnabled = true
