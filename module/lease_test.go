package module

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// freezer is a TCP proxy on loopback in front of PostgreSQL that can stop answering at once,
// as a database behind a lost network does: connections stay open, nothing gets through.
type freezer struct {
	ln     net.Listener
	target string
	frozen chan struct{}
	once   sync.Once
	mu     sync.Mutex
	conns  []net.Conn
}

func newFreezer(t *testing.T, target string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target, frozen: make(chan struct{})}
	go f.accept()
	return f
}

func (f *freezer) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, up)
		f.mu.Unlock()
		go f.pipe(c, up)
		go f.pipe(up, c)
	}
}

// pipe copies until the freeze, then holds what arrives.
func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-f.frozen:
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) freeze() { f.once.Do(func() { close(f.frozen) }) }

// close ends every connection, so what waits on the frozen database fails at once.
func (f *freezer) close() {
	f.freeze()
	f.ln.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
}

// dsnVia is dsn reaching its database through addr.
func dsnVia(t *testing.T, dsn, addr string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// TestExecutionStopsBeforeItsLeaseEndsWhenTheDatabaseStopsAnswering runs an operation on a
// replica whose database then stops answering (a renewal hangs for its whole timeout). The
// upstream call must be stopped before the lease the database holds for it ends: from then on
// another replica may take it over (docs/backends.md).
//
// Serial: it measures a margin of takeover/10 (200 ms), which four parallel tests under the race
// detector on two cores can eat.
func TestExecutionStopsBeforeItsLeaseEndsWhenTheDatabaseStopsAnswering(t *testing.T) {
	dsn := pgtest.Database(t)
	direct, _ := url.Parse(dsn)
	proxy := newFreezer(t, direct.Host)
	started, canceled := make(chan struct{}, 1), make(chan time.Time, 1)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		started <- struct{}{}
		<-r.Context().Done()
		canceled <- time.Now()
	})
	g := startHandlerWith(t, gatewaySetup{upstream: upstream, mulligan: "storage postgres " + dsnVia(t, dsn, proxy.ln.Addr().String()) + "\nasync {\n takeover 2s\n}"})
	t.Cleanup(proxy.close)
	_, op := g.submit(t, "")
	<-started
	proxy.freeze()
	var stoppedAt time.Time
	select {
	case stoppedAt = <-canceled:
	case <-time.After(20 * time.Second):
		t.Fatal("the upstream call was not stopped within 20s of the database going silent")
	}
	leaseUntil := leaseOf(t, dsn, op.OperationID)
	t.Logf("upstream call stopped %v before the lease ended", leaseUntil.Sub(stoppedAt))
	if !stoppedAt.Before(leaseUntil) {
		t.Fatalf("the upstream call ran on %v past its lease: another replica could have run it meanwhile", stoppedAt.Sub(leaseUntil))
	}
}

// leaseOf reads an operation's lease end from the database itself.
func leaseOf(t *testing.T, dsn, id string) time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var until time.Time
	if err := conn.QueryRow(ctx, `SELECT lease_until FROM operations WHERE id = $1`, id).Scan(&until); err != nil {
		t.Fatal(err)
	}
	return until
}
