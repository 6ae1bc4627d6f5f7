package environment

import (
	"encoding/json"
	"strings"
	"testing"

	"berth/environment/egress"
)

// TestEgressConfig: the egress setting per driver, its defaults, its refusals (each a field
// error naming what is wrong), the injection of a secret (never an env variable of the jail) and
// the round trip through the stored document and the redacted form.
func TestEgressConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		driver, raw string
		want        egress.Mode
	}{
		{DriverLocal, `{}`, egress.ModeOpen},
		{DriverSandbox, `{}`, egress.ModeOff},
		{DriverSandbox, `{"network": true}`, egress.ModeOpen},
		{DriverLocal, `{"egress": {"mode": "allowlist", "allow": ["*.npmjs.org", "10.0.0.0/8:5432"]}}`, egress.ModeAllowlist},
		{DriverSandbox, `{"network": true, "egress": {"mode": "off"}}`, egress.ModeOff},
	} {
		cfg, _, errs := Parse(c.driver, []byte(c.raw), nil)
		if len(errs) > 0 || cfg.Egress.Mode != c.want {
			t.Errorf("%s %s: mode %q, errors %v; want %q", c.driver, c.raw, cfg.Egress.Mode, errs, c.want)
			continue
		}
		doc, _ := cfg.Document()
		back, err := Load(c.driver, doc)
		if err != nil || back.Egress.Mode != cfg.Egress.Mode || strings.Join(back.Egress.Allow, ",") != strings.Join(cfg.Egress.Allow, ",") {
			t.Errorf("%s %s: document round trip %+v %v", c.driver, doc, back.Egress, err)
		}
	}
	for raw, field := range map[string]string{
		`{"egress": {"mode": "wide"}}`:                                                                                   "egress.mode",
		`{"egress": {"mode": "allowlist"}}`:                                                                              "egress.allow",
		`{"egress": {"mode": "open", "deny": ["http://x"]}}`:                                                             "egress.deny[0]",
		`{"egress": {"mode": "open", "allow": "x"}}`:                                                                     "egress.allow",
		`{"egress": {"mode": "open", "extra": 1}}`:                                                                       "egress.extra",
		`{"egress": []}`:                                                                                                 "egress",
		`{"env": [{"name": "T", "value": "v", "inject": {"hosts": ["a.com"]}}]}`:                                         "env[0].inject",
		`{"env": [{"name": "T", "value": "v", "secret": true, "inject": {"hosts": []}}]}`:                                "env[0].inject.hosts",
		`{"env": [{"name": "T", "value": "v", "secret": true, "inject": {"hosts": ["10.0.0.0/8"]}}]}`:                    "env[0].inject.hosts[0]",
		`{"env": [{"name": "T", "value": "v", "secret": true, "inject": {"hosts": ["a.com"], "format": "Bearer"}}]}`:     "env[0].inject.format",
		`{"env": [{"name": "T", "value": "v", "secret": true, "inject": {"hosts": ["a.com"], "header": "Bad Header"}}]}`: "env[0].inject.header",
	} {
		if _, _, errs := Parse(DriverLocal, []byte(raw), nil); errs[field] == "" {
			t.Errorf("%s: no error on %s (got %v)", raw, field, errs)
		}
	}
	if _, _, errs := Parse(DriverSandbox, []byte(`{"egress": {"mode": "open"}}`), nil); errs["egress.mode"] == "" {
		t.Errorf("a sandbox without network accepted open egress: %v", errs)
	}
	if _, _, errs := Parse(DriverSSH, []byte(`{"egress": {"mode": "open"}}`), nil); errs["egress"] == "" {
		t.Errorf("ssh accepted egress: %v", errs)
	}

	raw := `{"env": [{"name": "GH_TOKEN", "value": "s3cret", "secret": true, "inject": {"hosts": ["api.github.com", "*.githubusercontent.com"]}},
		{"name": "PLAIN", "value": "p"}]}`
	cfg, sec, errs := Parse(DriverLocal, []byte(raw), nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	env, err := configuredEnv(cfg, Options{Secrets: sec})
	if err != nil || env["GH_TOKEN"] != "" || env["PLAIN"] != "p" {
		t.Fatalf("an injected secret reached the jail's environment: %v %v", env, err)
	}
	pol, err := cfg.EgressPolicy(sec)
	if err != nil || len(pol.Inject) != 1 || pol.Inject[0].Value != "Bearer s3cret" || pol.Inject[0].Header != "Authorization" {
		t.Fatalf("policy %+v %v", pol, err)
	}
	red, _ := json.Marshal(cfg.Redacted())
	if strings.Contains(string(red), "s3cret") || !strings.Contains(string(red), `"inject":{"hosts":["api.github.com","*.githubusercontent.com"]`) {
		t.Fatalf("redacted: %s", red)
	}
	// The redacted form is accepted back, keeping the secret.
	back, sec2, errs := Parse(DriverLocal, red, &sec)
	if len(errs) > 0 || sec2.Env["GH_TOKEN"] != "s3cret" || back.Env[0].Inject == nil {
		t.Fatalf("redacted back: %+v %v", back, errs)
	}
}
