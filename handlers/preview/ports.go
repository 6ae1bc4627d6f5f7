package preview

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"berth/db"
)

// PortRange is BERTH_PREVIEW_PORTS: the ports the preview listener gives running services, one
// each. The zero value takes whatever free port the kernel picks.
type PortRange struct{ Lo, Hi int }

// DefaultPorts is BERTH_PREVIEW_PORTS when unset (DESIGN §14).
var DefaultPorts = PortRange{Lo: 18100, Hi: 18199}

// ParsePorts reads "LO-HI" (or one port).
func ParsePorts(s string) (PortRange, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return DefaultPorts, nil
	}
	lo, hi, found := strings.Cut(s, "-")
	a, err1 := strconv.Atoi(strings.TrimSpace(lo))
	b := a
	var err2 error
	if found {
		b, err2 = strconv.Atoi(strings.TrimSpace(hi))
	}
	if err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
		return PortRange{}, fmt.Errorf("BERTH_PREVIEW_PORTS %q: use a range like 18100-18199", s)
	}
	return PortRange{Lo: a, Hi: b}, nil
}

// ports holds one listener per service that has a preview URL. The mapping lives in this
// process: with several web replicas use BERTH_PREVIEW_DOMAIN (docs/previews.md).
type ports struct {
	p     *Proxy
	rng   PortRange
	bind  string
	mu    sync.Mutex
	by    map[string]*portListener // service id
	taken map[int]bool
}

type portListener struct {
	port int
	ln   net.Listener
	srv  *http.Server
}

func newPorts(p *Proxy, rng PortRange, bind string) *ports {
	return &ports{p: p, rng: rng, bind: bind, by: map[string]*portListener{}, taken: map[int]bool{}}
}

// lookup is service id's port, if it has one.
func (ps *ports) lookup(id string) (int, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if l, ok := ps.by[id]; ok {
		return l.port, true
	}
	return 0, false
}

// assign gives service id a port and opens its listener. When the range is full, ports of
// services that no longer run are taken back first.
func (ps *ports) assign(id string) (int, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if l, ok := ps.by[id]; ok {
		return l.port, true
	}
	ln, err := ps.listen()
	if errors.Is(err, errPortsFull) && ps.reclaim() > 0 {
		ln, err = ps.listen()
	}
	if err != nil {
		ps.p.cfg.Log.Warn("preview listener", "service_id", id, "err", err)
		return 0, false
	}
	port := ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ps.p.serveOrigin(w, r, id) }),
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	l := &portListener{port: port, ln: ln, srv: srv}
	ps.by[id], ps.taken[port] = l, true
	go func() { _ = srv.Serve(ln) }()
	return port, true
}

var errPortsFull = errors.New("every port of BERTH_PREVIEW_PORTS is in use")

// listen binds the first free port of the range. Callers hold the lock.
func (ps *ports) listen() (net.Listener, error) {
	if ps.rng.Lo == 0 {
		return net.Listen("tcp", net.JoinHostPort(ps.bind, "0"))
	}
	for port := ps.rng.Lo; port <= ps.rng.Hi; port++ {
		if ps.taken[port] {
			continue
		}
		if ln, err := net.Listen("tcp", net.JoinHostPort(ps.bind, strconv.Itoa(port))); err == nil {
			return ln, nil
		}
	}
	return nil, errPortsFull
}

// reclaim closes the listeners of services that are not starting or running any more (or are
// gone) and reports how many. Callers hold the lock.
func (ps *ports) reclaim() int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := 0
	for id, l := range ps.by {
		svc, err := db.RuntimeServiceForProxy(ctx, ps.p.cfg.Pool, id)
		if err == nil && live(svc) || err != nil && !errors.Is(err, db.ErrNotFound) {
			continue
		}
		_ = l.srv.Close()
		delete(ps.by, id)
		delete(ps.taken, l.port)
		n++
	}
	return n
}

func (ps *ports) close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for id, l := range ps.by {
		_ = l.srv.Close()
		delete(ps.by, id)
	}
	clear(ps.taken)
}
