package store

import "testing"

func TestStateMachineRefusesIllegalTransitions(t *testing.T) {
	all := []Status{StatusQueued, StatusRunning, StatusSucceeded, StatusFailed, StatusCanceled, StatusExpired}
	allowed := map[[2]Status]bool{
		{StatusQueued, StatusRunning}: true, {StatusQueued, StatusCanceled}: true,
		{StatusRunning, StatusSucceeded}: true, {StatusRunning, StatusFailed}: true,
		{StatusRunning, StatusCanceled}: true, {StatusRunning, StatusQueued}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got := CanTransition(from, to); got != allowed[[2]Status{from, to}] {
				t.Errorf("%s -> %s: allowed=%v", from, to, got)
			}
		}
	}
	for _, s := range all {
		if s.Final() && CanTransition(s, StatusQueued) {
			t.Errorf("final %s can move", s)
		}
	}
}
