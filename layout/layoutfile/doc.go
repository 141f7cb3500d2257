// Package layoutfile keeps the layout a node's data dir was created with
// (cluster.json: partitions, groups, shards): written once when the data
// dir is new, checked at every start, so that a node never reads its data
// with a layout other than the one it was written with.
//
// The file is JSON, e.g. {"partitions": 64, "groups": 4, "shards": 16}.
// Its group count is the base of the layout's arithmetic (layout.GroupSpan)
// and never changes, even after the cluster raised its group count online
// (docs/online-groups.md): the raised count lives in the replicated layout
// table, and the raft groups a data dir holds are listed by raftnode.
package layoutfile
