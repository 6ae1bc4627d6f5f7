// Package egress is the per-node egress proxy every jail with a network reaches on its
// namespace's loopback (DESIGN §15, docs/network.md): an HTTP forward proxy with CONNECT, and
// SOCKS5 for other TCP. A jail has no other route out, so a tool that ignores the proxy
// variables fails to connect; it is never unfiltered. Each connection is decided by its
// environment's policy, looked up when the connection is made (an edit applies to the next one):
// the proxy resolves names itself, checks every address a name resolves to, and dials one of the
// addresses it checked (no DNS rebinding between the check and the dial). Credentials declared
// for injection are added by the proxy to requests for their hosts and never enter the jail; for
// HTTPS that means terminating TLS for exactly those hosts with a per-install CA the jail trusts.
package egress

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Mode is how much an environment's jails may reach.
type Mode string

// The modes of DESIGN §15.
const (
	ModeOff       Mode = "off"       // nothing
	ModeAllowlist Mode = "allowlist" // only what an allow entry names
	ModeOpen      Mode = "open"      // anything public, except what a deny entry names
)

// Rule is one allow or deny entry: a domain pattern ("example.com", "*.npmjs.org": the
// subdomains, not the domain itself) or a CIDR ("10.1.0.0/16", "192.0.2.7/32"), with an optional
// port ("registry.npmjs.org:443"; 0 = any port).
type Rule struct {
	Text   string // as written, for refusals and pages
	Domain string // lower-case, without the "*."; "" for a CIDR
	Wild   bool   // "*.": subdomains only
	Prefix netip.Prefix
	Port   int
}

// MaxRules bounds each of an environment's allow and deny lists.
const MaxRules = 200

// ParseRule reads one allow or deny entry, refusing anything else with a reason for people.
func ParseRule(s string) (Rule, error) {
	text := strings.TrimSpace(s)
	r := Rule{Text: text}
	if text == "" || len(text) > 300 {
		return Rule{}, fmt.Errorf("an entry is a domain or a CIDR of at most 300 characters")
	}
	host := text
	if i := strings.LastIndex(text, ":"); i > 0 && !strings.Contains(text[i:], "]") && strings.Count(text, ":") == 1 {
		p, err := strconv.Atoi(text[i+1:])
		if err != nil || p < 1 || p > 65535 {
			return Rule{}, fmt.Errorf("%q: the port must be 1 to 65535", text)
		}
		host, r.Port = text[:i], p
	}
	if strings.Contains(host, "/") {
		pfx, err := netip.ParsePrefix(host)
		if err != nil {
			return Rule{}, fmt.Errorf("%q: not a CIDR", text)
		}
		r.Prefix = pfx.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		r.Prefix = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		return r, nil
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Wild, host = true, rest
	}
	if !validDomain(host) {
		return Rule{}, fmt.Errorf("%q: not a domain name (letters, digits, '-' and dots; '*.' only in front)", text)
	}
	r.Domain = host
	return r, nil
}

func validDomain(d string) bool {
	if d == "" || len(d) > 253 {
		return false
	}
	for _, label := range strings.Split(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// matchesName reports whether the rule names host (lower-case, no trailing dot) on port.
func (r Rule) matchesName(host string, port int) bool {
	if r.Domain == "" || (r.Port != 0 && r.Port != port) {
		return false
	}
	if r.Wild {
		return strings.HasSuffix(host, "."+r.Domain)
	}
	return host == r.Domain
}

// matchesAddr reports whether the rule's CIDR holds a on port.
func (r Rule) matchesAddr(a netip.Addr, port int) bool {
	return r.Prefix.IsValid() && (r.Port == 0 || r.Port == port) && r.Prefix.Contains(a)
}

// Policy is an environment's egress policy. Deny beats allow; special addresses (loopback,
// private, link-local with the cloud metadata addresses, and the other ranges of special) are
// refused unless an allow entry's CIDR holds them.
type Policy struct {
	Mode  Mode
	Allow []Rule
	Deny  []Rule
	// Inject are the credentials the proxy adds to requests for their hosts.
	Inject []Injection
}

// Decision is what the policy says of one connection.
type Decision struct {
	Allowed bool
	// Rule says why, in words: the entry that allowed or refused it ("deny *.example.com",
	// "allow 10.0.0.0/8"), or "mode off", "not on the allowlist", "private address 10.1.2.3".
	Rule string
	// Addrs are the addresses that may be dialed, in order (all of them passed the checks).
	Addrs []netip.Addr
}

// Decide applies the policy to a connection to host:port whose name resolved to addrs (for an IP
// literal, addrs is just that address). Every address must pass: one refused address refuses the
// name, so a record set that mixes a public and a private address is no way in.
func (p Policy) Decide(host string, port int, addrs []netip.Addr) Decision {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	_, literal := literalAddr(host)
	if p.Mode == ModeOff || p.Mode == "" {
		return Decision{Rule: "mode off"}
	}
	if !literal {
		for _, r := range p.Deny {
			if r.matchesName(host, port) {
				return Decision{Rule: "deny " + r.Text}
			}
		}
	}
	nameAllowed := ""
	if !literal {
		for _, r := range p.Allow {
			if r.matchesName(host, port) {
				nameAllowed = "allow " + r.Text
				break
			}
		}
	}
	if len(addrs) == 0 {
		return Decision{Rule: "no address"}
	}
	out := make([]netip.Addr, 0, len(addrs))
	why := nameAllowed
	for _, a := range addrs {
		a = a.Unmap()
		for _, r := range p.Deny {
			if r.matchesAddr(a, port) {
				return Decision{Rule: "deny " + r.Text}
			}
		}
		cidrAllowed := ""
		for _, r := range p.Allow {
			if r.matchesAddr(a, port) {
				cidrAllowed = "allow " + r.Text
				break
			}
		}
		if special(a) && cidrAllowed == "" {
			return Decision{Rule: "private address " + a.String()}
		}
		if p.Mode == ModeAllowlist && nameAllowed == "" && cidrAllowed == "" {
			return Decision{Rule: "not on the allowlist"}
		}
		if why == "" {
			why = cidrAllowed
		}
		out = append(out, a)
	}
	if why == "" {
		why = "mode open"
	}
	return Decision{Allowed: true, Rule: why, Addrs: out}
}

// literalAddr parses host as an IP address ("[::1]" too).
func literalAddr(host string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(strings.Trim(host, "[]"))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// specialRanges are refused unless allowed by CIDR: this host, private networks, link-local (the
// cloud metadata services at 169.254.169.254 and fd00:ec2::254 among them), carrier-grade NAT
// (some clouds' metadata too), and ranges no public host has.
var specialRanges = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
		"192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
		"224.0.0.0/4", "240.0.0.0/4", "::/128", "::1/128", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001:db8::/32",
		"2002::/16", "fc00::/7", "fe80::/10", "ff00::/8"} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// special reports whether a is in one of the special ranges.
func special(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range specialRanges {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
