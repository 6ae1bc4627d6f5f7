package handlers

import (
	"context"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"berth/db"
)

func TestLoginDelay(t *testing.T) {
	t.Parallel()
	l := LoginLimit{PerAccount: 3, PerAddress: 10, MaxDelay: time.Minute}.withDefaults()
	cases := []struct {
		name string
		f    db.LoginFailures
		want time.Duration
	}{
		{"nothing failed", db.LoginFailures{}, 0},
		{"free account failures", db.LoginFailures{Account: 2, Address: 2}, 0},
		{"first paid account failure", db.LoginFailures{Account: 3, Address: 3}, time.Second},
		{"doubling", db.LoginFailures{Account: 6, Address: 6, AccountSince: 3 * time.Second}, 5 * time.Second},
		{"capped", db.LoginFailures{Account: 60, Address: 60, AddressSince: time.Hour}, time.Minute},
		{"wait over", db.LoginFailures{Account: 6, Address: 6, AccountSince: 9 * time.Second, AddressSince: 9 * time.Second}, 0},
		{"clean address ignores the account's wait", db.LoginFailures{Account: 60}, 0},
		{"address wait", db.LoginFailures{Address: 11, AddressSince: time.Second}, time.Second},
	}
	for _, tc := range cases {
		if got := l.loginWait(tc.f); got != tc.want {
			t.Errorf("%s: wait %v, want %v", tc.name, got, tc.want)
		}
	}
	if l.Window < l.MaxDelay {
		t.Errorf("window %v shorter than the longest delay %v", l.Window, l.MaxDelay)
	}
}

func TestForwardedClient(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	cases := []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"untrusted peer: header ignored", "198.51.100.1", []string{"1.2.3.4"}, "198.51.100.1"},
		{"one proxy", "10.0.0.1", []string{"203.0.113.9"}, "203.0.113.9"},
		{"spoofed left hops ignored", "10.0.0.1", []string{"6.6.6.6, 203.0.113.9"}, "203.0.113.9"},
		{"proxy chain", "10.0.0.1", []string{"203.0.113.9, 10.0.0.7", "10.1.1.1"}, "203.0.113.9"},
		{"malformed hop stops at the last real one", "10.0.0.1", []string{"203.0.113.9, junk"}, "10.0.0.1"},
		{"no header", "10.0.0.1", nil, "10.0.0.1"},
		{"v6 proxy", "::1", []string{"2001:db8::5"}, "2001:db8::5"},
		{"all trusted", "10.0.0.1", []string{"10.0.0.2"}, "10.0.0.2"},
	}
	for _, tc := range cases {
		if got := forwardedClient(tc.peer, tc.xff, trusted); got != tc.want {
			t.Errorf("%s: client %q, want %q", tc.name, got, tc.want)
		}
	}
}

// loginFrom posts the sign-in form with X-Forwarded-For set to addr.
func (e *testEnv) loginFrom(addr, email, password string) *http.Response {
	e.t.Helper()
	form := url.Values{"email": {email}, "password": {password}}
	return e.do(e.client(), http.MethodPost, "/login", strings.NewReader(form.Encode()),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Forwarded-For": addr})
}

func TestLoginThrottle(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) {
		d.LoginLimit = LoginLimit{PerAccount: 5, PerAddress: 8}
		d.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	e.user("ada@example.com", "correct horse battery", false)
	const attacker, owner, other = "203.0.113.5", "198.51.100.7", "192.0.2.44"
	ctx := context.Background()

	for i := range 5 {
		if resp := e.loginFrom(attacker, "ada@example.com", "wrong-password"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("free failure %d: status %d, want 401", i, resp.StatusCode)
		}
	}
	if n := e.count(`SELECT count(*) FROM login_attempts WHERE ip = $1`, attacker); n != 5 {
		t.Fatalf("attempts recorded for the forwarded address = %d, want 5", n)
	}
	// The sixth attempt must wait (about a second), and a refused attempt is not counted.
	resp := e.loginFrom(attacker, "ada@example.com", "wrong-password")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("after 5 failures: status %d Retry-After %q, want 429 and 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := e.count(`SELECT count(*) FROM login_attempts WHERE ip = $1`, attacker); n != 5 {
		t.Fatalf("a throttled attempt was recorded: %d attempts, want 5", n)
	}

	// Five more failures: the wait has doubled five times (32 s), even for the right password.
	for range 5 {
		if err := db.RecordLoginAttempt(ctx, e.pool, "ada@example.com", attacker, false); err != nil {
			t.Fatal(err)
		}
	}
	resp = e.loginFrom(attacker, "ada@example.com", "correct horse battery")
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || ra < 20 || ra > 32 || sessionCookie(resp) != nil {
		t.Fatalf("after 10 failures: status %d Retry-After %q, want 429 with 20..32 s and no session", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'login.rate_limited'`); n != 2 {
		t.Fatalf("rate-limit audit events = %d, want 2", n)
	}

	// The owner, from an address that has not been failing, still gets in meanwhile.
	if resp := e.loginFrom(owner, "ada@example.com", "correct horse battery"); resp.StatusCode != http.StatusSeeOther || sessionCookie(resp) == nil {
		t.Fatalf("owner from a clean address: status %d, want 303 with a session", resp.StatusCode)
	}
	// ...and the owner's success does not clear the attacker's wait.
	if resp := e.loginFrom(attacker, "ada@example.com", "correct horse battery"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("attacker after the owner's sign-in: status %d, want 429", resp.StatusCode)
	}
	// A new address gets its password checked once; having failed, it shares the account's wait.
	if resp := e.loginFrom(other, "ada@example.com", "wrong-password"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("new address, wrong password: status %d, want 401", resp.StatusCode)
	}
	if resp := e.loginFrom(other, "ada@example.com", "correct horse battery"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("failing address, right password during the wait: status %d, want 429", resp.StatusCode)
	}

	// Not a lockout: once the wait has passed (database clock), the right password works.
	if _, err := e.pool.Exec(ctx, `UPDATE login_attempts SET at = at - interval '2 minutes'`); err != nil {
		t.Fatal(err)
	}
	if resp := e.loginFrom(attacker, "ada@example.com", "correct horse battery"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("after the wait: status %d, want 303", resp.StatusCode)
	}

	// Per address: 8 free failures over any accounts, then the address waits.
	const sprayer = "203.0.113.99"
	for i := range 8 {
		if resp := e.loginFrom(sprayer, "u"+strconv.Itoa(i)+"@example.com", "wrong-password"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("spray %d: status %d, want 401", i, resp.StatusCode)
		}
	}
	if resp := e.loginFrom(sprayer, "fresh@example.com", "wrong-password"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("address over its free failures: status %d, want 429", resp.StatusCode)
	}
}

func TestLoginIgnoresForwardedForWithoutTrustedProxies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.loginFrom("203.0.113.5", "nobody@example.com", "wrong-password")
	if n := e.count(`SELECT count(*) FROM login_attempts WHERE ip = '127.0.0.1'`); n != 1 {
		t.Fatalf("attempts from the TCP peer = %d, want 1 (X-Forwarded-For must be ignored)", n)
	}
}
