// Package sampling is the backlog controller: it turns backlog sizes that
// clients report (through ReportBacklog, or POST /api/v1/backlog served by
// Handler) into the global sample percentage of one kind of traffic, so that
// a backend falling behind sheds observations instead of running out of memory
// (Ichnaea's rate control, made automatic).
//
// Each period the controller sums the latest fresh report of every source and
// computes a proportional (optionally proportional-integral) output,
//
//	e      = (target − backlog) / target        // > 0: room left, < 0: too much
//	I     += ki × 100 × e                       // per period; see anti-windup
//	output = clamp(max_percent + kp × 100 × e + I, min_percent, max_percent)
//
// so an empty backlog keeps max_percent (100% by default) and a backlog of
// twice the target with kp = 1 asks for 100 percentage points less. The error
// is relative to the target, so the same gains work for a target of 1,000 or
// of 10,000,000; for a backlog that grows by arrivals × output − service per
// period, kp × arrivals ÷ target ≤ 1 (arrivals per period at 100%) keeps a
// proportional controller from overshooting, and the BENCHMARKS.md table shows
// a PI setting that settles without oscillation.
//
// Anti-windup: the integral only moves the output down from max_percent, so it
// is kept in [min_percent − max_percent, 0], and it does not integrate while
// the output is pinned at a bound and the error pushes further into it.
// Without fresh reports (none newer than stale_after) the controller holds its
// output and does not integrate.
//
// Invalid parameters (a NaN or negative gain, both gains 0, a zero period, a
// target ≤ 0, min_percent > max_percent, an unknown kind name …) disable the
// controller: it still records reports, but never changes the output, and
// Status().Reason says why, for `tollgate status` and the logs.
//
// Controller is pure: no goroutines except in Run, no I/O, time passed in.
// Owner is the controller on a node (owner.go): built from the node's
// nodeport.Port, it runs the controller while the node leads the runtime
// config's order group, writes the output as the global sample rate of the
// kind through the replicated config, and forwards reports to the owner.
package sampling
