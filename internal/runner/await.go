package runner

// AwaitStream returns channels closed when an attempt of operation id starts or ends on this
// runner (changed), and when the answer of the attempt running now begins (begun); nil when
// there is nothing to wait for here.
func (r *Runner) AwaitStream(id string) (changed, begun <-chan struct{}) {
	if r == nil {
		return nil, nil
	}
	return r.streams.await(id)
}

// await returns the channels of AwaitStream.
func (o *opStreams) await(id string) (changed, begun <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.changed == nil {
		o.changed = make(chan struct{})
	}
	if s := o.m[id]; s != nil {
		begun = s.Begun()
	}
	return o.changed, begun
}

// signal wakes the waiters of await; the caller holds o.mu.
func (o *opStreams) signal() {
	if o.changed != nil {
		close(o.changed)
		o.changed = nil
	}
}

// settled wakes the waiters of await when an operation's outcome is written: a follower that
// found the attempt's stream ended and the operation still running reads it final at once.
func (o *opStreams) settled() {
	o.mu.Lock()
	o.signal()
	o.mu.Unlock()
}
