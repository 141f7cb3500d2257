// Package history records what fault-test clients did and checks the record
// for linearizability with porcupine (github.com/anishathalye/porcupine).
//
// A hand-written invariant catches what its author thought of; a history
// check catches any answer that no sequential execution could have given:
// stale reads, lost updates, effects seen out of order.
//
// Recording. A Recorder writes one JSON line per operation (see Op) to a file
// the test keeps with its node logs. Each operation carries its invocation
// and return times (nanoseconds on the recorder's monotonic clock), its input
// and its answer: ok, rejected (some hashes refused, or a compare-and-set
// that lost), error (the server refused before proposing: the operation
// certainly had no effect) or unknown (timeout, unavailable, connection lost:
// it may or may not have taken effect). Operations still in flight when the
// recorder closes are written as unknown. A Recorder is safe for concurrent
// use by many client goroutines.
//
// Models. Check runs a model over the operations of its kinds, partitioned by
// Op.Key so that each tenant or document is checked on its own and checking
// stays fast. When a history is illegal, Check returns an error naming the
// keys that fail and writes porcupine's HTML visualisation of those keys'
// operations to the path it is given (next to the history file).
//
//   - TrackingModel: per key (a tenant, or tenant/partition when the limit is
//     per partition) a set of active series and a limit. An answer is legal
//     if every hash already in the set is accepted, and the set never holds
//     more than the limit: a new hash is accepted only while the count is
//     below the limit at the operation's linearisation point. A rejected new
//     hash is always legal (a group's share may be smaller than the tenant's
//     limit). Idle expiry is not modelled: a history must be kept within the
//     idle timeout, so that no series it touched can expire while it runs.
//     The limit given to the model must be the highest the key has had
//     during the history.
//   - RuntimeConfigModel: one versioned document (key = document name) with
//     reads and compare-and-set. A read returns the current version and
//     value; a compare-and-set succeeds only on the current version and moves
//     it to a higher one; a lost compare-and-set saw another version.
//
// What a check does not prove: it sees only what the recorded clients did,
// so an effect no client observes (a series accepted by an unknown-outcome
// request and never sent again) cannot fail it; and the tracking model does
// not check that a request is rejected only when the limit forces it.
package history
