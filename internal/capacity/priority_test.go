package capacity

import "testing"

func TestUrgencyOfPriorityHeader(t *testing.T) {
	for _, c := range []struct {
		values []string
		want   int
	}{
		{nil, 3},
		{[]string{"u=0"}, 0},
		{[]string{"u=7, i"}, 7},
		{[]string{"i, u=1;x=2"}, 1},       // parameters ignored
		{[]string{"u=5, foo=\"bar\""}, 5}, // unknown members ignored
		{[]string{"u=2", "u=6"}, 6},       // lines join; the last u counts
		{[]string{"u=8"}, 3},              // out of range
		{[]string{"u=-1"}, 3},
		{[]string{"u=1.5"}, 3}, // not an integer
		{[]string{"u=\"1\""}, 3},
		{[]string{"u=1,"}, 3}, // not a dictionary: the whole header is ignored
		{[]string{"U=1"}, 3},
		{[]string{"u=1 x"}, 3},
		{[]string{"x=(a b), u=2"}, 2}, // an inner list
		{[]string{"x=(a b, u=2"}, 3},
	} {
		if got := UrgencyOf(c.values); got != c.want {
			t.Errorf("Priority %q: urgency %d, want %d", c.values, got, c.want)
		}
	}
}
