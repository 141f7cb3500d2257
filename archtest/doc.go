// Package archtest holds the architecture tests: the rules about which
// package may depend on which, and how the packages line up, checked
// against the module as it is (go list, the directory tree). It has no
// code of its own; a newcomer reads its tests to learn the house rules,
// and a change that breaks one of them fails here, naming the rule.
//
// The rules:
//   - the state machine, the backup format, layout and limits link no gRPC
//     or protobuf (TestStateLinksNoRPC);
//   - no server-side package links the client library or the gateway
//     (TestServerSideImportsNoClientlib);
//   - a capability has one name: fsm/<name>, service/<name>,
//     clientlib/<name> (TestCapabilityPackagesLineUp);
//   - server is the top of the node: access, cluster and clockbound, which it wires,
//     never import it, and no package imports it except the binary
//     (cmd/...) and test harnesses (TestNothingImportsServer);
//   - server/ stays a room for wiring: at most 7,000 lines of non-test Go
//     (TestServerSize);
//   - a runtime-config key is spelled once, as a limits.Key* constant:
//     no non-test file outside limits spells one (TestKeysSpelledOnce).
package archtest
