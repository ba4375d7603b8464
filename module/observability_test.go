package module

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// metricNames returns the name of every metric Mulligan's collectors describe.
func metricNames() map[string]bool {
	names := map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range collectors() {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	return names
}

// TestAlertRulesAndDashboardUseRealMetricNames: every mulligan_* name in the shipped alert rules
// and Grafana dashboard is a metric the gateway exports (a histogram's _bucket, _sum and _count
// included), so a renamed metric cannot leave them silently empty.
func TestAlertRulesAndDashboardUseRealMetricNames(t *testing.T) {
	names := metricNames()
	if len(names) < 15 {
		t.Fatalf("found only %d metric names: %v", len(names), names)
	}
	used := regexp.MustCompile(`\bmulligan_[a-z_]+[a-z]`)
	for _, file := range []string{"../examples/observability/alerts.yml", "../examples/observability/dashboard.json"} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(file, ".json") && !json.Valid(src) {
			t.Fatalf("%s is not valid JSON", file)
		}
		seen := map[string]bool{}
		for _, name := range used.FindAllString(string(src), -1) {
			seen[name] = true
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				base = strings.TrimSuffix(base, suffix)
			}
			if !names[name] && !names[base] {
				t.Errorf("%s uses %s, which the gateway does not export", file, name)
			}
		}
		if len(seen) < 8 {
			t.Errorf("%s uses only %d metrics: %v", file, len(seen), seen)
		}
	}
}

// TestSeedMetricsCountSubmissionsPollsAndTheOldestRunning checks the metrics of the seeds'
// dashboards over HTTP: submissions by type, status polls, the age of the oldest running
// operation and the submit-to-final duration.
func TestSeedMetricsCountSubmissionsPollsAndTheOldestRunning(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	before := g.scrape(t)
	_, slow := g.submit(t, "", modelserver.HeaderMockLatency, "30s")
	testkit.WaitFor(t, 5*time.Second, `decodeOp(t, g.get(slow.Links.Self)).Status == "running"`, func() bool { return decodeOp(t, g.get(slow.Links.Self)).Status == "running" })
	for i := range 2 {
		_, op := g.submit(t, "quick-"+itoa(i))
		g.get(op.Links.Self)
		g.await(t, op.OperationID)
	}
	during := g.scrape(t)
	if age := sum(during, "mulligan_oldest_running_operation_age_seconds"); age <= 0 || age > 60 {
		t.Fatalf("oldest running operation age %v with one running for under a minute", age)
	}
	if r := g.post(slow.Links.Cancel, "", ""); r.StatusCode != http.StatusOK && r.StatusCode != http.StatusAccepted {
		t.Fatalf("cancel: %s %s", r.Status, r.body)
	}
	testkit.WaitFor(t, 5*time.Second, `sum(g.scrape(t), "mulligan_oldest_running_operation_age_seconds") == 0`, func() bool { return sum(g.scrape(t), "mulligan_oldest_running_operation_age_seconds") == 0 })
	after := g.scrape(t)
	delta := func(name string) float64 { return sum(after, name) - sum(before, name) }
	submitted := `mulligan_operations_submitted_total{type="` + chatPath + `"}`
	if d := after[submitted] - before[submitted]; d != 3 {
		t.Errorf("%s grew by %v, want 3", submitted, d)
	}
	if d := delta("mulligan_operation_polls_total"); d < 3 {
		t.Errorf("mulligan_operation_polls_total grew by %v, want at least the 3 polls made", d)
	}
	if d := delta("mulligan_operation_duration_seconds_count"); d != 3 {
		t.Errorf("mulligan_operation_duration_seconds_count grew by %v, want 3 (two succeeded, one canceled)", d)
	}
}

// TestDocsListEveryShippedAlert: docs/operating.md and examples/observability/README.md list the
// alerts of alerts.yml, each by its name in words (MulliganWebhookBreakerOpen: "webhook breaker
// open"), no more and no fewer.
func TestDocsListEveryShippedAlert(t *testing.T) {
	src, err := os.ReadFile("../examples/observability/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	word := regexp.MustCompile(`[A-Z][a-z]*`)
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: Mulligan(\w+)`).FindAllStringSubmatch(string(src), -1) {
		want = append(want, strings.ToLower(strings.Join(word.FindAllString(m[1], -1), " ")))
	}
	for file, list := range map[string]*regexp.Regexp{
		"../docs/operating.md":                regexp.MustCompile("\\(`alerts.yml`: ([^)]*)\\)"),
		"../examples/observability/README.md": regexp.MustCompile(`alert rules: ([^.]*)\.`),
	} {
		doc, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		m := list.FindSubmatch(doc)
		if m == nil {
			t.Fatalf("%s: no list of the alerts found", file)
		}
		var got []string
		for _, item := range strings.Split(string(m[1]), ",") {
			got = append(got, strings.Join(strings.Fields(item), " "))
		}
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Errorf("%s lists the alerts\n  %s\nalerts.yml has\n  %s", file, strings.Join(got, ", "), strings.Join(want, ", "))
		}
	}
}
