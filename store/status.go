package store

// Status is where an operation is in its life:
//
//	queued -> running -> succeeded | failed | canceled
//	queued -> canceled
//	running -> queued   (the gateway stopped or crashed mid-run and hands the work back)
//
// Final statuses are final: nothing moves an operation out of them. After its retention a final
// operation reads as expired (its result gone), a tombstone that is itself dropped 7 days later.
type Status string

// The operation statuses.
const (
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusCanceled  Status = "canceled"
	StatusExpired   Status = "expired"
)

// legal lists every transition the state machine allows; anything else is refused.
var legal = map[Status]map[Status]bool{
	StatusQueued:  {StatusRunning: true, StatusCanceled: true},
	StatusRunning: {StatusSucceeded: true, StatusFailed: true, StatusCanceled: true, StatusQueued: true},
}

// Final reports whether s ends an operation's life.
func (s Status) Final() bool {
	return s == StatusSucceeded || s == StatusFailed || s == StatusCanceled || s == StatusExpired
}

// Valid reports whether s is one of the statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusQueued, StatusRunning, StatusSucceeded, StatusFailed, StatusCanceled, StatusExpired:
		return true
	}
	return false
}

// CanTransition reports whether the state machine allows from -> to.
func CanTransition(from, to Status) bool { return legal[from][to] }
