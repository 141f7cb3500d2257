package backup

import (
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"slices"
	"strings"

	"github.com/tollgate-io/tollgate/fsm/snapfmt"
)

// Summary describes a backup without holding its data.
type Summary struct {
	Header  Header
	Bytes   int64          // bytes of the backup file read
	Groups  []GroupSummary // in group order
	Series  uint64         // series of all groups
	Tenants []TenantSeries // series per tenant over all groups, sorted by name
}

// GroupSummary describes one group's snapshot.
type GroupSummary struct {
	Group       int
	Index, Term uint64
	Bytes       int64          // size of the group's snapshot
	Series      uint64         // series in the group
	Tenants     []TenantSeries // series per tenant in the group, sorted by name
	// Snapshot is the snapfmt summary of the group's snapshot (its header,
	// series per shard and per minute value).
	Snapshot snapfmt.Summary
}

// TenantSeries is a tenant's series count.
type TenantSeries struct {
	Tenant string
	Series uint64
}

// Inspect reads and verifies a backup exactly as Read does (every checksum,
// every group snapshot fully decoded and matched against the layout), keeping
// only counts: memory use is bounded by the largest snapshot block, not by
// the file. On error the Summary holds what was read up to the failure.
func Inspect(r io.Reader) (Summary, error) {
	var s Summary
	rd, err := newReader(r)
	if err != nil {
		return s, err
	}
	s.Header = rd.h
	totals := map[string]uint64{}
	for {
		sec, err := rd.nextSection()
		if err == io.EOF {
			break
		}
		if err != nil {
			s.Bytes = rd.off
			return s, err
		}
		gs, err := rd.inspectData(&sec)
		if err != nil {
			s.Bytes = rd.off
			return s, err
		}
		s.Groups = append(s.Groups, gs)
		s.Series += gs.Series
		for _, t := range gs.Tenants {
			totals[t.Tenant] += t.Series
		}
	}
	s.Tenants = sortedTenants(totals)
	s.Bytes = rd.off
	return s, nil
}

// inspectData streams one section's data through snapfmt.Inspect and the
// data checksum. A checksum mismatch or truncation is reported in preference
// to the snapfmt error it may have caused.
func (rd *reader) inspectData(sec *section) (GroupSummary, error) {
	g := int(sec.group)
	gs := GroupSummary{Group: g, Index: sec.index, Term: sec.term, Bytes: int64(sec.dataLen)}
	cr := &checkReader{r: io.LimitReader(rd.r, int64(sec.dataLen)), h: crc32.New(castagnoli)}
	sum, serr := snapfmt.Inspect(cr)
	if cr.err == nil {
		_, _ = io.Copy(io.Discard, cr) // the rest of the data, if snapfmt stopped early
	}
	start := rd.off
	rd.off += cr.n
	switch {
	case cr.err != nil:
		return gs, fmt.Errorf("backup: reading group %d data at offset %d: %w", g, start, cr.err)
	case uint64(cr.n) < sec.dataLen:
		return gs, corruptf("group %d data at offset %d: truncated (%d of %d bytes): %w", g, start, cr.n, sec.dataLen, io.ErrUnexpectedEOF)
	case cr.h.Sum32() != sec.dataCRC:
		return gs, corruptf("group %d: snapshot data checksum mismatch (stored %08x, computed %08x)", g, sec.dataCRC, cr.h.Sum32())
	case serr != nil:
		return gs, fmt.Errorf("%w: group %d: snapshot data: %w", ErrCorrupt, g, serr)
	}
	if msg := checkSnapshot(&rd.h, g, sec.index, sec.term, &sum.Header); msg != "" {
		return gs, corruptf("group %d: %s", g, msg)
	}
	gs.Snapshot = sum
	gs.Series = sum.Series
	counts := make(map[string]uint64, len(sum.Header.Tenants))
	for i, name := range sum.Header.Tenants {
		counts[name] += sum.TenantSeries[i]
	}
	gs.Tenants = sortedTenants(counts)
	return gs, nil
}

func sortedTenants(m map[string]uint64) []TenantSeries {
	out := make([]TenantSeries, 0, len(m))
	for name, n := range m {
		out = append(out, TenantSeries{Tenant: name, Series: n})
	}
	slices.SortFunc(out, func(a, b TenantSeries) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out
}

// checkReader counts and checksums what it reads and records the first
// failure of the underlying reader other than io.EOF.
type checkReader struct {
	r   io.Reader
	h   hash.Hash32
	n   int64
	err error
}

func (c *checkReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.h.Write(p[:n])
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}
