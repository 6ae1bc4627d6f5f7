package preview

import (
	"context"
	"errors"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

// The preview's own forwarder serves every request but a protocol upgrade (a WebSocket goes
// through httputil.ReverseProxy, p.rp). It keeps that proxy's rules (hop-by-hop headers dropped
// both ways, forwarded headers Berth's own, framing left to net/http on both sides) and adds the
// preview's: Berth's credentials never reach the service, the service's Set-Cookie (a trailer
// included) never reaches beyond its origin, and it never switches protocols unasked. What it
// saves per request is the reverse proxy's: a cloned request and header map, and the flush
// policy for a body of unknown length, which sends the header, each read and the end in
// separate writes (and the header from a goroutine of its own). Here such a body is flushed only
// when the service keeps the proxy waiting for more (streamFlushDelay), so a stream's bytes go
// out as they come and a response that came in one piece goes out in as few writes as net/http
// allows.

// hopHeaders are the hop-by-hop headers (RFC 9110 §7.6.1), never passed on either way.
var hopHeaders = map[string]bool{"Connection": true, "Proxy-Connection": true, "Keep-Alive": true,
	"Proxy-Authenticate": true, "Proxy-Authorization": true, "Te": true, "Trailer": true,
	"Transfer-Encoding": true, "Upgrade": true}

// berthRequestHeaders are a request's headers that are Berth's to set or never the service's:
// the credential, and the forwarded headers a client could forge.
var berthRequestHeaders = map[string]bool{"Authorization": true, "Cookie": true, "Forwarded": true,
	"X-Forwarded-For": true, "X-Forwarded-Host": true, "X-Forwarded-Proto": true, "X-Forwarded-Prefix": true}

// forward sends r to t's service and its answer back.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, t *target) {
	ctx := context.WithValue(r.Context(), targetKey{}, t)
	if upgrade(r.Header) {
		p.rp.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	out := r.WithContext(ctx) // a shallow copy: what it shares with r is only read
	u := *r.URL
	u.Scheme, u.Host, u.Opaque, u.User = "http", "127.0.0.1:"+strconv.Itoa(t.svc.Port), "", nil
	out.URL = &u
	out.Host = "" // the service's own 127.0.0.1:PORT (dev servers refuse foreign names)
	out.RequestURI, out.Close = "", false
	out.Header = p.outHeader(r, t)
	if r.ContentLength == 0 {
		out.Body = nil
	}
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		p.upstreamFailed(w, r, t, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		p.upstreamFailed(w, r, t, errors.New("preview: the service switched protocols unasked"))
		return
	}
	h := w.Header()
	copyHeader(h, resp.Header)
	p.confineSetCookies(h)
	announced := len(resp.Trailer)
	if announced > 0 {
		names := make([]string, 0, announced)
		for k := range resp.Trailer {
			if k != "Set-Cookie" && !hopHeaders[k] {
				names = append(names, k)
			}
		}
		h.Set("Trailer", strings.Join(names, ", "))
	}
	if err := p.copyBody(w, resp, announced == 0); err != nil {
		panic(http.ErrAbortHandler) // a truncated body must not look complete to the browser
	}
	resp.Body.Close() // now, to read the trailer
	if len(resp.Trailer) == 0 {
		return
	}
	_ = http.NewResponseController(w).Flush() // chunked, so that a trailer can follow
	for k, vv := range resp.Trailer {
		if k == "Set-Cookie" || hopHeaders[k] {
			continue
		}
		if len(resp.Trailer) != announced {
			k = http.TrailerPrefix + k
		}
		h[k] = vv
	}
}

// upstreamFailed answers a request whose service did not answer (nothing when the browser went
// away) and drops the service's cached row.
func (p *Proxy) upstreamFailed(w http.ResponseWriter, r *http.Request, t *target, err error) {
	if r.Context().Err() != nil {
		return
	}
	p.cache.forget(t.svc.ID)
	p.fail(w, r, t.svc.ID, err)
}

// upgrade reports whether h asks to switch protocols (Connection: upgrade).
func upgrade(h http.Header) bool {
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// outHeader is the header the service gets for r: r's own less the hop-by-hop headers (and
// those its Connection header names), Berth's credentials and cookies, and forwarded headers
// from the client; plus Berth's X-Forwarded-*. Values are shared with r's header, capped so
// that an append can never write into r's.
func (p *Proxy) outHeader(r *http.Request, t *target) http.Header {
	in := r.Header
	h := make(http.Header, len(in)+3)
	for k, vv := range in {
		if !hopHeaders[k] && !berthRequestHeaders[k] {
			h[k] = vv[:len(vv):len(vv)]
		}
	}
	for _, v := range in["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = textproto.TrimString(tok); tok != "" {
				delete(h, textproto.CanonicalMIMEHeaderKey(tok))
			}
		}
	}
	if cookies := p.appCookies(in["Cookie"]); len(cookies) > 0 {
		h["Cookie"] = cookies
	}
	for _, v := range in["Te"] {
		if strings.Contains(v, "trailers") {
			h["Te"] = []string{"trailers"}
		}
	}
	if _, ok := in["User-Agent"]; !ok {
		h["User-Agent"] = []string{""} // none, rather than Go's
	}
	if t.prefix != "" {
		h["X-Forwarded-Prefix"] = []string{t.prefix}
	}
	h["X-Forwarded-Proto"] = []string{t.proto}
	h["X-Forwarded-Host"] = []string{r.Host}
	return h
}

// copyHeader adds the service's response header to h, less the hop-by-hop headers (and those
// its Connection header names).
func copyHeader(h, from http.Header) {
	for k, vv := range from {
		if !hopHeaders[k] {
			h[k] = vv
		}
	}
	for _, v := range from["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = textproto.TrimString(tok); tok != "" {
				delete(h, textproto.CanonicalMIMEHeaderKey(tok))
			}
		}
	}
}
