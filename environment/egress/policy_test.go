package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func rules(t *testing.T, ss ...string) []Rule {
	t.Helper()
	var out []Rule
	for _, s := range ss {
		r, err := ParseRule(s)
		if err != nil {
			t.Fatalf("ParseRule(%q): %v", s, err)
		}
		out = append(out, r)
	}
	return out
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestParseRule(t *testing.T) {
	for in, want := range map[string]Rule{
		"example.com":            {Domain: "example.com"},
		"*.NPMJS.org.":           {Domain: "npmjs.org", Wild: true},
		"registry.npmjs.org:443": {Domain: "registry.npmjs.org", Port: 443},
		"10.0.0.0/8":             {Prefix: netip.MustParsePrefix("10.0.0.0/8")},
		"10.1.2.3/8":             {Prefix: netip.MustParsePrefix("10.0.0.0/8")},
		"192.0.2.7":              {Prefix: netip.MustParsePrefix("192.0.2.7/32")},
		"fd00::/8":               {Prefix: netip.MustParsePrefix("fd00::/8")},
		"10.0.0.0/8:5432":        {Prefix: netip.MustParsePrefix("10.0.0.0/8"), Port: 5432},
	} {
		got, err := ParseRule(in)
		want.Text = strings.TrimSpace(in)
		if err != nil || got != want {
			t.Errorf("ParseRule(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", " ", "exa mple.com", "*.", "a*.b", "-a.com", "example.com:0", "example.com:99999",
		"10.0.0.0/33", "http://example.com", "example.com/path", strings.Repeat("a", 301), "a..b"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
}

func TestDecide(t *testing.T) {
	pub := addrs("93.184.216.34")
	cases := []struct {
		name   string
		p      Policy
		host   string
		port   int
		addrs  []netip.Addr
		allow  bool
		reason string
	}{
		{"off refuses everything", Policy{Mode: ModeOff}, "example.com", 443, pub, false, "mode off"},
		{"unset mode is off", Policy{}, "example.com", 443, pub, false, "mode off"},
		{"open allows public", Policy{Mode: ModeOpen}, "example.com", 443, pub, true, "mode open"},
		{"open refuses loopback", Policy{Mode: ModeOpen}, "127.0.0.1", 80, addrs("127.0.0.1"), false, "private address 127.0.0.1"},
		{"open refuses a name resolving private", Policy{Mode: ModeOpen}, "evil.example", 80, addrs("10.1.2.3"), false, "private address 10.1.2.3"},
		{"one private address refuses the name", Policy{Mode: ModeOpen}, "mixed.example", 80, addrs("93.184.216.34", "192.168.1.1"), false, "private address 192.168.1.1"},
		{"metadata refused", Policy{Mode: ModeOpen}, "169.254.169.254", 80, addrs("169.254.169.254"), false, "private address 169.254.169.254"},
		{"IPv6 metadata refused", Policy{Mode: ModeOpen}, "fd00:ec2::254", 80, addrs("fd00:ec2::254"), false, "private address fd00:ec2::254"},
		{"v4-mapped private refused", Policy{Mode: ModeOpen}, "x.example", 80, addrs("::ffff:10.0.0.1"), false, "private address 10.0.0.1"},
		{"CGNAT refused", Policy{Mode: ModeOpen}, "x.example", 80, addrs("100.100.100.200"), false, "private address 100.100.100.200"},
		{"private allowed by CIDR", Policy{Mode: ModeOpen, Allow: rules(t, "10.0.0.0/8")}, "git.internal", 443, addrs("10.1.2.3"), true, "allow 10.0.0.0/8"},
		{"allowed domain resolving private still refused", Policy{Mode: ModeAllowlist, Allow: rules(t, "git.internal")}, "git.internal", 443, addrs("10.1.2.3"), false, "private address 10.1.2.3"},
		{"deny beats allow (domain)", Policy{Mode: ModeOpen, Allow: rules(t, "*.example.com"), Deny: rules(t, "bad.example.com")}, "bad.example.com", 443, pub, false, "deny bad.example.com"},
		{"deny beats allow (CIDR)", Policy{Mode: ModeOpen, Allow: rules(t, "10.0.0.0/8"), Deny: rules(t, "10.9.0.0/16")}, "x.internal", 80, addrs("10.9.1.1"), false, "deny 10.9.0.0/16"},
		{"deny by CIDR catches a name", Policy{Mode: ModeOpen, Deny: rules(t, "93.184.216.0/24")}, "example.com", 443, pub, false, "deny 93.184.216.0/24"},
		{"allowlist: listed", Policy{Mode: ModeAllowlist, Allow: rules(t, "*.npmjs.org")}, "registry.npmjs.org", 443, pub, true, "allow *.npmjs.org"},
		{"allowlist: wildcard is not the apex", Policy{Mode: ModeAllowlist, Allow: rules(t, "*.npmjs.org")}, "npmjs.org", 443, pub, false, "not on the allowlist"},
		{"allowlist: not listed", Policy{Mode: ModeAllowlist, Allow: rules(t, "*.npmjs.org")}, "example.com", 443, pub, false, "not on the allowlist"},
		{"allowlist: port must match", Policy{Mode: ModeAllowlist, Allow: rules(t, "example.com:443")}, "example.com", 80, pub, false, "not on the allowlist"},
		{"allowlist: port matches", Policy{Mode: ModeAllowlist, Allow: rules(t, "example.com:443")}, "Example.COM.", 443, pub, true, "allow example.com:443"},
		{"allowlist: IP literal by CIDR", Policy{Mode: ModeAllowlist, Allow: rules(t, "93.184.216.0/24")}, "93.184.216.34", 443, pub, true, "allow 93.184.216.0/24"},
		{"allowlist: a literal does not match a domain rule", Policy{Mode: ModeAllowlist, Allow: rules(t, "example.com")}, "93.184.216.34", 443, pub, false, "not on the allowlist"},
		{"no address", Policy{Mode: ModeOpen}, "nowhere.example", 80, nil, false, "no address"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := c.p.Decide(c.host, c.port, c.addrs)
			if d.Allowed != c.allow || d.Rule != c.reason {
				t.Fatalf("Decide = %+v, want allowed %v rule %q", d, c.allow, c.reason)
			}
			if d.Allowed && len(d.Addrs) != len(c.addrs) {
				t.Fatalf("addresses %v", d.Addrs)
			}
		})
	}
}
