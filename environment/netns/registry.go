package netns

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
)

// The fixed addresses Berth serves on every workspace namespace's loopback. They are below 1024:
// the run user has no capability in a namespace Berth made, so it can bind none of them, and no
// dev server a run starts can collide with them.
const (
	APIAddr   = "127.0.0.1:80" // Berth's API (and MCP), bridged to the node
	ProxyAddr = "127.0.0.1:81" // the egress proxy: HTTP forward and CONNECT
	SocksAddr = "127.0.0.1:82" // the egress proxy: SOCKS5
)

// poolSize is how many namespaces are kept made ahead of need.
const poolSize = 2

// Setup opens what Berth serves inside a new namespace of workspace key (its API bridge, its
// egress proxy); the closer runs when the namespace is let go.
type Setup func(key string, ns *Namespace) (io.Closer, error)

// Networks are this node's workspace namespaces: one per key (an execution workspace, a setup
// session) while a jail of it lives, shared by all of them (a run reaches its own services, and
// nothing else). It is safe for concurrent use.
type Networks struct {
	setup Setup
	mu    sync.Mutex
	byKey map[string]*entry
	pool  chan *Namespace
	fill  chan struct{}
	done  chan struct{}
	once  sync.Once
}

type entry struct {
	ns     *Namespace
	refs   int
	closer io.Closer
}

// NewNetworks makes the registry and starts keeping its pool full; ErrUnavailable when this
// process cannot make namespaces.
func NewNetworks(setup Setup) (*Networks, error) {
	if !Available() {
		return nil, ErrUnavailable
	}
	n := &Networks{setup: setup, byKey: map[string]*entry{}, pool: make(chan *Namespace, poolSize),
		fill: make(chan struct{}, 1), done: make(chan struct{})}
	go n.keepFull()
	n.refill()
	return n, nil
}

// keepFull makes namespaces ahead of need until Close.
func (n *Networks) keepFull() {
	for {
		select {
		case <-n.done:
			return
		case <-n.fill:
		}
		for len(n.pool) < cap(n.pool) {
			ns, err := New()
			if err != nil {
				break // made on demand instead (Acquire reports the error)
			}
			select {
			case n.pool <- ns:
			case <-n.done:
				ns.Close()
				return
			}
		}
	}
}

func (n *Networks) refill() {
	select {
	case n.fill <- struct{}{}:
	default:
	}
}

// Acquire is key's namespace, made (with Setup) when no jail of key holds one; release lets it
// go, and the last release ends it.
func (n *Networks) Acquire(key string) (*Namespace, func(), error) {
	if key == "" {
		return nil, nil, fmt.Errorf("netns: a namespace needs a key")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.byKey[key]
	if !ok {
		var ns *Namespace
		select {
		case ns = <-n.pool:
			n.refill()
		default:
			var err error
			if ns, err = New(); err != nil {
				return nil, nil, err
			}
		}
		e = &entry{ns: ns}
		if n.setup != nil {
			c, err := n.setup(key, ns)
			if err != nil {
				ns.Close()
				return nil, nil, fmt.Errorf("netns: set up %s: %w", key, err)
			}
			e.closer = c
		}
		n.byKey[key] = e
	}
	e.refs++
	var once sync.Once
	return e.ns, func() { once.Do(func() { n.release(key, e) }) }, nil
}

func (n *Networks) release(key string, e *entry) {
	n.mu.Lock()
	e.refs--
	last := e.refs == 0 && n.byKey[key] == e
	if last {
		delete(n.byKey, key)
	}
	n.mu.Unlock()
	if last {
		if e.closer != nil {
			e.closer.Close()
		}
		e.ns.Close()
	}
}

// Dial connects to addr in key's namespace, while a jail of key holds it.
func (n *Networks) Dial(ctx context.Context, key, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	e, ok := n.byKey[key]
	n.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("netns: %s has no live network: %w", key, net.ErrClosed)
	}
	return e.ns.Dial(ctx, network, addr)
}

// Close stops keeping the pool full and closes the namespaces in it (those held by jails end
// with their last release).
func (n *Networks) Close() {
	n.once.Do(func() {
		close(n.done)
		for {
			select {
			case ns := <-n.pool:
				ns.Close()
			default:
				return
			}
		}
	})
}
