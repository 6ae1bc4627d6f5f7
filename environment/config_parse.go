package environment

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
)

// Parse validates a client's configuration for driver, fills defaults and separates the secret
// values. stored holds the environment's current secrets (nil when creating): a private_key that
// is absent or {"set": true}, and a secret env value of {"set": true}, keep the stored value.
// Unknown settings are field errors, never silently dropped.
func Parse(driver string, raw []byte, stored *Secrets) (Config, Secrets, FieldErrors) {
	errs := FieldErrors{}
	if !ValidDriver(driver) {
		errs[""] = fmt.Sprintf("unknown driver %q", driver)
		return Config{}, Secrets{}, errs
	}
	if stored == nil {
		stored = &Secrets{}
	}
	obj, ok := decodeObject(raw)
	if !ok {
		errs[""] = "must be a JSON object"
		return Config{}, Secrets{}, errs
	}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !slices.Contains(allowedKeys(driver), k) {
			errs[k] = fmt.Sprintf("not a setting of the %s driver", driver)
		}
	}
	p := &parser{obj: obj, errs: errs}
	c := Config{Driver: driver}
	sec := Secrets{Salt: stored.Salt}
	switch driver {
	case DriverLocal:
		c.Containment, c.Masks = p.containment()
		c.Egress = p.egress(driver, true)
	case DriverSSH:
		c.SSH, sec.PrivateKey = p.ssh(stored)
	case DriverSandbox:
		c.Sandbox = p.sandbox()
		c.Egress = p.egress(driver, c.Sandbox.Network)
	case DriverPlugin:
		c.Plugin = p.plugin()
	}
	c.Env, sec.Env = p.env(stored)
	if driver == DriverSSH || driver == DriverPlugin {
		for i, v := range c.Env {
			if v.Inject != nil {
				errs[fmt.Sprintf("env[%d].inject", i)] = "an " + driver + " environment reaches the network itself: Berth's egress proxy cannot inject there"
			}
		}
	}
	c.MaxParallelRuns = p.integer("max_parallel_runs", 0, 0, MaxParallelRunsLimit)
	if len(errs) > 0 {
		return Config{}, Secrets{}, errs
	}
	return c, sec, nil
}

// decodeObject reads raw as a JSON object of raw members; absent or null is the empty object.
func decodeObject(raw []byte) (map[string]json.RawMessage, bool) {
	obj := map[string]json.RawMessage{}
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return obj, true
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, false
	}
	return obj, true
}

// parser reads typed members out of one JSON object, recording a field error for each bad one.
type parser struct {
	obj    map[string]json.RawMessage
	errs   FieldErrors
	prefix string // e.g. "env[2]." for members of a nested object
}

// member returns a member's raw value; absent and null are both "not given".
func (p *parser) member(key string) (json.RawMessage, bool) {
	v, ok := p.obj[key]
	if !ok || string(bytes.TrimSpace(v)) == "null" {
		return nil, false
	}
	return v, true
}

func (p *parser) fail(key, msg string) { p.errs[p.prefix+key] = msg }

// str reads a string member. ok is false when the member is absent (then missing, if not empty,
// is recorded as the field's error) or not a string.
func (p *parser) str(key, missing string) (s string, ok bool) {
	v, given := p.member(key)
	if !given {
		if missing != "" {
			p.fail(key, missing)
		}
		return "", false
	}
	if err := json.Unmarshal(v, &s); err != nil {
		p.fail(key, "must be a string")
		return "", false
	}
	return s, true
}

// number reads a JSON number member exactly (no float rounding for large integers); given is
// false when it is absent, and n is empty when it is not a number.
func (p *parser) number(key string) (n json.Number, given bool) {
	v, ok := p.member(key)
	if !ok {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err == nil {
		if num, isNum := x.(json.Number); isNum {
			return num, true
		}
	}
	p.fail(key, "must be a number")
	return "", true
}

// integer reads a whole number in [lo, hi], or def when absent.
func (p *parser) integer(key string, def, lo, hi int) int {
	n, given := p.number(key)
	if !given || n == "" {
		return def
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		p.fail(key, fmt.Sprintf("must be a whole number from %d to %d", lo, hi))
		return def
	}
	if i < int64(lo) || i > int64(hi) {
		p.fail(key, fmt.Sprintf("must be from %d to %d", lo, hi))
		return def
	}
	return int(i)
}

// decimal reads a number in [lo, hi] rounded to two decimals, or def when absent.
func (p *parser) decimal(key string, def, lo, hi float64) float64 {
	n, given := p.number(key)
	if !given || n == "" {
		return def
	}
	f, err := n.Float64()
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		p.fail(key, "must be a number")
		return def
	}
	f = math.Round(f*100) / 100
	if f < lo || f > hi {
		p.fail(key, fmt.Sprintf("must be from %g to %g", lo, hi))
		return def
	}
	return f
}

// boolean reads true or false, or def when absent.
func (p *parser) boolean(key string, def bool) bool {
	v, ok := p.member(key)
	if !ok {
		return def
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		p.fail(key, "must be true or false")
		return def
	}
	return b
}

// keep reports whether a member is the {"set": true} placeholder that keeps a stored secret.
func (p *parser) keep(key string) bool {
	v, ok := p.member(key)
	if !ok {
		return false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(v, &m) != nil || len(m) != 1 || string(bytes.TrimSpace(m["set"])) != "true" {
		return false
	}
	return true
}

// env reads the env list: public entries go to the config, secret values to the secrets.
func (p *parser) env(stored *Secrets) ([]EnvVar, map[string]string) {
	vars := []EnvVar{}
	var secret map[string]string
	raw, ok := p.member("env")
	if !ok {
		return vars, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		p.fail("env", "must be a list of {name, value, secret}")
		return vars, nil
	}
	if len(items) > MaxEnvVars {
		p.fail("env", fmt.Sprintf("at most %d variables", MaxEnvVars))
		return vars, nil
	}
	seen := map[string]bool{}
	for i, item := range items {
		v, ok := p.envVar(fmt.Sprintf("env[%d].", i), item, stored)
		if !ok {
			continue
		}
		if seen[v.Name] {
			p.errs[fmt.Sprintf("env[%d].name", i)] = v.Name + ": listed twice"
			continue
		}
		seen[v.Name] = true
		if v.Secret {
			if secret == nil {
				secret = map[string]string{}
			}
			secret[v.Name], v.Value = v.Value, ""
		}
		vars = append(vars, v)
	}
	slices.SortFunc(vars, func(a, b EnvVar) int { return strings.Compare(a.Name, b.Name) })
	return vars, secret
}

// envVar reads one env entry; a secret's Value is its plaintext (kept or new).
func (p *parser) envVar(prefix string, raw json.RawMessage, stored *Secrets) (EnvVar, bool) {
	obj := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		p.errs[strings.TrimSuffix(prefix, ".")] = "must be an object {name, value, secret}"
		return EnvVar{}, false
	}
	q := &parser{obj: obj, errs: p.errs, prefix: prefix}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if k != "name" && k != "value" && k != "secret" && k != "inject" {
			q.fail(k, "not a member of an env entry (name, value, secret, inject)")
		}
	}
	name, ok := q.str("name", "required: the variable name")
	if !ok {
		return EnvVar{}, false
	}
	if msg := envNameProblem(name); msg != "" {
		q.fail("name", msg)
		return EnvVar{}, false
	}
	v := EnvVar{Name: name, Secret: q.boolean("secret", false)}
	if v.Inject = q.inject(); v.Inject != nil && !v.Secret {
		q.fail("inject", "only a secret can be injected (set secret: true)")
	}
	value, ok := q.envValue(v, stored)
	if !ok {
		return EnvVar{}, false
	}
	v.Value = value
	return v, true
}

// envValue reads an env entry's value: a string, or {"set": true} to keep a stored secret.
func (p *parser) envValue(v EnvVar, stored *Secrets) (string, bool) {
	raw, present := p.member("value")
	if present && p.keep("value") {
		kept, found := stored.Env[v.Name]
		switch {
		case !v.Secret:
			p.fail("value", v.Name+`: only a secret value can be kept with {"set": true}`)
		case !found:
			p.fail("value", v.Name+": no stored value to keep; enter the value")
		default:
			return kept, true
		}
		return "", false
	}
	var value string
	switch {
	case !present && v.Secret:
		p.fail("value", v.Name+`: required (or {"set": true} to keep the stored value)`)
	case present && json.Unmarshal(raw, &value) != nil:
		p.fail("value", v.Name+`: must be a string, or {"set": true} to keep a stored secret`)
	case len(value) > MaxEnvValueBytes:
		p.fail("value", fmt.Sprintf("%s: at most %d bytes", v.Name, MaxEnvValueBytes))
	case strings.ContainsRune(value, 0):
		p.fail("value", v.Name+": must not contain NUL bytes")
	default:
		return value, true
	}
	return "", false
}

var (
	envNamePattern  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	userPattern     = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}$`)
	hostnamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
)

// envNameProblem says what is wrong with an env name, or "" when it is acceptable. Berth's own
// variables and the database URL are reserved: a run must not be able to shadow or receive them.
func envNameProblem(name string) string {
	switch {
	case name == "":
		return "required: the variable name"
	case len(name) > 128 || !envNamePattern.MatchString(name):
		return strconv.Quote(name) + ": must start with a letter or '_' and hold only letters, digits and '_' (at most 128)"
	case strings.HasPrefix(strings.ToUpper(name), "BERTH_"):
		return name + ": names starting with BERTH_ are reserved for Berth"
	case strings.EqualFold(name, "DATABASE_URL"):
		return name + ": reserved; Berth never passes its database to a run"
	}
	return ""
}

// normalizeHost accepts a host name or an IP address (IPv6 with or without brackets), and nothing
// else: no scheme, user, port, path or spaces. Names are lower-cased.
func normalizeHost(s string) (string, error) {
	h := strings.TrimSpace(s)
	switch {
	case h == "":
		return "", errors.New("required: the host name or IP address to connect to")
	case strings.Contains(h, "://"):
		return "", errors.New("write the host alone, without a scheme such as ssh://")
	case strings.ContainsAny(h, " \t\r\n"):
		return "", errors.New("must not contain spaces")
	case strings.Contains(h, "@"):
		return "", errors.New("put the user name in the user field")
	}
	if ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); ip != nil {
		return ip.String(), nil
	}
	if strings.Contains(h, ":") {
		return "", errors.New("put the port in the port field")
	}
	h = strings.ToLower(h)
	if len(h) > 253 || !hostnamePattern.MatchString(h) {
		return "", errors.New("must be a host name (letters, digits, '-' and dots) or an IP address")
	}
	return h, nil
}

// normalizeHostKey parses a pinned host key given as an authorized_keys line ("ssh-ed25519 AAAA…
// comment") or a known_hosts line ("host ssh-ed25519 AAAA…") and returns "type base64".
// Certificates and @cert-authority/@revoked lines are refused: Berth pins one key.
func normalizeHostKey(s string) (string, error) {
	line := strings.TrimSpace(s)
	if line == "" {
		return "", errors.New("required: the server's public host key")
	}
	if strings.ContainsAny(line, "\r\n") {
		return "", errors.New("paste exactly one key line")
	}
	if strings.HasPrefix(line, "@") {
		return "", errors.New("pin the host's own key, not a @cert-authority or @revoked line")
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return "", errors.New(`must be a public key line such as "ssh-ed25519 AAAA…" (from ssh-keyscan or known_hosts)`)
	}
	if _, isCert := pub.(*ssh.Certificate); isCert {
		return "", errors.New("pin the host's own key, not a certificate")
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))), nil
}

// normalizePrivateKey checks that s is one unencrypted private key Berth can use and returns it
// with normalized line endings. Messages never quote the key.
func normalizePrivateKey(s string) (string, error) {
	k := strings.TrimSpace(strings.ReplaceAll(s, "\r\n", "\n"))
	if k == "" {
		return "", errors.New("required: paste the unencrypted private key (PEM)")
	}
	if len(k) > MaxKeyBytes {
		return "", fmt.Errorf("at most %d bytes", MaxKeyBytes)
	}
	if block, _ := pem.Decode([]byte(k)); block == nil {
		return "", errors.New("must be a PEM private key (-----BEGIN … PRIVATE KEY-----)")
	}
	if _, err := ssh.ParsePrivateKey([]byte(k)); err != nil {
		var pp *ssh.PassphraseMissingError
		if errors.As(err, &pp) {
			return "", errors.New("the key is protected by a passphrase; Berth needs an unencrypted key")
		}
		return "", errors.New("not a private key Berth can read (OpenSSH, PKCS#1, PKCS#8 or SEC 1 PEM)")
	}
	return k + "\n", nil
}

// HostKeyFingerprint is the SHA256 fingerprint of a normalized host key, as ssh prints it, or ""
// when the key does not parse.
func HostKeyFingerprint(hostKey string) string {
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(hostKey))
	if err != nil {
		return ""
	}
	return ssh.FingerprintSHA256(pub)
}
