package webhook_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/mulligan-gw/mulligan/webhook"
)

func TestParseSecretAcceptsStandardWebhooksSerialisation(t *testing.T) {
	tests := []struct {
		name  string
		input string
	}{
		{"whsec prefix", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		{"bare base64 as the reference libraries allow", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		{"surrounding whitespace from an env file", " whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"},
		{"shorter than the recommended 24 bytes is still accepted", "whsec_c2hvcnQ="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := webhook.ParseSecret(tt.input); err != nil {
				t.Fatalf("ParseSecret(%q) = %v, want nil", tt.input, err)
			}
		})
	}
}

func TestParseSecretRejectsUnusableSecrets(t *testing.T) {
	tests := []struct {
		name  string
		input string
	}{
		{"empty", ""},
		{"prefix only", "whsec_"},
		{"not base64", "whsec_not base64!"},
		{"unpadded base64", "whsec_c2hvcnQ"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := webhook.ParseSecret(tt.input)
			if !errors.Is(err, webhook.ErrInvalidSecret) {
				t.Fatalf("ParseSecret(%q) = %v, want ErrInvalidSecret", tt.input, err)
			}
		})
	}
}

func TestSecretNeverPrintsItsKey(t *testing.T) {
	s := mustSecret(t, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	printed := fmt.Sprintf("%v %+v %#v %s", s, s, s, s)
	for _, leak := range []string{"MfKQ9r8G", "49", "[]byte"} {
		if strings.Contains(printed, leak) {
			t.Fatalf("printed secret %q contains %q", printed, leak)
		}
	}
}
