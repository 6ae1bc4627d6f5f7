package environment

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
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
	"unicode/utf8"

	"golang.org/x/crypto/ssh"
)

// The drivers an environment can use.
const (
	DriverLocal   = "local"
	DriverSSH     = "ssh"
	DriverSandbox = "sandbox"
)

// Drivers lists every driver in the order people choose from them.
func Drivers() []string { return []string{DriverLocal, DriverSSH, DriverSandbox} }

// ValidDriver reports whether driver is one Berth knows.
func ValidDriver(driver string) bool { return slices.Contains(Drivers(), driver) }

// Limits of a configuration, so one environment cannot hold unbounded data.
const (
	MaxEnvVars       = 100
	MaxEnvValueBytes = 32 << 10
	MaxKeyBytes      = 16 << 10
)

// Sandbox limits and defaults (DESIGN §8, "Sandbox environments and images").
const (
	DefaultSandboxMemoryMB = 1024
	DefaultSandboxCPUs     = 1.0
	DefaultSandboxPidsMax  = 512
	DefaultSandboxTimeoutS = 3600
	DefaultSSHPort         = 22
)

// Config is an environment's validated, normalized configuration without its secret values:
// exactly what the config column stores. SSH and Sandbox hold the settings of their driver and are
// zero for the others. Env is sorted by name; a secret entry's value lives in Secrets.
type Config struct {
	Driver  string
	SSH     SSHConfig
	Sandbox SandboxConfig
	Env     []EnvVar
}

// SSHConfig is where and as whom the ssh driver connects. HostKey is the pinned public key in
// authorized_keys form (type and base64, no comment): there is no trust on first use.
type SSHConfig struct {
	Host    string
	Port    int
	User    string
	HostKey string
}

// SandboxConfig is the bubblewrap sandbox's network switch and resource limits.
type SandboxConfig struct {
	Network      bool
	SetupNetwork bool
	MemoryMB     int
	CPUs         float64
	PidsMax      int
	TimeoutS     int
}

// EnvVar is one variable added to every command's environment. Value is empty when Secret is
// set: the value is sealed with the other secrets.
type EnvVar struct {
	Name   string
	Value  string
	Secret bool
}

// Secrets are an environment's secret values, sealed at rest as one JSON object and never
// returned. Salt keys the secrets' share of the fingerprint, so a published fingerprint cannot be
// used to guess a short secret; it is kept for the environment's lifetime.
type Secrets struct {
	PrivateKey string            `json:"private_key,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Salt       string            `json:"salt,omitempty"`
}

// SecretsAAD is the associated data an environment's sealed secrets are bound to, so a sealed blob
// copied to another environment's row does not open.
func SecretsAAD(environmentID string) string { return "environment:" + environmentID }

// Empty reports whether there is no secret value to seal.
func (s Secrets) Empty() bool { return s.PrivateKey == "" && len(s.Env) == 0 }

// Equal reports whether two sets of secrets hold the same values (the salt aside).
func (s Secrets) Equal(o Secrets) bool {
	return s.PrivateKey == o.PrivateKey && maps.Equal(s.Env, o.Env)
}

// FieldErrors maps a configuration key, relative to the config object ("host", "env[2].name";
// "" for the object itself), to what is wrong with it, in words for the person who sent it.
type FieldErrors map[string]string

// allowedKeys are the settings each driver accepts; anything else is refused.
func allowedKeys(driver string) []string {
	switch driver {
	case DriverSSH:
		return []string{"host", "port", "user", "private_key", "host_key", "env"}
	case DriverSandbox:
		return []string{"network", "setup_network", "memory_mb", "cpus", "pids_max", "timeout_s", "env"}
	default:
		return []string{"env"}
	}
}

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
	case DriverSSH:
		c.SSH, sec.PrivateKey = p.ssh(stored)
	case DriverSandbox:
		c.Sandbox = p.sandbox()
	}
	c.Env, sec.Env = p.env(stored)
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

// ssh reads the ssh driver's settings and its private key.
func (p *parser) ssh(stored *Secrets) (SSHConfig, string) {
	c := SSHConfig{Port: p.integer("port", DefaultSSHPort, 1, 65535)}
	if host, ok := p.str("host", "required: the host name or IP address to connect to"); ok {
		if h, err := normalizeHost(host); err != nil {
			p.fail("host", err.Error())
		} else {
			c.Host = h
		}
	}
	if user, ok := p.str("user", "required: the user name to sign in as"); ok {
		if userPattern.MatchString(user) {
			c.User = user
		} else {
			p.fail("user", "must be a user name: letters, digits, '.', '_' or '-', at most 32, not starting with '-' or '.'")
		}
	}
	if line, ok := p.str("host_key", "required: the server's public host key (a line of ssh-keyscan output); Berth does not trust on first use"); ok {
		if k, err := normalizeHostKey(line); err != nil {
			p.fail("host_key", err.Error())
		} else {
			c.HostKey = k
		}
	}
	return c, p.privateKey(stored)
}

// privateKey reads a new private key, or keeps the stored one when it is absent or {"set": true}.
func (p *parser) privateKey(stored *Secrets) string {
	raw, present := p.member("private_key")
	if !present || p.keep("private_key") {
		if stored.PrivateKey == "" {
			p.fail("private_key", "required: paste the unencrypted private key (PEM)")
		}
		return stored.PrivateKey
	}
	var key string
	if json.Unmarshal(raw, &key) != nil {
		p.fail("private_key", `must be the private key as PEM text, or {"set": true} to keep the stored one`)
		return ""
	}
	k, err := normalizePrivateKey(key)
	if err != nil {
		p.fail("private_key", err.Error())
		return ""
	}
	return k
}

// sandbox reads the sandbox driver's settings, filling defaults.
func (p *parser) sandbox() SandboxConfig {
	return SandboxConfig{
		Network:      p.boolean("network", false),
		SetupNetwork: p.boolean("setup_network", true),
		MemoryMB:     p.integer("memory_mb", DefaultSandboxMemoryMB, 64, 65536),
		CPUs:         p.decimal("cpus", DefaultSandboxCPUs, 0.1, 64),
		PidsMax:      p.integer("pids_max", DefaultSandboxPidsMax, 16, 65536),
		TimeoutS:     p.integer("timeout_s", DefaultSandboxTimeoutS, 1, 86400),
	}
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
		if k != "name" && k != "value" && k != "secret" {
			q.fail(k, "not a member of an env entry (name, value, secret)")
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

// envDoc is an env entry as stored: a secret's value is absent.
type envDoc struct {
	Name   string `json:"name"`
	Value  string `json:"value,omitempty"`
	Secret bool   `json:"secret"`
}

// setMarker stands in for a secret value in what Berth returns.
type setMarker struct {
	Set bool `json:"set"`
}

// redactedEnv is an env entry as returned: a secret's value is {"set": true}.
type redactedEnv struct {
	Name   string `json:"name"`
	Secret bool   `json:"secret"`
	Value  any    `json:"value"`
}

type localDoc struct {
	Env []envDoc `json:"env"`
}

type sshDoc struct {
	Host    string   `json:"host"`
	Port    int      `json:"port"`
	User    string   `json:"user"`
	HostKey string   `json:"host_key"`
	Env     []envDoc `json:"env"`
}

type sandboxDoc struct {
	Network      bool     `json:"network"`
	SetupNetwork bool     `json:"setup_network"`
	MemoryMB     int      `json:"memory_mb"`
	CPUs         float64  `json:"cpus"`
	PidsMax      int      `json:"pids_max"`
	TimeoutS     int      `json:"timeout_s"`
	Env          []envDoc `json:"env"`
}

// doc is the stored shape of c for its driver.
func (c Config) doc() any {
	env := make([]envDoc, 0, len(c.Env))
	for _, v := range c.Env {
		env = append(env, envDoc(v))
	}
	switch c.Driver {
	case DriverSSH:
		return sshDoc{Host: c.SSH.Host, Port: c.SSH.Port, User: c.SSH.User, HostKey: c.SSH.HostKey, Env: env}
	case DriverSandbox:
		s := c.Sandbox
		return sandboxDoc{Network: s.Network, SetupNetwork: s.SetupNetwork, MemoryMB: s.MemoryMB, CPUs: s.CPUs,
			PidsMax: s.PidsMax, TimeoutS: s.TimeoutS, Env: env}
	default:
		return localDoc{Env: env}
	}
}

// Document is the JSON the config column stores: every setting, no secret value.
func (c Config) Document() ([]byte, error) {
	b, err := json.Marshal(c.doc())
	if err != nil {
		return nil, fmt.Errorf("config document: %w", err)
	}
	return b, nil
}

// Redacted is the configuration as Berth returns it to anyone: every setting, with the private key
// and secret env values replaced by {"set": true}. Its JSON is accepted back by Parse unchanged.
func (c Config) Redacted() map[string]any {
	var out map[string]any
	b, _ := json.Marshal(c.doc()) // plain structs of strings, numbers and bools always marshal
	_ = json.Unmarshal(b, &out)
	env := make([]redactedEnv, 0, len(c.Env))
	for _, v := range c.Env {
		e := redactedEnv{Name: v.Name, Secret: v.Secret, Value: v.Value}
		if v.Secret {
			e.Value = setMarker{Set: true}
		}
		env = append(env, e)
	}
	out["env"] = env
	if c.Driver == DriverSSH {
		out["private_key"] = setMarker{Set: true}
	}
	return out
}

// Load reads a config column written by Document for driver.
func Load(driver string, doc []byte) (Config, error) {
	c := Config{Driver: driver}
	var env []envDoc
	var err error
	switch driver {
	case DriverLocal:
		var d localDoc
		err = strictUnmarshal(doc, &d)
		env = d.Env
	case DriverSSH:
		var d sshDoc
		err = strictUnmarshal(doc, &d)
		c.SSH, env = SSHConfig{Host: d.Host, Port: d.Port, User: d.User, HostKey: d.HostKey}, d.Env
	case DriverSandbox:
		var d sandboxDoc
		err = strictUnmarshal(doc, &d)
		c.Sandbox = SandboxConfig{Network: d.Network, SetupNetwork: d.SetupNetwork, MemoryMB: d.MemoryMB,
			CPUs: d.CPUs, PidsMax: d.PidsMax, TimeoutS: d.TimeoutS}
		env = d.Env
	default:
		err = fmt.Errorf("unknown driver %q", driver)
	}
	if err != nil {
		return Config{}, fmt.Errorf("load %s config: %w", driver, err)
	}
	c.Env = make([]EnvVar, 0, len(env))
	for _, e := range env {
		c.Env = append(c.Env, EnvVar(e))
	}
	return c, nil
}

func strictUnmarshal(b []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}

// Fingerprint identifies what a qualification was earned for: the driver, the normalized
// settings, the secret values and the active image. Any change of one of them changes it; a
// rename does not. The secrets enter as an HMAC keyed by their salt, so the fingerprint reveals
// nothing about them.
func Fingerprint(c Config, s Secrets, activeImage string) string {
	doc, _ := json.Marshal(c.doc()) // plain structs always marshal
	secrets := ""
	if !s.Empty() {
		b, _ := json.Marshal(struct {
			PrivateKey string            `json:"private_key"`
			Env        map[string]string `json:"env"` // map keys marshal sorted
		}{s.PrivateKey, s.Env})
		mac := hmac.New(sha256.New, []byte(s.Salt))
		mac.Write(b)
		secrets = hex.EncodeToString(mac.Sum(nil))
	}
	payload, _ := json.Marshal(struct {
		Version     int             `json:"v"`
		Driver      string          `json:"driver"`
		Config      json.RawMessage `json:"config"`
		Secrets     string          `json:"secrets"`
		ActiveImage string          `json:"active_image"`
	}{1, c.Driver, doc, secrets, activeImage})
	sum := sha256.Sum256(payload)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ChangedKeys names the settings that differ between two configurations (secret values
// included), sorted, without saying how: audit details and messages use it.
func ChangedKeys(old Config, oldSecrets Secrets, cur Config, curSecrets Secrets) []string {
	a, b := map[string]json.RawMessage{}, map[string]json.RawMessage{}
	ab, _ := json.Marshal(old.doc())
	bb, _ := json.Marshal(cur.doc())
	_ = json.Unmarshal(ab, &a)
	_ = json.Unmarshal(bb, &b)
	changed := map[string]bool{}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			changed[k] = true
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			changed[k] = true
		}
	}
	if oldSecrets.PrivateKey != curSecrets.PrivateKey {
		changed["private_key"] = true
	}
	if !maps.Equal(oldSecrets.Env, curSecrets.Env) {
		changed["env"] = true
	}
	return slices.Sorted(maps.Keys(changed))
}

// ValidName reports what is wrong with an environment name, or "" when it is acceptable:
// 1–100 characters of printable text.
func ValidName(name string) string {
	switch {
	case strings.TrimSpace(name) == "":
		return "required"
	case utf8.RuneCountInString(name) > 100:
		return "at most 100 characters"
	case !utf8.ValidString(name) || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "must be printable text on one line"
	}
	return ""
}
