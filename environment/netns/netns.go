// Package netns gives the jails of one execution workspace a network namespace of their own
// (DESIGN §15): only its own loopback, so nothing on the host's loopback (Berth's listeners, the
// internal listener, PostgreSQL, other workspaces' dev servers, any local daemon) is reachable
// from a run or a service. Berth reaches into it from the outside, never the other way round: it
// creates sockets inside the namespace on an OS thread that has entered it (setns), and uses them
// from anywhere, since a socket stays in the namespace it was made in. That is how the workspace
// gets Berth's API and egress proxy on its own loopback (listeners Berth serves) and how the
// preview listener and health checks dial a service there. A jail is started inside the namespace
// by forking bubblewrap from such a thread.
//
// Creating a network namespace needs CAP_SYS_ADMIN: this package works when Berth is root
// (Available). Namespaces are made ahead of need (a small pool), so a jail's start does not wait
// for the kernel to set one up.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrUnavailable means this process cannot make network namespaces (it is not root).
var ErrUnavailable = errors.New("network namespaces unavailable")

// Namespace is one network namespace with its loopback up. It lives while its handle is open.
type Namespace struct {
	mu sync.RWMutex // Close waits for a Do that is entering the namespace through f
	f  *os.File     // nil once closed
}

// Available reports whether this process can make network namespaces.
func Available() bool { return os.Geteuid() == 0 }

// host is the network namespace Berth itself runs in, where every thread returns to.
var host = sync.OnceValues(func() (*os.File, error) {
	f, err := os.Open("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("netns: host namespace: %w", err)
	}
	return f, nil
})

// New makes a network namespace with only a loopback interface, up.
func New() (*Namespace, error) {
	if !Available() {
		return nil, ErrUnavailable
	}
	var ns *os.File
	err := onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		if err := loopbackUp(); err != nil {
			return err
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return err
		}
		ns = f
		return nil
	})
	if err != nil {
		if ns != nil {
			ns.Close()
		}
		return nil, fmt.Errorf("netns: new: %w", err)
	}
	return &Namespace{f: ns}, nil
}

// Close drops this handle; the namespace ends when nothing else (a process, a socket) is in it.
func (n *Namespace) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.f == nil {
		return nil
	}
	err := n.f.Close()
	n.f = nil
	return err
}

// Do runs fn on an OS thread inside the namespace: sockets fn makes are in the namespace, and so
// are processes it forks (bubblewrap started there keeps the namespace for its jail).
func (n *Namespace) Do(fn func() error) error {
	return onThread(func() error {
		if err := n.enter(); err != nil {
			return err
		}
		return fn()
	})
}

// enter moves the calling (locked) thread into the namespace; a closed handle is net.ErrClosed.
func (n *Namespace) enter() error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.f == nil {
		return fmt.Errorf("netns: enter: %w", net.ErrClosed)
	}
	if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("netns: enter: %w", err)
	}
	return nil
}

// Dial connects to addr inside the namespace.
func (n *Namespace) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens on addr inside the namespace.
func (n *Namespace) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// onThread runs fn on a locked OS thread and puts the thread back into Berth's own network
// namespace before it is released. A thread that cannot be put back stays locked, and the Go
// runtime ends it with its goroutine: it never runs anything of Berth's again.
func onThread(fn func() error) error {
	h, err := host()
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := fn()
		if rerr := unix.Setns(int(h.Fd()), unix.CLONE_NEWNET); rerr != nil {
			done <- errors.Join(err, fmt.Errorf("netns: return to the host namespace: %w", rerr))
			return // still locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// loopbackUp brings lo up in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}
