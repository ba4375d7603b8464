package module

import (
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/webhook"
)

// The labelled counters the shipped alerts watch (examples/observability/alerts.yml) are made to
// exist at 0 for every label value the configuration already knows: increase() over a series
// that appears at 1 is 0, so an alert on the first dead letter or failure would never fire.

// attemptResults are the results an attempt is counted under (webhook.Result's names).
var attemptResults = []webhook.Result{webhook.Delivered, webhook.RetryLater, webhook.Disabled, webhook.DeadLetter}

// finalOutcomes are the final statuses and error codes of the outcome table (docs/api.md).
var finalOutcomes = [][2]string{
	{string(store.StatusSucceeded), ""}, {string(store.StatusCanceled), ""},
	{string(store.StatusFailed), string(apierr.CodeUpstreamRejected)}, {string(store.StatusFailed), string(apierr.CodeUpstreamUnavailable)},
	{string(store.StatusFailed), string(apierr.CodeUpstreamError)}, {string(store.StatusFailed), string(apierr.CodeOperationTimeout)},
	{string(store.StatusFailed), string(apierr.CodeResultTooLarge)}, {string(store.StatusFailed), string(apierr.CodeWorkerLost)},
}

func init() {
	for _, o := range finalOutcomes {
		metrics.operations.WithLabelValues(o[0], o[1])
	}
}

// zeroWebhookCounters creates the webhook counters of every configured endpoint at 0.
func zeroWebhookCounters(endpoints map[string]*webhookSetup) {
	for name := range endpoints {
		for _, r := range attemptResults {
			metrics.attempts.WithLabelValues(name, r.String())
		}
		metrics.deadLetters.WithLabelValues(name)
	}
}

// zeroSubmitted creates the submitted counter of a block's configured operation type at 0: it
// is the denominator of the MulliganRetrySurge alert. A block without `type` counts under the
// route's path, known only when the first request arrives; the alert's denominator falls back
// to 0 then (`or vector(0)`).
func zeroSubmitted(typ string) {
	if typ != "" {
		metrics.submitted.WithLabelValues(typ)
	}
}
