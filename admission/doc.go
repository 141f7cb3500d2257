// Package admission is the leader path of one raft group: it decides which series
// hashes of a TrackSeries request are accepted and answers only after the entry
// recording them has committed.
//
// The decision itself (Decide) is a pure function of the request's hashes, their
// states in the committed FSM, the hashes logged but not yet applied (Pending) and
// each tenant's budget, so it is tested from tables without goroutines, raft or
// clocks. Around it, a Tracker runs one session per leadership term: it batches
// requests, asks Decide, reserves the accepted new series in the FSM, appends one
// log entry per batch through the Log interface and answers in log order after
// commit. Committed state is read through State (satisfied by *fsm.FSM) and the
// log is reached through Log (RaftLog adapts *raft.Raft), so the failure paths can
// be driven by a scripted log in tests. Further admission rules plug in as Checks.
//
// Promises kept here: a reply only after commit; an active series accepted once is
// never rejected while active (refreshes never count against a limit and never
// reach a Check); the count against a tenant's share is exact (active plus this
// leader's reservations, see fsm.Tenant).
package admission
