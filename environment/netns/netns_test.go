package netns

import (
	"context"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestNamespaceIsolation: a listener made in a namespace answers a dial in the same namespace,
// is not on the host's loopback, and a host listener is not reachable from inside; a process
// forked inside sees only its own loopback. The negative control dials the host listener from
// the host.
func TestNamespaceIsolation(t *testing.T) {
	if !Available() {
		t.Skip("network namespaces need root")
	}
	t.Parallel()
	ns, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	inside, err := ns.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	go func() {
		for {
			c, err := inside.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "inside\n")
			c.Close()
		}
	}()
	hostL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostL.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c, err := ns.Dial(ctx, "tcp", inside.Addr().String())
	if err != nil {
		t.Fatalf("dial inside: %v", err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "inside\n" {
		t.Fatalf("inside answered %q", b)
	}
	if c, err := net.DialTimeout("tcp", inside.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the namespace's listener is on the host's loopback")
	}
	if c, err := ns.Dial(ctx, "tcp", hostL.Addr().String()); err == nil {
		c.Close()
		t.Fatal("the host's listener is reachable from inside")
	}
	if c, err := net.DialTimeout("tcp", hostL.Addr().String(), time.Second); err != nil {
		t.Fatalf("negative control: the host listener from the host: %v", err)
	} else {
		c.Close()
	}
	// A process forked inside has only lo.
	var out []byte
	if err := ns.Do(func() error {
		var err error
		out, err = exec.Command("cat", "/proc/net/dev").Output()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(out), ":"); lines != 1 || !strings.Contains(string(out), "lo:") {
		t.Fatalf("interfaces inside:\n%s", out)
	}
	// The thread went back: a listener made now is on the host.
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l2.Close()
}

// TestNetworksShareAndRelease: jails of one key share a namespace until the last release.
func TestNetworksShareAndRelease(t *testing.T) {
	if !Available() {
		t.Skip("network namespaces need root")
	}
	t.Parallel()
	setups := 0
	n, err := NewNetworks(func(key string, ns *Namespace) (io.Closer, error) {
		setups++
		return ns.Listen("tcp", APIAddr)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	a, relA, err := n.Acquire("ws-1")
	if err != nil {
		t.Fatal(err)
	}
	b, relB, err := n.Acquire("ws-1")
	if err != nil || a != b || setups != 1 {
		t.Fatalf("second acquire: %v same=%v setups=%d", err, a == b, setups)
	}
	other, relO, err := n.Acquire("ws-2")
	if err != nil || other == a {
		t.Fatalf("another key shares: %v", err)
	}
	relO()
	ctx := context.Background()
	if c, err := n.Dial(ctx, "ws-1", "tcp", APIAddr); err != nil {
		t.Fatalf("dial the set-up listener: %v", err)
	} else {
		c.Close()
	}
	relA()
	if _, err := n.Dial(ctx, "ws-1", "tcp", APIAddr); err != nil {
		t.Fatalf("one holder left: %v", err)
	}
	relB()
	if _, err := n.Dial(ctx, "ws-1", "tcp", APIAddr); err == nil {
		t.Fatal("a released namespace still dials")
	}
}
