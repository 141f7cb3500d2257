// Package nodeid is a data dir's identity file, identity.json: the node id
// the data dir was created for, the cluster it belongs to, and an
// incarnation (a random id created with the data dir, so a node whose disk
// was replaced comes back as a new incarnation of the same node id).
//
// The file is JSON, written atomically and durably (temp file, fsync,
// rename, fsync of the directory), and read strictly: a corrupt file, an
// unknown version, an invalid id, or a data dir of another node is an error
// naming the file and what to do, never a silent new identity.
package nodeid
