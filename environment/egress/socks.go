package egress

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"time"
)

// SOCKS5 (RFC 1928), CONNECT only, no authentication: for TCP that is not HTTP (a database, a
// git:// or ssh remote), with ALL_PROXY=socks5h://… so the proxy resolves names itself.
const (
	socksVersion        = 5
	socksNoAuth         = 0
	socksNoAcceptable   = 0xff
	socksConnect        = 1
	socksAtypIPv4       = 1
	socksAtypDomain     = 3
	socksAtypIPv6       = 4
	socksOK             = 0
	socksGeneralFailure = 1
	socksNotAllowed     = 2 // connection not allowed by ruleset
	socksHostUnreach    = 4
	socksRefused        = 5
	socksCmdUnsupported = 7
	socksAtypUnsupport  = 8
)

// socksHandshakeTimeout bounds the greeting and the request.
const socksHandshakeTimeout = 30 * time.Second

// ServeSOCKS serves SOCKS5 on l for the jails of key, until l is closed.
func (p *Proxy) ServeSOCKS(l net.Listener, key string) {
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		go p.serveSOCKS(c, key)
	}
}

func (p *Proxy) serveSOCKS(c net.Conn, key string) {
	_ = c.SetDeadline(time.Now().Add(socksHandshakeTimeout))
	r := bufio.NewReader(c)
	host, port, err := socksRequest(r, c)
	if err != nil {
		c.Close()
		return
	}
	d, _ := p.decide(context.Background(), key, host, port)
	e := Event{Via: "socks", Host: host, Port: port, Allowed: d.Allowed, Rule: d.Rule}
	p.observe(key, e)
	if !d.Allowed {
		code := byte(socksNotAllowed)
		if d.Rule == "no address" {
			code = socksHostUnreach
		}
		socksReply(c, code)
		c.Close()
		return
	}
	up, err := p.dialAddrs(context.Background(), d.Addrs, port)
	if err != nil {
		socksReply(c, socksRefused)
		c.Close()
		return
	}
	if err := socksReply(c, socksOK); err != nil {
		c.Close()
		up.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	pipe(c, r, up)
}

// socksRequest reads the greeting (answering no-authentication) and the CONNECT request.
func socksRequest(r *bufio.Reader, w io.Writer) (string, int, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil || hdr[0] != socksVersion {
		return "", 0, errors.New("socks: not SOCKS5")
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(r, methods); err != nil {
		return "", 0, err
	}
	ok := false
	for _, m := range methods {
		ok = ok || m == socksNoAuth
	}
	if !ok {
		_, _ = w.Write([]byte{socksVersion, socksNoAcceptable})
		return "", 0, errors.New("socks: no acceptable method")
	}
	if _, err := w.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return "", 0, err
	}
	var req [4]byte
	if _, err := io.ReadFull(r, req[:]); err != nil || req[0] != socksVersion {
		return "", 0, errors.New("socks: bad request")
	}
	if req[1] != socksConnect {
		socksReply(w, socksCmdUnsupported)
		return "", 0, errors.New("socks: only CONNECT")
	}
	var host string
	switch req[3] {
	case socksAtypIPv4, socksAtypIPv6:
		n := 4
		if req[3] == socksAtypIPv6 {
			n = 16
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", 0, err
		}
		a, _ := netip.AddrFromSlice(b)
		host = a.Unmap().String()
	case socksAtypDomain:
		l, err := r.ReadByte()
		if err != nil {
			return "", 0, err
		}
		b := make([]byte, l)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", 0, err
		}
		host = string(b)
	default:
		socksReply(w, socksAtypUnsupport)
		return "", 0, errors.New("socks: address type")
	}
	var pb [2]byte
	if _, err := io.ReadFull(r, pb[:]); err != nil {
		return "", 0, err
	}
	port := int(binary.BigEndian.Uint16(pb[:]))
	if port == 0 {
		socksReply(w, socksGeneralFailure)
		return "", 0, errors.New("socks: port 0")
	}
	return host, port, nil
}

// socksReply answers a request with code and an unspecified bound address.
func socksReply(w io.Writer, code byte) error {
	_, err := w.Write([]byte{socksVersion, code, 0, socksAtypIPv4, 0, 0, 0, 0, 0, 0})
	return err
}
