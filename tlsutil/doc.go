// Package tlsutil turns certificate, key and CA files into *tls.Config values
// for the Tollgate server (gRPC and HTTP listeners, the raft transport, node to
// node forwarding) and its clients, parses serf gossip keys, and creates a
// development PKI (`tollgate tls init`).
//
// It only reads files and builds configurations: the server and the clients
// receive ready *tls.Config values, so server/, raftnode/ and clientlib/ do not
// depend on this package. Every error names the file that caused it, so an
// operator with a wrong path or a truncated PEM file knows which one to fix.
//
// Certificates are read once, when a configuration is built. Rotating them
// means restarting the process (one node at a time, which a cluster tolerates).
package tlsutil
