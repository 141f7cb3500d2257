package limits

// Effective is a tenant's limits after inheritance. Zero means "no limit"
// (MaxSeries 0: unlimited) or "off" (rates and per-partition limits).
type Effective struct {
	MaxSeries             int64
	MaxSeriesPerPartition int64
	IngestionRate         float64 // tokens per second
	IngestionBurst        int64
}

// Overrides are the keys one scope sets; nil inherits.
type Overrides struct {
	MaxSeries             *int64
	MaxSeriesPerPartition *int64
	IngestionRate         *float64
	IngestionBurst        *int64
}

// Over returns e with the keys o sets replaced.
func (o Overrides) Over(e Effective) Effective {
	if o.MaxSeries != nil {
		e.MaxSeries = *o.MaxSeries
	}
	if o.MaxSeriesPerPartition != nil {
		e.MaxSeriesPerPartition = *o.MaxSeriesPerPartition
	}
	if o.IngestionRate != nil {
		e.IngestionRate = *o.IngestionRate
	}
	if o.IngestionBurst != nil {
		e.IngestionBurst = *o.IngestionBurst
	}
	return e
}

// Resolve is the inheritance rule: the base (the server's flags), overlaid
// by each scope in order — the defaults, then the tenant's own — so a key a
// scope leaves out comes from the scope before it.
func Resolve(base Effective, scopes ...Overrides) Effective {
	for _, s := range scopes {
		base = s.Over(base)
	}
	return base
}

// Key names, as the YAML document, `tollgate limits set`, the patch entries
// of the replicated runtime config and the API spell them. Every other
// package names a key through these constants (archtest.TestKeysSpelledOnce): a key
// spelled twice can drift, and a replicated patch that names a key one
// replica spells differently applies differently there.
const (
	KeyMaxSeries             = "max_series"
	KeyMaxSeriesPerPartition = "max_series_per_partition"
	KeyIngestionRate         = "ingestion_rate"
	KeyIngestionBurst        = "ingestion_burst"
	// KeyUnlimited is a scope's shorthand for max_series 0 (YAML and
	// `limits set`); it is not stored.
	KeyUnlimited = "unlimited"
	// KeySampleRates is a scope's (and the global settings') per-kind sample
	// percentages: "sample_rates" in YAML, "sample_rates.<kind>" as a set key.
	KeySampleRates = "sample_rates"
)

// Keys lists the keys a scope sets, in the order documents list them
// (sample_rates.<kind> besides).
var Keys = []string{KeyMaxSeries, KeyMaxSeriesPerPartition, KeyIngestionRate, KeyIngestionBurst, KeyUnlimited}

// SampleRateKey is the set key of one kind's sample percentage:
// "sample_rates.<kind>".
func SampleRateKey(kind string) string { return KeySampleRates + "." + kind }
