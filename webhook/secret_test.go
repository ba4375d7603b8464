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
		says  string // the message says this (and, without the prefix, never "after whsec_")
	}{
		{"empty", "", "it is empty"},
		{"prefix only", "whsec_", "it is empty"},
		{"not base64", "whsec_not base64!", "the part after whsec_ is not standard base64"},
		{"unpadded base64", "whsec_c2hvcnQ", "the part after whsec_ is not standard base64"},
		{"bare, not base64", "x", "it is neither whsec_ followed by base64 nor bare base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := webhook.ParseSecret(tt.input)
			if !errors.Is(err, webhook.ErrInvalidSecret) {
				t.Fatalf("ParseSecret(%q) = %v, want ErrInvalidSecret", tt.input, err)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("ParseSecret(%q) = %v, want it to say %q", tt.input, err, tt.says)
			}
			if !strings.HasPrefix(strings.TrimSpace(tt.input), "whsec_") && strings.Contains(err.Error(), "after whsec_") {
				t.Fatalf("ParseSecret(%q) = %v: speaks of a prefix the secret does not have", tt.input, err)
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
