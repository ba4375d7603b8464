package testkit

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// CutProxy forwards loopback TCP connections to a target until Cut, which closes every
// connection through it and refuses new ones, as a network partition between a replica and its
// database does; Restore lets connections through again. It closes when the test ends.
type CutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartCutProxy listens on a free loopback port and forwards to target (host:port).
func StartCutProxy(t testing.TB, target string) *CutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &CutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection through the proxy and refuses new ones until Restore.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// Restore lets new connections through again.
func (p *CutProxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *CutProxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.forward(in) })
	}
}

// forward pipes in to a new connection to the target, both ways, until either side closes.
func (p *CutProxy) forward(in net.Conn) {
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = in.Close()
		return
	}
	if !p.track(in, out) {
		_ = in.Close()
		_ = out.Close()
		return
	}
	var pipes sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
	}
	pipes.Go(func() { pipe(out, in) })
	pipes.Go(func() { pipe(in, out) })
	pipes.Wait()
	p.mu.Lock()
	delete(p.conns, in)
	delete(p.conns, out)
	p.mu.Unlock()
}

// track notes a forwarded pair, so that Cut closes it; false while cut.
func (p *CutProxy) track(in, out net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[in], p.conns[out] = struct{}{}, struct{}{}
	return true
}

// CutDSN is dsn (a URL, such as PostgreSQL's) reaching its host through a CutProxy the test can
// cut, as a network partition cuts a replica off its database.
func CutDSN(t testing.TB, dsn string) (string, *CutProxy) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("the DSN is not a URL with a host: %q %v", dsn, err)
	}
	proxy := StartCutProxy(t, u.Host)
	u.Host = proxy.Addr()
	return u.String(), proxy
}
