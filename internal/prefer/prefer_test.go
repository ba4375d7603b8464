package prefer

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want Preferences
	}{
		{nil, Preferences{}},
		{[]string{"respond-async"}, Preferences{RespondAsync: true}},
		{[]string{"Respond-Async, wait=10"}, Preferences{RespondAsync: true, Wait: 10 * time.Second, HasWait: true}},
		{[]string{`wait="5"`, "wait=9"}, Preferences{Wait: 5 * time.Second, HasWait: true}},           // the first wait counts
		{[]string{"wait=0"}, Preferences{HasWait: true}},                                              // zero is a wait
		{[]string{"wait=-1, wait=abc, wait=99999999999"}, Preferences{}},                              // unparsable: ignored
		{[]string{"handling=lenient; foo=bar, respond-async; x=1"}, Preferences{RespondAsync: true}},  // parameters ignored
		{[]string{"return=minimal", "wait=3;q=1"}, Preferences{Wait: 3 * time.Second, HasWait: true}}, // unknown ignored
	} {
		if got := Parse(c.in); got != c.want {
			t.Errorf("Parse(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}
