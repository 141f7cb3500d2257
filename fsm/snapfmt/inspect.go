package snapfmt

import "io"

// Summary describes a snapshot without holding its series.
type Summary struct {
	Header       Header
	Bytes        int64                 // size of the snapshot file
	Blocks       int                   // shard blocks
	Sections     []SectionSummary      // section blocks (version 2), in file order
	Series       uint64                // total series
	TenantSeries []uint64              // series per tenant, indexed like Header.Tenants
	ShardSeries  []uint64              // series per shard, len Header.Shards
	Minutes      [MaxMinute + 1]uint64 // series per minute value
}

// Inspect reads and fully verifies a snapshot (every checksum and every field,
// exactly as a restore would), keeping only counts. Memory use is bounded by the
// largest block.
func Inspect(r io.Reader) (Summary, error) {
	var s Summary
	rd, err := NewReader(r)
	if err != nil {
		return s, err
	}
	s.Header = rd.Header()
	s.TenantSeries = make([]uint64, len(s.Header.Tenants))
	s.ShardSeries = make([]uint64, s.Header.Shards)
	for {
		shard, series, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			s.Bytes = rd.off
			return s, err
		}
		s.Blocks++
		for _, ts := range series {
			n := uint64(len(ts.Hashes))
			s.Series += n
			s.TenantSeries[ts.Tenant] += n
			s.ShardSeries[shard] += n
			for _, m := range ts.Minutes {
				s.Minutes[m]++
			}
		}
	}
	s.Bytes = rd.off
	for _, sec := range rd.Sections() {
		s.Sections = append(s.Sections, SectionSummary{Name: sec.Name, Bytes: len(sec.Payload)})
	}
	return s, nil
}

// SectionSummary names one section block and its payload size.
type SectionSummary struct {
	Name  string
	Bytes int
}
