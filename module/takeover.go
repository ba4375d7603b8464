package module

import "time"

// takeOverBatch bounds the operations one round of takeovers settles (one transaction each):
// a backlog left by a dead replica is worked off over several rounds, each also bounded in time
// by takeoverEvery.
const takeOverBatch = 25

// takeOverLoop looks for operations whose worker fell silent, every takeoverEvery, and recounts
// the queue. It has a goroutine of its own: on a slow database a round may take long, and the
// heartbeat must renew this replica's own leases meanwhile, or the others would take them over.
func (r *runner) takeOverLoop() {
	defer r.beats.Done()
	for {
		t := time.NewTimer(takeoverEvery(r.config().takeover))
		select {
		case <-r.stopped:
			t.Stop()
			return
		case <-t.C:
		}
		if r.alive() {
			r.takeOver()
			r.dropStale()
			r.countQueued()
		}
	}
}
