package db

import (
	"context"
	"net"
	"syscall"
	"testing"
)

// TestListenerConnectionProbesItsPeer: the listener's TCP connection carries the keepalive that
// replaced its ping (15 s idle, 5 s apart, 3 probes), read back from the socket; a connection
// dialled without keepAliveDial (the control) does not.
func TestListenerConnectionProbesItsPeer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	plain := (&net.Dialer{KeepAlive: -1}).DialContext
	opts := func(c net.Conn) [4]int {
		t.Helper()
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got [4]int
		_ = raw.Control(func(fd uintptr) {
			for i, o := range []struct{ level, opt int }{{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE}, {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT}} {
				got[i], _ = syscall.GetsockoptInt(int(fd), o.level, o.opt)
			}
		})
		return got
	}
	for _, tc := range []struct {
		name string
		dial func(context.Context, string, string) (net.Conn, error)
		want bool
	}{{"listener", keepAliveDial(plain), true}, {"control", plain, false}} {
		c, err := tc.dial(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		got := opts(c)
		c.Close()
		if is := got == [4]int{1, 15, 5, 3}; is != tc.want {
			t.Errorf("%s: keepalive, idle, interval, count = %v", tc.name, got)
		}
	}
}
