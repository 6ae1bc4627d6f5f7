package environment

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"berth/environment/egress"
)

// EgressConfig is what an environment's jails may reach through the egress proxy (DESIGN §15,
// docs/network.md): a mode and allow/deny entries (domains with optional port, CIDRs).
type EgressConfig struct {
	Mode  egress.Mode
	Allow []string
	Deny  []string
}

// Inject is a secret env entry's injection: the proxy adds Header with Format ("{value}" stands
// for the secret) to requests for Hosts; the secret itself never reaches the jail.
type Inject struct {
	Hosts  []string
	Header string
	Format string
}

// Injection limits.
const (
	MaxInjectHosts      = 20
	DefaultInjectHeader = "Authorization"
	DefaultInjectFormat = "Bearer {value}"
)

// DefaultEgress is a driver's egress when its config names none: a local environment reaches
// the public internet (private ranges still refused), a sandbox only with its network on.
func DefaultEgress(driver string, network bool) EgressConfig {
	if driver == DriverLocal || (driver == DriverSandbox && network) {
		return EgressConfig{Mode: egress.ModeOpen}
	}
	return EgressConfig{Mode: egress.ModeOff}
}

type egressDoc struct {
	Mode  egress.Mode `json:"mode"`
	Allow []string    `json:"allow,omitempty"`
	Deny  []string    `json:"deny,omitempty"`
}

type injectDoc struct {
	Hosts  []string `json:"hosts"`
	Header string   `json:"header"`
	Format string   `json:"format"`
}

// headerPattern is an HTTP header name (an RFC 9110 token).
var headerPattern = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")

// egress reads the egress setting of a driver whose jails have a network (network false: a
// sandbox without one, where only "off" makes sense).
func (p *parser) egress(driver string, network bool) EgressConfig {
	raw, ok := p.member("egress")
	if !ok {
		return DefaultEgress(driver, network)
	}
	obj := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		p.fail("egress", `must be an object {"mode": "off"|"allowlist"|"open", "allow": [...], "deny": [...]}`)
		return EgressConfig{}
	}
	q := &parser{obj: obj, errs: p.errs, prefix: p.prefix + "egress."}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if k != "mode" && k != "allow" && k != "deny" {
			q.fail(k, "not a member of egress (mode, allow, deny)")
		}
	}
	c := DefaultEgress(driver, network)
	if mode, ok := q.str("mode", ""); ok {
		switch egress.Mode(mode) {
		case egress.ModeOff, egress.ModeAllowlist, egress.ModeOpen:
			c.Mode = egress.Mode(mode)
		default:
			q.fail("mode", `must be "off", "allowlist" or "open"`)
		}
	}
	if c.Mode != egress.ModeOff && driver == DriverSandbox && !network {
		q.fail("mode", `a sandbox without network reaches nothing: turn "network" on, or use "off"`)
	}
	c.Allow, c.Deny = q.rules("allow"), q.rules("deny")
	if c.Mode == egress.ModeAllowlist && len(c.Allow) == 0 {
		q.fail("allow", "an allowlist needs at least one entry (a domain such as registry.npmjs.org, or a CIDR)")
	}
	return c
}

// rules reads a list of allow or deny entries, normalized as written and deduplicated.
func (p *parser) rules(key string) []string {
	raw, ok := p.member(key)
	if !ok {
		return nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		p.fail(key, "must be a list of domains (example.com, *.example.com, optional :port) or CIDRs")
		return nil
	}
	if len(list) > egress.MaxRules {
		p.fail(key, fmt.Sprintf("at most %d entries", egress.MaxRules))
		return nil
	}
	out := make([]string, 0, len(list))
	for i, s := range list {
		if _, err := egress.ParseRule(s); err != nil {
			p.fail(fmt.Sprintf("%s[%d]", key, i), err.Error())
			continue
		}
		out = append(out, strings.TrimSpace(s))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// inject reads a secret env entry's injection.
func (p *parser) inject() *Inject {
	raw, ok := p.member("inject")
	if !ok {
		return nil
	}
	obj := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		p.fail("inject", `must be an object {"hosts": [...], "header": "Authorization", "format": "Bearer {value}"}`)
		return nil
	}
	q := &parser{obj: obj, errs: p.errs, prefix: p.prefix + "inject."}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if k != "hosts" && k != "header" && k != "format" {
			q.fail(k, "not a member of inject (hosts, header, format)")
		}
	}
	in := &Inject{Header: DefaultInjectHeader, Format: DefaultInjectFormat}
	var hosts []string
	if raw, ok := q.member("hosts"); !ok || json.Unmarshal(raw, &hosts) != nil || len(hosts) == 0 || len(hosts) > MaxInjectHosts {
		q.fail("hosts", fmt.Sprintf("required: 1 to %d host names (example.com, *.example.com)", MaxInjectHosts))
	}
	for i, h := range hosts {
		r, err := egress.ParseRule(h)
		switch {
		case err != nil:
			q.fail(fmt.Sprintf("hosts[%d]", i), err.Error())
		case r.Domain == "" || r.Port != 0:
			q.fail(fmt.Sprintf("hosts[%d]", i), "a host name without a port (the credential goes to that name on any port)")
		default:
			in.Hosts = append(in.Hosts, strings.ToLower(strings.TrimSpace(h)))
		}
	}
	if h, ok := q.str("header", ""); ok {
		if !headerPattern.MatchString(h) || strings.EqualFold(h, "Host") || strings.EqualFold(h, "Proxy-Authorization") {
			q.fail("header", "must be an HTTP header name (not Host or Proxy-Authorization)")
		}
		in.Header = h
	}
	if f, ok := q.str("format", ""); ok {
		if !strings.Contains(f, "{value}") || strings.ContainsAny(f, "\r\n\x00") || len(f) > 200 {
			q.fail("format", `must hold {value} (where the secret goes), on one line, at most 200 characters`)
		}
		in.Format = f
	}
	return in
}

func (c EgressConfig) doc(driver string, network bool) *egressDoc {
	if c.Mode == "" || (c.Mode == DefaultEgress(driver, network).Mode && len(c.Allow) == 0 && len(c.Deny) == 0) {
		return nil // the default is not stored
	}
	return &egressDoc{Mode: c.Mode, Allow: c.Allow, Deny: c.Deny}
}

// EgressOf reads the egress of a stored config document's "egress" member (raw; empty or null:
// the driver's default), for pages and the plan that show the policy without parsing the whole
// configuration. An unreadable member reads as "off", what the proxy would do with it.
func EgressOf(driver string, network bool, raw []byte) EgressConfig {
	if len(raw) == 0 || string(raw) == "null" {
		return DefaultEgress(driver, network)
	}
	var d egressDoc
	if err := json.Unmarshal(raw, &d); err != nil {
		return EgressConfig{Mode: egress.ModeOff}
	}
	return d.config(driver, network)
}

func (d *egressDoc) config(driver string, network bool) EgressConfig {
	if d == nil {
		return DefaultEgress(driver, network)
	}
	return EgressConfig{Mode: d.Mode, Allow: d.Allow, Deny: d.Deny}
}

// EgressPolicy is the proxy's policy for the configuration's jails, with the injected secrets'
// values put into their formats.
func (c Config) EgressPolicy(s Secrets) (egress.Policy, error) {
	p := egress.Policy{Mode: c.Egress.Mode}
	for _, list := range []struct {
		in  []string
		out *[]egress.Rule
	}{{c.Egress.Allow, &p.Allow}, {c.Egress.Deny, &p.Deny}} {
		for _, s := range list.in {
			r, err := egress.ParseRule(s)
			if err != nil {
				return egress.Policy{}, fmt.Errorf("egress policy: %w", err)
			}
			*list.out = append(*list.out, r)
		}
	}
	for _, v := range c.Env {
		if v.Inject == nil {
			continue
		}
		value, ok := s.Env[v.Name]
		if !ok {
			return egress.Policy{}, fmt.Errorf("egress policy: secret %s has no value: %w", v.Name, ErrInvalidRequest)
		}
		in := egress.Injection{Header: v.Inject.Header, Value: strings.ReplaceAll(v.Inject.Format, "{value}", value)}
		for _, h := range v.Inject.Hosts {
			r, err := egress.ParseRule(h)
			if err != nil {
				return egress.Policy{}, fmt.Errorf("egress policy: %w", err)
			}
			in.Hosts = append(in.Hosts, r)
		}
		p.Inject = append(p.Inject, in)
	}
	return p, nil
}

// Injects reports whether any secret of the configuration is injected by the proxy (the jails then
// trust Berth's egress CA).
func (c Config) Injects() bool {
	for _, v := range c.Env {
		if v.Inject != nil {
			return true
		}
	}
	return false
}
