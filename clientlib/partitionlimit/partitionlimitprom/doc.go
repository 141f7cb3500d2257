// Package partitionlimitprom exports a partitionlimit.Limiter's Stats as
// Prometheus metrics (tollgate_client_partition_limit_*). It is separate from
// package partitionlimit so that clients which do not use Prometheus do not
// link it:
//
//	reg.MustRegister(partitionlimitprom.NewCollector(limiter))
package partitionlimitprom
