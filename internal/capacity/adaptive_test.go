package capacity

import (
	"container/heap"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/store"
)

// slottedLatency models a model server with slots and a first-come queue behind them: a call
// takes base while it holds a slot, and waits its turn behind the calls queued before it.
func slottedLatency(base time.Duration, slots, inFlight int) time.Duration {
	if inFlight <= slots {
		return base
	}
	return base * time.Duration(inFlight) / time.Duration(slots)
}

func ok(latency time.Duration, inFlight int) Sample {
	return Sample{Latency: latency, Status: 200, InFlight: inFlight}
}

func TestAdaptiveLimitFindsTheUpstreamSlotsWithoutStarvingIt(t *testing.T) {
	a := NewAdaptive(1, 64)
	const slots = 4
	// Saturating load: the gateway always has work waiting, so the limit is always in use.
	var sum, n, busy int
	for i := range 3000 {
		limit := a.Current()
		a.Update(ok(slottedLatency(100*time.Millisecond, slots, limit), limit))
		if i >= 1000 {
			sum += limit
			n++
			if limit >= slots {
				busy++
			}
		}
	}
	mean := float64(sum) / float64(n)
	// A queue inside the server shorter than its slots on average, and every slot busy (the
	// limit at least the slots) at least 90 % of the time: the floor probes cost the rest.
	if mean < slots || mean > 2*slots || float64(busy) < 0.9*float64(n) {
		t.Fatalf("the limit averaged %.1f and filled the slots %d of %d calls; want %d..%d and 90 %%", mean, busy, n, slots, 2*slots)
	}
	t.Logf("limit averaged %.2f for %d slots; slots full for %.1f %% of calls", mean, slots, 100*float64(busy)/float64(n))
}

func TestAdaptiveLimitCutsOnOverloadAndStaysInItsBounds(t *testing.T) {
	a := NewAdaptive(2, 10)
	for range 200 {
		a.Update(ok(50*time.Millisecond, a.Current()))
	}
	if a.Current() != 10 {
		t.Fatalf("with latency at its floor the limit grew to %d; want the max 10", a.Current())
	}
	before := a.Current()
	a.Update(Sample{Latency: time.Second, Status: 503, Overloaded: true, InFlight: before})
	if a.Current() >= before {
		t.Fatalf("a 503 left the limit at %d", a.Current())
	}
	for range 100 {
		a.Update(Sample{Latency: time.Second, Status: 429, Overloaded: true, InFlight: a.Current()})
	}
	if a.Current() != 2 {
		t.Fatalf("after many overloads the limit is %d; want the min 2", a.Current())
	}
}

func TestAdaptiveLimitDoesNotGrowWithoutTraffic(t *testing.T) {
	a := NewAdaptive(1, 64)
	for range 50 {
		a.Update(ok(10*time.Millisecond, 1))
	}
	grown := a.Current()
	for range 200 {
		a.Update(ok(10*time.Millisecond, 1)) // one call at a time: nothing says more seats help
	}
	if a.Current() > max(grown, 2) {
		t.Fatalf("one call at a time grew the limit from %d to %d", grown, a.Current())
	}
}

// Answers that say nothing about the queue are not samples: a flood of instant 400s, 401s and
// 500s neither lowers the floor nor moves the limit, and a stray instant 2xx does not become
// the floor.
func TestAdaptiveLimitIgnoresAnswersThatSayNothingAboutTheQueue(t *testing.T) {
	a := NewAdaptive(1, 64)
	for range 300 {
		a.Update(ok(100*time.Millisecond, a.Current()))
	}
	before, floor := a.Current(), a.floors[kindLatency].value
	for i := range 1000 {
		a.Update(Sample{Latency: time.Millisecond, Status: []int{400, 401, 404, 422, 500}[i%5], InFlight: a.Current()})
	}
	if a.Current() != before || a.floors[kindLatency].value != floor {
		t.Fatalf("1000 instant 4xx/500 answers moved the limit %d -> %d, the floor %v -> %v", before, a.Current(), floor, a.floors[kindLatency].value)
	}
	for range 50 {
		a.Update(ok(time.Millisecond, a.Current())) // cached or tiny answers
	}
	if a.floors[kindLatency].value != floor || a.Current() < before {
		t.Fatalf("instant 2xx answers moved the floor %v -> %v or shrank the limit %d -> %d", floor, a.floors[kindLatency].value, before, a.Current())
	}
	// Nor while a queue shows: a step down is for the calls that waited (each instant answer
	// was one more step down before).
	for range 5 {
		a.Update(ok(300*time.Millisecond, a.Current()))
	}
	before = a.Current()
	for range 50 {
		a.Update(ok(time.Millisecond, a.Current()))
	}
	if a.Current() < before {
		t.Fatalf("instant 2xx answers after a queue showed shrank the limit %d -> %d", before, a.Current())
	}
}

// A floor is not measured among answers far faster than the calls (cached answers, a model
// list through the gateway): with four of the first seven answers instant, the floor is the
// calls', and the calls that follow do not read as waiting their whole latency.
func TestAdaptiveFloorLeavesOutAnswersFarFasterThanTheCalls(t *testing.T) {
	a := NewAdaptive(1, 64)
	for i := range probeSamples {
		l := 100 * time.Millisecond
		if i%2 == 0 {
			l = time.Millisecond
		}
		a.Update(ok(l, 1))
	}
	if got := a.floors[kindLatency].value; got != 0.1 {
		t.Fatalf("the floor of 3 calls of 100 ms and 4 instant answers is %vs; want 0.1s", got)
	}
	// Nor is one slow call the floor of the others (measured against the slowest sample, the
	// floor was 5 s, and the limit grew to its maximum).
	b := NewAdaptive(1, 64)
	b.Update(ok(5*time.Second, 1))
	for range probeSamples - 1 {
		b.Update(ok(100*time.Millisecond, 1))
	}
	if got := b.floors[kindLatency].value; got != 0.1 {
		t.Fatalf("the floor of a 5 s call and 6 calls of 100 ms is %vs; want 0.1s", got)
	}
}

// simulation is a model server with slots and its own first-come queue behind a Pool with
// `limit auto`, on a fake clock: the gateway always has work waiting.
type simulation struct {
	clock *clockwork.FakeClock
	pool  *Pool
	slots int
	rng   *rand.Rand

	running int
	queue   []*simCall // inside the model server
	events  eventHeap
	waiters []*simCall // at the gateway, each enqueued in the pool

	busy, window time.Duration // slot time used, and 4 × the time measured
	limits       []int

	job     func(rng *rand.Rand) simJob // the next call of the backlog
	noise   time.Duration               // another tenant's instant 400 every noise; 0: none
	noiseAt time.Time

	backlogUrgency int           // the backlog's Priority urgency (0: none given)
	urgentEvery    time.Duration // another tenant's urgent call (u=0) every urgentEvery; 0: none
	urgentJob      simJob
	urgentAt       time.Time
	urgentTook     []time.Duration // each urgent call's time from its arrival to its end, past warm-up
}

type simJob struct {
	service time.Duration // time holding a slot
	prefill time.Duration // from the slot to the first event
	tokens  int           // usage.completion_tokens; 0: not reported
	stream  bool
	status  int
	slot    bool // takes a slot of the model server (a validation error does not)
}

type simCall struct {
	simJob
	urgent     bool
	arrived    time.Time
	w          *Waiter
	start      time.Time // granted a seat: sent upstream
	firstEvent time.Time
}

type simEvent struct {
	at   time.Time
	call *simCall
	done bool // the call ends; else it reaches a slot
}

type eventHeap []simEvent

func (h eventHeap) Len() int           { return len(h) }
func (h eventHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h eventHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)        { *h = append(*h, x.(simEvent)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// run simulates d of saturating load and returns the slots' utilisation after the first
// quarter (the limit's warm-up).
func (s *simulation) run(t *testing.T, d time.Duration) float64 {
	t.Helper()
	begin := s.clock.Now()
	warm := begin.Add(d / 4)
	s.noiseAt, s.urgentAt = begin, begin
	for s.clock.Now().Before(begin.Add(d)) {
		for len(s.waiters) < 64 { // the backlog at the gateway
			s.enqueue(s.job(s.rng), "backlog", s.backlogUrgency)
		}
		s.startGranted()
		next := s.events[0].at
		if s.noise > 0 && s.noiseAt.Before(next) {
			next = s.noiseAt
		}
		if s.urgentEvery > 0 && s.urgentAt.Before(next) {
			next = s.urgentAt
		}
		s.advance(next, warm)
		if s.noise > 0 && !s.clock.Now().Before(s.noiseAt) {
			s.enqueue(simJob{service: 3 * time.Millisecond, status: 400}, "noise", 0)
			s.noiseAt = s.noiseAt.Add(s.noise)
			continue
		}
		if s.urgentEvery > 0 && !s.clock.Now().Before(s.urgentAt) {
			s.enqueue(s.urgentJob, "interactive", 0).urgent = true
			s.urgentAt = s.urgentAt.Add(s.urgentEvery)
			continue
		}
		e := heap.Pop(&s.events).(simEvent)
		if !e.done {
			e.call.firstEvent = s.clock.Now().Add(e.call.prefill)
			heap.Push(&s.events, simEvent{at: s.clock.Now().Add(e.call.service), call: e.call, done: true})
			continue
		}
		if e.call.slot {
			s.running--
			if len(s.queue) > 0 {
				c := s.queue[0]
				s.queue = s.queue[1:]
				s.running++
				heap.Push(&s.events, simEvent{at: s.clock.Now(), call: c})
			}
		}
		sample := Sample{Status: e.call.status, Tokens: e.call.tokens, Stream: e.call.stream}
		if e.call.stream {
			sample.FirstByte = e.call.firstEvent.Sub(e.call.start)
		}
		s.pool.Release(e.call.w, e.call.start, sample)
		if !s.clock.Now().Before(warm) {
			s.limits = append(s.limits, s.pool.Snapshot().Limit)
			if e.call.urgent {
				s.urgentTook = append(s.urgentTook, s.clock.Now().Sub(e.call.arrived))
			}
		}
	}
	return float64(s.busy) / float64(s.window)
}

// advance moves the clock to at, counting the busy slot time past warm.
func (s *simulation) advance(at, warm time.Time) {
	if d := at.Sub(s.clock.Now()); d > 0 {
		if !s.clock.Now().Before(warm) {
			s.busy += time.Duration(s.running) * d
			s.window += time.Duration(s.slots) * d
		}
		s.clock.Advance(d)
	}
}

func (s *simulation) enqueue(j simJob, scope string, urgency int) *simCall {
	c := &simCall{simJob: j, arrived: s.clock.Now()}
	c.w = s.pool.Enqueue(Ask{Scope: scope, Urgency: urgency, Since: s.clock.Now()})
	s.waiters = append(s.waiters, c)
	return c
}

// startGranted sends upstream every waiter the pool granted a seat.
func (s *simulation) startGranted() {
	kept := s.waiters[:0]
	for _, c := range s.waiters {
		if !granted(c.w) {
			kept = append(kept, c)
			continue
		}
		start, err := s.pool.Await(context.Background(), c.w, 0)
		if err != nil {
			panic(err)
		}
		c.start = start
		switch {
		case !c.slot:
			c.firstEvent = start.Add(c.service)
			heap.Push(&s.events, simEvent{at: start.Add(c.service), call: c, done: true})
		case s.running < s.slots:
			s.running++
			heap.Push(&s.events, simEvent{at: start, call: c})
		default:
			s.queue = append(s.queue, c)
		}
	}
	s.waiters = kept
}

// generation is a call of n output tokens at 10 ms each after a 20 ms prefill: 5..500 tokens,
// 70 ms to 5 s, log-uniform (lengths vary a hundredfold and more).
func generation(stream bool) func(*rand.Rand) simJob {
	return func(rng *rand.Rand) simJob {
		n := int(math.Round(5 * math.Pow(100, rng.Float64())))
		prefill := 20 * time.Millisecond
		return simJob{service: prefill + time.Duration(n)*10*time.Millisecond, prefill: prefill, tokens: n,
			stream: stream, status: 200, slot: true}
	}
}

func newSimulation(slots int, job func(*rand.Rand) simJob) *simulation {
	clock := clockwork.NewFakeClockAt(t0)
	return &simulation{clock: clock, pool: NewPool(clock, Config{Auto: true, Min: 1, Max: 64}), slots: slots,
		rng: rand.New(rand.NewPCG(1, 2)), job: job}
}

func meanOf(xs []int) float64 {
	sum := 0
	for _, x := range xs {
		sum += x
	}
	return float64(sum) / float64(max(len(xs), 1))
}

// `limit auto` keeps a 4-slot model server busy while work waits, whatever the mix of
// generation lengths and however many instant errors another tenant causes (docs/capacity.md).
func TestAdaptiveLimitKeepsSlotsBusyForMixedLengthsAndFastErrors(t *testing.T) {
	tiny := func(rng *rand.Rand) simJob { // one call in a hundred a cached, instant answer
		if rng.IntN(100) == 0 {
			return simJob{service: 3 * time.Millisecond, prefill: time.Millisecond, tokens: 1, status: 200, slot: true}
		}
		return generation(false)(rng)
	}
	// Answers that say nothing about the queue, as often as the calls that do: a cached answer
	// (or a model list, or a health check through the gateway) in a millisecond without usage,
	// from the first call on, so that the first floor is measured among them.
	instant := simJob{service: time.Millisecond, status: 200, slot: true}
	halfInstant := func(rng *rand.Rand) simJob {
		if rng.IntN(2) == 0 {
			return instant
		}
		return generation(false)(rng)
	}
	halfInstantStreams := func(rng *rand.Rand) simJob {
		if rng.IntN(2) == 0 {
			return instant
		}
		return generation(true)(rng)
	}
	halfInstantUniform := func(rng *rand.Rand) simJob { // a server that reports no usage
		if rng.IntN(2) == 0 {
			return instant
		}
		return simJob{service: 100 * time.Millisecond, status: 200, slot: true}
	}
	// One-token answers (a classification, a yes or no) are mostly their prefill: 40 ms for one
	// token is four times a generation's time per token, with no queue at all.
	oneToken := func(rng *rand.Rand) simJob {
		if rng.IntN(3) == 0 {
			return simJob{service: 40 * time.Millisecond, tokens: 1, status: 200, slot: true}
		}
		return generation(false)(rng)
	}
	for _, c := range []struct {
		name  string
		job   func(*rand.Rand) simJob
		noise time.Duration
	}{
		{"answers with usage", generation(false), 0},
		{"event streams", generation(true), 0},
		{"answers with usage, instant 400s every 20ms", generation(false), 20 * time.Millisecond},
		{"event streams, instant 400s every 20ms", generation(true), 20 * time.Millisecond},
		{"answers with usage, 1 in 100 instant", tiny, 0},
		{"answers with usage, half instant answers without usage from the start", halfInstant, 0},
		{"answers with usage, a third one-token answers", oneToken, 0},
		{"one-token answers only", func(*rand.Rand) simJob {
			return simJob{service: 40 * time.Millisecond, tokens: 1, status: 200, slot: true}
		}, 0},
		{"event streams, half instant answers without usage from the start", halfInstantStreams, 0},
		{"100 ms answers without usage, half instant from the start", halfInstantUniform, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSimulation(4, c.job)
			s.noise = c.noise
			u := s.run(t, 10*time.Minute) // of the simulated clock
			t.Logf("slots busy %.1f %% while work waited; limit averaged %.1f", 100*u, meanOf(s.limits))
			if u < 0.9 {
				t.Fatalf("slots busy %.1f %% while work waited; want at least 90 %%", 100*u)
			}
			if m := meanOf(s.limits); m > 3*float64(s.slots) {
				t.Fatalf("the limit averaged %.1f for %d slots: the model server's own queue grew long", m, s.slots)
			}
		})
	}
}

// mixedLengths is the flood benchmark's mixed call: 1 to 15 times 100 ms, uniformly, its usage
// in proportion (docs/capacity.md, "Under a flood").
func mixedLengths(rng *rand.Rand) simJob {
	n := 1 + rng.IntN(15)
	return simJob{service: time.Duration(n) * 100 * time.Millisecond, tokens: 4 * n, status: 200, slot: true}
}

// percentile is the p-th percentile of ds (sorted in place).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(p*float64(len(ds))))]
}

// Behind a flood of calls 100 ms to 1.5 s long at urgency 7, another tenant's urgent 100 ms
// call every 200 ms waits at most for the first running call to end: its p99 stays within the
// longest call plus its own (the flood benchmark's target), and the slots stay busy.
func TestAdaptiveLimitLetsAnUrgentCallPastAMixedFlood(t *testing.T) {
	s := newSimulation(4, mixedLengths)
	s.backlogUrgency = 7
	s.urgentEvery = 200 * time.Millisecond
	s.urgentJob = simJob{service: 100 * time.Millisecond, tokens: 4, status: 200, slot: true}
	u := s.run(t, 10*time.Minute)
	p50, p99 := percentile(s.urgentTook, 0.5), percentile(s.urgentTook, 0.99)
	t.Logf("urgent calls: %d, p50 %v, p99 %v; slots busy %.1f %% while work waited; limit averaged %.1f", len(s.urgentTook), p50, p99, 100*u, meanOf(s.limits))
	if longest := 1500 * time.Millisecond; p99 > longest+s.urgentJob.service {
		t.Fatalf("urgent p99 %v: more than the longest call plus its own (%v)", p99, longest+s.urgentJob.service)
	}
	if u < 0.9 {
		t.Fatalf("slots busy %.1f %% while work waited; want at least 90 %%", 100*u)
	}
}

// Turns charge slot time, not calls: behind a flood of calls 100 ms to 1.5 s long competing at
// the same band (the default urgency, as a low-urgency flood is once it has aged), a tenant
// whose 100 ms calls come every 200 ms uses an eighth of the slot time its turns earn, so each
// call waits about for a seat to come free, not behind the flood's calls one for one. Counted
// per call, its calls needed half the grants and queued (p50 12.6 s).
func TestFairTurnsChargeSlotTimeSoShortCallsPassALongFloodAtTheSameBand(t *testing.T) {
	s := newSimulation(4, mixedLengths)
	s.backlogUrgency = store.DefaultUrgency
	s.urgentEvery = 200 * time.Millisecond
	s.urgentJob = simJob{service: 100 * time.Millisecond, tokens: 4, status: 200, slot: true}
	u := s.run(t, 10*time.Minute)
	p50, p99 := percentile(s.urgentTook, 0.5), percentile(s.urgentTook, 0.99)
	t.Logf("short calls: %d, p50 %v, p99 %v; slots busy %.1f %% while work waited", len(s.urgentTook), p50, p99, 100*u)
	if longest := 1500 * time.Millisecond; p99 > longest+s.urgentJob.service {
		t.Fatalf("short calls' p99 %v: more than the longest call plus their own (%v)", p99, longest+s.urgentJob.service)
	}
	if u < 0.9 {
		t.Fatalf("slots busy %.1f %% while work waited; want at least 90 %%", 100*u)
	}
}

// With no queue anywhere (a model server with more slots than the limit's maximum), answers of
// one token and long generations mixed read as no wait: a one-token answer's time is mostly its
// prefill (here 20 ms of a 30 ms answer), three times a long generation's time per token, and
// read per token against one floor for every length, 200 of them in a row after long
// generations took the limit from its maximum, 64, to 1. Each length has its floor
// (tokenKind). The same holds with every answer's time 10 % off either way and 3 answers in
// 100 cached (a millisecond, with usage).
func TestAdaptiveLimitReadsShortAnswersPrefillAsNoWait(t *testing.T) {
	for _, noisy := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(3, 4))
		unqueued := func(n int) Sample { // 20 ms of prefill, 10 ms a token, no queue
			d := 20*time.Millisecond + time.Duration(n)*10*time.Millisecond
			if noisy {
				d = time.Duration(float64(d) * (0.9 + 0.2*rng.Float64()))
				if rng.IntN(100) < 3 {
					d = time.Millisecond
				}
			}
			return Sample{Latency: d, Tokens: n, Status: 200}
		}
		long := func() int { return int(math.Round(50 * math.Pow(10, rng.Float64()))) } // 50..500 tokens
		a := NewAdaptive(1, 64)
		for range 2100 { // long generations first: the limit grows to its maximum (past a probe)
			s := unqueued(long())
			s.InFlight = a.Current()
			a.Update(s)
		}
		if a.Current() < 60 || a.probe.left != 0 {
			t.Fatalf("noisy %v: long generations with no queue left the limit at %d, want 64", noisy, a.Current())
		}
		lowest, low, n := 64, 0, 0
		for i := range 5000 { // then a third of the answers one token long, 200 in a row first
			k := long()
			if i < 200 || rng.IntN(3) == 0 {
				k = 1
			}
			s := unqueued(k)
			s.InFlight = a.Current()
			a.Update(s)
			if a.probe.left == 0 {
				lowest, n = min(lowest, a.Current()), n+1
				if a.Current() < 48 {
					low++
				}
			}
		}
		t.Logf("noisy %v: the limit's lowest outside the floor probes: %d; under 48 for %.1f %% of the answers", noisy, lowest, 100*float64(low)/float64(n))
		if lowest < 32 || low*100 > n {
			t.Fatalf("noisy %v: answers of one token with no queue took the limit to %d, and under 48 for %d answers of %d (outside the floor probes); want it about 64", noisy, lowest, low, n)
		}
	}
}

// The floors per length are measured from probes of seven answers spread over the lengths: an
// answer a little fast or slow must not set its length's floor alone, nor a length seldom seen
// keep its floor when the model server grows slower. With no queue anywhere (the limit should
// stay at 64), every answer's time up to 10 % off either way and 3 in 100 cached (a millisecond,
// with usage), generations of 5..500 tokens; then, 5 % off, generations of 50..500 tokens and one
// in 200 of 3,000, the model server 1.5 times slower from the 10,000th answer. A length measured
// by the one answer a probe had of it kept the limit under 32 for 6-9 % of the noisy
// generations; a length a probe saw too few answers of to measure, left as it was, for up to 9 %
// of the answers after the slowdown. Four seeds each.
func TestAdaptiveFloorsPerLengthHoldForNoisyAndShiftingAnswers(t *testing.T) {
	under32 := func(seed, stream uint64, answers, from int, sample func(rng *rand.Rand, i int) Sample) float64 {
		rng := rand.New(rand.NewPCG(seed, stream))
		a := NewAdaptive(1, 64)
		low, n := 0, 0
		for i := range answers {
			s := sample(rng, i)
			s.InFlight = a.Current()
			a.Update(s)
			if i > from && a.probe.left == 0 {
				n++
				if a.Current() < 32 {
					low++
				}
			}
		}
		return float64(low) / float64(n)
	}
	noisy := func(rng *rand.Rand, _ int) Sample {
		k := int(math.Round(5 * math.Pow(100, rng.Float64())))
		d := time.Duration(float64(20*time.Millisecond+time.Duration(k)*10*time.Millisecond) * (0.9 + 0.2*rng.Float64()))
		if rng.IntN(100) < 3 {
			d = time.Millisecond
		}
		return Sample{Latency: d, Tokens: k, Status: 200}
	}
	slower := func(rng *rand.Rand, i int) Sample {
		k := int(math.Round(50 * math.Pow(10, rng.Float64())))
		if rng.IntN(200) == 0 {
			k = 3000
		}
		speed := 1.0
		if i >= 10000 {
			speed = 1.5
		}
		d := time.Duration(speed * float64(20*time.Millisecond+time.Duration(k)*10*time.Millisecond) * (0.95 + 0.1*rng.Float64()))
		return Sample{Latency: d, Tokens: k, Status: 200}
	}
	for seed := uint64(1); seed <= 4; seed++ {
		if u := under32(seed, 9, 20000, 2000, noisy); u > 0.04 {
			t.Errorf("seed %d: noisy generations with no queue kept the limit under 32 for %.1f %% of the answers", seed, 100*u)
		}
		if u := under32(seed, 7, 30000, 12000, slower); u > 0.04 {
			t.Errorf("seed %d: after the model server grew slower, the limit stayed under 32 for %.1f %% of the answers", seed, 100*u)
		}
	}
}

// A floor measured on calls far slower than those that come later (the first calls' prompts
// were long, or the model was swapped for a faster one) is measured again: the calls that
// follow are each too fast to be a sample, but 500 of them in a row and nothing else start a
// probe. Before, no sample ever counted again, and the limit never moved, whatever the queue.
func TestAdaptiveFloorFarAboveEveryCallIsMeasuredAgain(t *testing.T) {
	a := NewAdaptive(1, 64)
	for range probeSamples { // the floor: 600 ms calls
		a.Update(ok(600*time.Millisecond, 1))
	}
	if f := a.floors[kindLatency].value; f != 0.6 {
		t.Fatalf("floor %v after 600 ms calls", f)
	}
	for range 2 * probeEvery { // then only 20 ms calls, a queue or not
		a.Update(ok(20*time.Millisecond, a.Current()))
	}
	if f := a.floors[kindLatency].value; f > 0.021 {
		t.Fatalf("after %d calls of 20 ms the floor is still %v s", 2*probeEvery, f)
	}
	before := a.Current()
	if before < 8 {
		t.Fatalf("calls of 20 ms with no queue left the limit at %d", before)
	}
	for range 100 { // a queue: the calls now take three times as long
		a.Update(ok(60*time.Millisecond, a.Current()))
	}
	if a.Current() >= before {
		t.Fatalf("the limit did not come down from %d behind a queue", before)
	}
}

// A floor measured among instant answers (health checks through the pool first, or a probe of
// them after a night of nothing else) reads every real call after as waiting its whole time,
// and the limit stays at its minimum; the probes go on there, so the next measures the real calls and the limit grows
// again. Before, no probe started at the minimum, and the limit stayed there for good.
func TestAdaptiveLimitAtItsMinimumStillMeasuresTheFloor(t *testing.T) {
	a := NewAdaptive(4, 64)  // `limit auto 4 64`
	for range probeSamples { // instant answers first: a floor of a millisecond
		a.Update(ok(time.Millisecond, 4))
	}
	for range 2 * probeEvery { // then 100 ms calls, with no queue
		a.Update(ok(100*time.Millisecond, a.Current()))
	}
	if f := a.floors[kindLatency].value; f < 0.05 {
		t.Fatalf("after %d calls of 100 ms the floor is still %v s", 2*probeEvery, f)
	}
	for range 200 {
		a.Update(ok(100*time.Millisecond, a.Current()))
	}
	if a.Current() < 8 {
		t.Fatalf("calls of 100 ms with no queue left the limit at %d", a.Current())
	}
}
