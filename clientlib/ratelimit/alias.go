package ratelimit

import "github.com/tollgate-io/tollgate/ratelease"

// The types and functions of package ratelease, under this package's names.
type (
	Strategy      = ratelease.Strategy
	Config        = ratelease.Config
	Client        = ratelease.Client
	LimiterConfig = ratelease.LimiterConfig
	Limiter       = ratelease.Limiter
	Handle        = ratelease.Handle
	ReportState   = ratelease.ReportState
	Stats         = ratelease.Stats
	TenantStats   = ratelease.TenantStats
)

// Strategies; see ratelease.
const (
	Lease     = ratelease.Lease
	Blocklist = ratelease.Blocklist
	Local     = ratelease.Local
)

var (
	// New starts a client (ratelease.New).
	New = ratelease.New
	// NewLimiter returns a transport-free core (ratelease.NewLimiter).
	NewLimiter = ratelease.NewLimiter
	// NewReportState starts a report stream's state (ratelease.NewReportState).
	NewReportState = ratelease.NewReportState
	// ParseStrategy reads "lease", "blocklist" or "local".
	ParseStrategy = ratelease.ParseStrategy
)
