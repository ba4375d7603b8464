package module

import (
	"os"
	"regexp"
	"strings"
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

// TestEverySeriesTheAlertsReadExistsFromTheFirstScrape: each metric named in an alert's expr
// (examples/observability/alerts.yml) has a series on a fresh gateway configured with the parts
// the alerts watch (a typed async block, a webhook endpoint, capacity): an absent series makes
// a ratio empty, so the alert (MulliganRetrySurge's denominator) could never fire.
func TestEverySeriesTheAlertsReadExistsFromTheFirstScrape(t *testing.T) {
	src, err := os.ReadFile("../examples/observability/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, modelserver.Config{}, "async {\n type chat_completion\n }\n capacity {\n limit 2\n }\n"+
		webhooksBlock("http://127.0.0.1:9/zero", "", secretA))
	present := map[string]bool{}
	for sample := range g.scrape(t) {
		present[strings.FieldsFunc(sample, func(r rune) bool { return r == '{' || r == ' ' })[0]] = true
	}
	name := regexp.MustCompile(`\bmulligan_[a-z_]+[a-z]`)
	inExpr, n := false, 0
	for _, line := range strings.Split(string(src), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "expr:"):
			inExpr = true
		case strings.HasPrefix(trimmed, "for:") || strings.HasPrefix(trimmed, "labels:"):
			inExpr = false
		}
		if !inExpr {
			continue
		}
		for _, m := range name.FindAllString(line, -1) {
			n++
			if !present[m] {
				t.Errorf("%s, read by an alert, is absent from a fresh scrape", m)
			}
		}
	}
	if n < 10 {
		t.Fatalf("found only %d metric uses in the alerts' exprs", n)
	}
}
