package partitionlimit

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrLimitExceeded is wrapped by every *LimitError.
var ErrLimitExceeded = errors.New("per-partition series limit exceeded")

// ErrInvalidRequest is wrapped by the errors of a malformed Check (bad tenant
// id, partition out of range).
var ErrInvalidRequest = errors.New("invalid partition-limit request")

// LimitError rejects a whole request: after it, the estimated distinct series
// of Tenant in Partition over the window would exceed Limit. Nothing of the
// request was recorded. It is the 429 of an HTTP front end; GRPCStatus makes it
// ResourceExhausted.
type LimitError struct {
	Tenant    string
	Partition int32
	Limit     int64
	Estimate  uint64
	Window    int // minutes
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("tenant %q: partition %d would hold ~%d distinct series over the last %d minutes, above its max_series_per_partition of %d; the whole request was rejected (raise max_series_per_partition or spread series over more partitions)",
		e.Tenant, e.Partition, e.Estimate, e.Window, e.Limit)
}

// Unwrap lets errors.Is(err, ErrLimitExceeded) match.
func (e *LimitError) Unwrap() error { return ErrLimitExceeded }

// GRPCStatus maps the rejection to ResourceExhausted for gRPC front ends.
func (e *LimitError) GRPCStatus() *status.Status {
	return status.New(codes.ResourceExhausted, e.Error())
}
