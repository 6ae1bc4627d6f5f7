package preview

import (
	"net/http"
	"net/url"
	"testing"
	"time"
)

// TestSafeNext: a ticket's next is a path of the same origin, never another site.
func TestSafeNext(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"/": "/", "/a/b?c=1": "/a/b?c=1", "": "/", "//evil.example/x": "/",
		"/\\evil.example": "/", "https://evil.example/": "/", "/a\r\nSet-Cookie: x": "/", "relative": "/"} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSameOriginOrNavigation: a preview cookie counts for its own origin's requests and for
// top-level navigations, not for another page's fetch.
func TestSameOriginOrNavigation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		h    map[string]string
		want bool
	}{
		{nil, true},
		{map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost:18100"}, true},
		{map[string]string{"Sec-Fetch-Site": "none"}, true},
		{map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}, false},
		{map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}, false},
		{map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}, true},
		{map[string]string{"Origin": "http://localhost:18101"}, false},
		{map[string]string{"Origin": "null"}, false},
	}
	for _, tc := range cases {
		r, _ := http.NewRequest(http.MethodGet, "http://localhost:18100/", nil)
		for k, v := range tc.h {
			r.Header.Set(k, v)
		}
		if got := sameOriginOrNavigation(r); got != tc.want {
			t.Errorf("%v = %v, want %v", tc.h, got, tc.want)
		}
	}
}

// TestConfineSetCookies: Berth's names are dropped, Domain removed, the rest kept as is.
func TestConfineSetCookies(t *testing.T) {
	t.Parallel()
	p := &Proxy{cfg: Config{BerthCookies: []string{"__Host-berth_session"}}}
	h := http.Header{}
	for _, v := range []string{"app=1; Path=/", "berth_session=x", "__Host-berth_session=x; Path=/; Secure",
		"berth_preview_abc=x", "__Secure-berth_preview_abc=x; Secure", "wide=1; Domain=example.com; Path=/", "garbage"} {
		h.Add("Set-Cookie", v)
	}
	p.confineSetCookies(h)
	got := h.Values("Set-Cookie")
	if len(got) != 2 || got[0] != "app=1; Path=/" || got[1] != "wide=1; Path=/" {
		t.Fatalf("confined = %q", got)
	}
}

// TestCookieSignature: a preview cookie is valid only for its service, unexpired and unaltered.
func TestCookieSignature(t *testing.T) {
	t.Parallel()
	p := &Proxy{cfg: Config{Key: []byte("0123456789abcdef0123456789abcdef")}}
	const svc, other, user = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222", "33333333-3333-3333-3333-333333333333"
	req := func(name, value string) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, "http://localhost:18100/", nil)
		r.AddCookie(&http.Cookie{Name: name, Value: value})
		return r
	}
	good := p.cookieValue(svc, user, farFuture)
	if u, ok := p.cookieUser(req(cookieName(svc), good), svc); !ok || u != user {
		t.Fatalf("a valid cookie = %q %v", u, ok)
	}
	for name, c := range map[string]*http.Request{
		"another service's name": req(cookieName(other), good),
		"expired":                req(cookieName(svc), p.cookieValue(svc, user, past)),
		"other user, same mac":   req(cookieName(svc), "44444444-4444-4444-4444-444444444444"+good[len(user):]),
		"garbage":                req(cookieName(svc), "x.y.z"),
	} {
		if _, ok := p.cookieUser(c, svc); ok {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, ok := p.cookieUser(req(cookieName(other), p.cookieValue(svc, user, farFuture)), other); ok {
		t.Error("a cookie signed for one service accepted by another")
	}
}

// TestParsePortsAndHost: BERTH_PREVIEW_PORTS and the service hosts of BERTH_PREVIEW_DOMAIN.
func TestParsePortsAndHost(t *testing.T) {
	t.Parallel()
	if r, err := ParsePorts(""); err != nil || r != DefaultPorts {
		t.Fatalf("default = %v %v", r, err)
	}
	if r, err := ParsePorts("41000-41099"); err != nil || r != (PortRange{41000, 41099}) {
		t.Fatalf("range = %v %v", r, err)
	}
	for _, bad := range []string{"x", "5-1", "0-3", "1-70000"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	berth, _ := url.Parse("https://berth.example.com")
	p := &Proxy{cfg: Config{Domain: "preview.example.com", Berth: berth}}
	const id = "11111111-1111-1111-1111-111111111111"
	for host, want := range map[string]bool{id + ".preview.example.com": true, id + ".Preview.Example.com.:443": true,
		"preview.example.com": false, "x." + id + ".preview.example.com": false, id + ".example.com": false,
		"berth.example.com": false, "nope.preview.example.com": false} {
		if got, ok := p.ServiceForHost(host); ok != want || ok && got != id {
			t.Errorf("%s = %q %v, want %v", host, got, ok, want)
		}
	}
}

var (
	farFuture = time.Now().Add(24 * 3600e9)
	past      = time.Now().Add(-1e9)
)
