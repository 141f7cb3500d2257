package sampling

import "syscall"

// threadCPU returns the calling thread's CPU time (user + system) in ns, so a
// benchmark can report CPU per operation next to wall time: on a shared,
// overloaded machine wall time mostly measures waiting for a core.
func threadCPU() (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
