// Package access decides who may use a node and how much of it one client
// may hold: credentials, the rule table, authentication (of clients and of
// nodes) and the resource bounds. Read this first.
//
// # Principle
//
// Nothing before authentication. A gRPC call is authenticated from its
// headers by Guard.Tap before gRPC reads a message; an HTTP request by
// Guard.Route after the mux matched it and before its handler reads the
// body. A caller without the credential a method needs never makes the node
// allocate for, read or decode what it sends. Header sizes, connection
// counts and handshake times are bounded below that (Bounds), since they
// are spent before any check can run.
//
// One parse, one decision. The rule table (rules.go) names, for every gRPC
// method and HTTP route, the scope it needs and where its tenants are. The
// tenants in a path, a query or a unary request are checked here, on the
// values the handler reads; tenants inside a body or a stream are the
// handler's to check, on the document it parsed (Rule.InHandler, package
// tenantscope), never by a second parser here that could read it
// differently. A method or route without a rule is refused while
// credentials are configured, and the endpoint test fails until it has one.
//
// Node credentials are HMACs under the cluster key, never the admin token.
// Nodes calling each other sign each call (nodeport.Keys) with a key
// derived from the gossip keyring (ClusterKeys); a call forwarded for a
// caller names the caller's principal and is judged as that caller, never
// with the node's rights. The admin token is an operator's credential: a
// node never sends it.
//
// # Who owns what
//
//   - credentials.go: the credentials file (token hashes and certificate
//     identities → scopes and tenants), the Store that holds it, reloads it
//     and ends the streams of a revoked credential.
//   - rules.go: the rule table, one line per endpoint.
//   - admin.go: the admin rule (admin token, or loopback only without one)
//     for nodes without a credentials file and for handlers that apply it
//     themselves.
//   - guard.go: Guard, the check itself: the gRPC tap handler and
//     interceptors, the HTTP route guard, the caller's identity in the
//     context (ClientOf, IsNodeCall).
//   - nodeauth.go: node credentials: the cluster keys, verifying a node's
//     call, answering a peer's challenge.
//   - bounds.go, grpccap.go: what one client may hold (Bounds): connection
//     caps with eviction of the quietest, watch-stream counts per node and
//     per client, and the slow-reader timeout.
//
// The server builds one Guard, one GRPCCap, one ConnCap and one
// StreamBounds and registers them (server/access.go, grpc.go, http.go);
// which gossip members proved they are nodes stays with the server's
// cluster view (server/nodeauth.go).
//
// # Cost
//
// A token check is one SHA-256 and a map lookup (the admin token: a
// constant-time compare); a node credential one HMAC-SHA256. The rule
// table is a map lookup per call. The stream bounds take one mutex per
// stream open and close; the slow-reader guard one goroutine and a timer
// per message sent on a watch stream; the connection caps one mutex per
// accept and per call begin and end.
package access
