package main

import (
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// slotWatch reads the flood model server's counters every sampleEvery and adds up, over the
// intervals that began with work waiting, the slots' busy time and the model server's queue.
// Work is waiting when more calls are outstanding (sent toward the model server and neither
// finished there nor answered by the gateway itself) than the model server is running: the
// rest wait somewhere, in the gateway's queue or in the model server's.
type slotWatch struct {
	r     *floodRun
	stopc chan struct{}
	done  chan slotTotals
}

// watchSlots starts reading the counters of r's model server.
func (r *floodRun) watchSlots() *slotWatch {
	w := &slotWatch{r: r, stopc: make(chan struct{}), done: make(chan slotTotals, 1)}
	go w.loop()
	return w
}

// stop ends the watch, reading the counters once more, and returns the totals.
func (w *slotWatch) stop() slotTotals {
	close(w.stopc)
	return <-w.done
}

func (w *slotWatch) loop() {
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	prev := w.r.model.Stats()
	prevWaiting := w.waiting(prev)
	t := slotTotals{slots: prev.Slots}
	for stopped := false; !stopped; {
		select {
		case <-w.stopc:
			stopped = true
		case <-tick.C:
		}
		cur := w.r.model.Stats()
		if prevWaiting {
			d := cur.Sub(prev)
			t.waiting += d.Window
			t.busy += d.BusySlotTime
			t.queued += d.QueuedTime
		}
		prev, prevWaiting = cur, w.waiting(cur)
		t.maxQueue, t.maxHeld = cur.MaxQueued, cur.MaxInFlight
	}
	w.done <- t
}

// waiting reports whether, at st, work was waiting for a slot anywhere.
func (w *slotWatch) waiting(st modelserver.Stats) bool {
	outstanding := w.r.issued.Load() - w.r.refused.Load() - st.Completed - st.Abandoned
	return outstanding > st.Running
}
