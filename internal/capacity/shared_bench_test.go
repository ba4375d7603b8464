package capacity

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// BenchmarkASharedSeatPassed times one `shared 1` seat passed from call to call by four callers
// of two keys that hold it no time at all, on one replica and spread over two (each key on
// both): an op is one grant, so ns/op (and the gaps' p50 and p90) is how long the seat, and the
// model server's slot behind it, stands idle between two calls. Across replicas a pass costs a
// release, a notice and the other replica's look; on one replica a handover. cross/op is the
// share of grants that went to the other replica.
//
//	MULLIGAN_TEST_POSTGRES="$(scripts/dev-postgres.sh start)" go test -run '^$' -bench SharedSeatPassed ./internal/capacity
func BenchmarkASharedSeatPassed(b *testing.B) {
	for _, replicas := range []int{1, 2} {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			dsn := pgtest.Database(b)
			clock := clockwork.NewRealClock()
			shared := make([]*Shared, replicas)
			for r := range replicas {
				shared[r] = newReplicaShared(openSeats(b, dsn, clock), clock, 10*time.Second, "r"+strconv.Itoa(r))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			var at []time.Time  // when each grant came
			cross, last := 0, 0 // grants that went to the other replica; the replica of the last
			var wg sync.WaitGroup
			b.ResetTimer()
			for g := range 4 {
				r := g % replicas
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						h, err := shared[r].Take(ctx, time.Time{}, 3, "key"+strconv.Itoa(g/2), 1)
						if err != nil {
							return
						}
						mu.Lock()
						at = append(at, time.Now())
						if r != last {
							cross, last = cross+1, r
						}
						if len(at) >= b.N {
							cancel()
						}
						mu.Unlock()
						shared[r].Give(h)
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(cross)/float64(len(at)), "cross/op")
			if len(at) > 10 {
				gaps := make([]time.Duration, 0, len(at)-1)
				for i := 1; i < len(at); i++ {
					gaps = append(gaps, at[i].Sub(at[i-1]))
				}
				slices.Sort(gaps)
				b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(gaps[len(gaps)*9/10].Microseconds()), "p90-µs")
			}
		})
	}
}
