// Package sampleprom exports a sampling.Sampler's counters as Prometheus
// metrics (tollgate_client_sample_*). It is separate from package sampling so
// that clients which do not use Prometheus do not link it:
//
//	reg.MustRegister(sampleprom.NewCollector(sampler))
package sampleprom
