package ratelease

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the client's counters for Prometheus. Decisions are
// counted with plain atomics in Allow and read here at scrape time, so the hot
// path pays no label lookup.
func (c *Client) Collector() prometheus.Collector { return &collector{c: c} }

var (
	descDecisions = prometheus.NewDesc("tollgate_ratelimit_client_decisions_total",
		"Allow decisions (requests) by tenant, decision (allowed|blocked) and reason.", []string{"tenant", "decision", "reason"}, nil)
	descTokens = prometheus.NewDesc("tollgate_ratelimit_client_tokens_total",
		"Tokens offered to Allow and admitted, by tenant.", []string{"tenant", "decision"}, nil)
	descReportLag = prometheus.NewDesc("tollgate_ratelimit_client_report_lag_seconds",
		"Longest time since a report was sent on an owner stream.", nil, nil)
	descUpdateAge = prometheus.NewDesc("tollgate_ratelimit_client_update_age_seconds",
		"Longest time since an owner stream delivered an update.", nil, nil)
	descBlocklist = prometheus.NewDesc("tollgate_ratelimit_client_blocklist_size",
		"Tenants blocked now (Blocklist strategy).", nil, nil)
	descFailingOpen = prometheus.NewDesc("tollgate_ratelimit_client_failing_open",
		"1 while some tenant's owner has been silent longer than StaleAfter and the client admits (fail open).", nil, nil)
	descStale = prometheus.NewDesc("tollgate_ratelimit_client_stale_tenants",
		"Tenants whose owner has been silent longer than StaleAfter.", nil, nil)
	descReports = prometheus.NewDesc("tollgate_ratelimit_client_reports_sent_total", "Reports sent to owners.", nil, nil)
	descUpdates = prometheus.NewDesc("tollgate_ratelimit_client_updates_received_total", "Updates received from owners.", nil, nil)
	descOwners  = prometheus.NewDesc("tollgate_ratelimit_client_owner_streams", "Owner streams that delivered an update.", nil, nil)
)

type collector struct{ c *Client }

func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDecisions, descTokens, descReportLag, descUpdateAge, descBlocklist, descFailingOpen, descStale, descReports, descUpdates, descOwners} {
		ch <- d
	}
}

func (m *collector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range *m.c.byID.Load() {
		for r := range numReasons {
			v := t.decided[r].Load()
			if v == 0 {
				continue
			}
			d := "allowed"
			if !reasonAllowed(r) {
				d = "blocked"
			}
			ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(v), t.name, d, reasonNames[r])
		}
		c, o := t.consumed.Load(), t.offeredTotal()
		ch <- prometheus.MustNewConstMetric(descTokens, prometheus.CounterValue, float64(c), t.name, "allowed")
		ch <- prometheus.MustNewConstMetric(descTokens, prometheus.CounterValue, float64(o-min(o, c)), t.name, "blocked")
	}
	s := m.c.Stats()
	failing := 0.0
	if s.FailingOpen {
		failing = 1
	}
	ch <- prometheus.MustNewConstMetric(descReportLag, prometheus.GaugeValue, s.ReportLag.Seconds())
	ch <- prometheus.MustNewConstMetric(descUpdateAge, prometheus.GaugeValue, s.UpdateAge.Seconds())
	ch <- prometheus.MustNewConstMetric(descBlocklist, prometheus.GaugeValue, float64(s.Blocklisted))
	ch <- prometheus.MustNewConstMetric(descFailingOpen, prometheus.GaugeValue, failing)
	ch <- prometheus.MustNewConstMetric(descStale, prometheus.GaugeValue, float64(s.StaleTenant))
	ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(s.ReportsSent))
	ch <- prometheus.MustNewConstMetric(descUpdates, prometheus.CounterValue, float64(s.UpdatesReceived))
	ch <- prometheus.MustNewConstMetric(descOwners, prometheus.GaugeValue, float64(s.Owners))
}
