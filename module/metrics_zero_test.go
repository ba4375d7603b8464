package module

import (
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// The labelled counters the shipped alerts use exist at 0 from the first scrape for the
// configured labels: an alert on increase() then fires at the first dead letter or failure,
// where a series born at 1 would show no increase (docs/operating.md).
func TestAlertedCountersExistAtZeroFromTheFirstScrape(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, webhooksBlock("http://127.0.0.1:9/zero", "", secretA))
	samples := g.scrape(t)
	for _, name := range []string{
		`mulligan_webhook_dead_letters_total{endpoint="hooks"}`,
		`mulligan_webhook_attempts_total{endpoint="hooks",result="dead_letter"}`,
		`mulligan_webhook_attempts_total{endpoint="hooks",result="delivered"}`,
		`mulligan_operations_finished_total{error_code="UPSTREAM_ERROR",status="failed"}`,
		`mulligan_operations_finished_total{error_code="",status="succeeded"}`,
	} {
		if _, ok := samples[name]; !ok {
			t.Errorf("%s is absent before anything happened", name)
		}
	}
}
