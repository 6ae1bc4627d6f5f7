package environment

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// testKeys is a fresh ed25519 key pair: the private key as PEM and the public key as an
// authorized_keys line.
type testKeys struct {
	private string
	public  string
}

func newTestKeys(t *testing.T) testKeys {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "test")
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return testKeys{private: string(pem.EncodeToMemory(block)), public: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseLocal(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		config  string
		wantErr string // a key of the field errors, "-" for none
	}{
		{"empty object", `{}`, "-"},
		{"absent", ``, "-"},
		{"null", `null`, "-"},
		{"env", `{"env":[{"name":"GOFLAGS","value":"-mod=mod"}]}`, "-"},
		{"empty value", `{"env":[{"name":"EMPTY","value":""}]}`, "-"},
		{"not an object", `[1]`, ""},
		{"unknown key", `{"host":"x"}`, "host"},
		{"env not a list", `{"env":{"A":"b"}}`, "env"},
		{"env entry not an object", `{"env":["A=b"]}`, "env[0]"},
		{"env unknown member", `{"env":[{"name":"A","value":"b","export":true}]}`, "env[0].export"},
		{"env name missing", `{"env":[{"value":"b"}]}`, "env[0].name"},
		{"env name digit first", `{"env":[{"name":"1A","value":"b"}]}`, "env[0].name"},
		{"env name dash", `{"env":[{"name":"A-B","value":"b"}]}`, "env[0].name"},
		{"env name reserved", `{"env":[{"name":"BERTH_RUN_TOKEN","value":"b"}]}`, "env[0].name"},
		{"env name reserved lower", `{"env":[{"name":"berth_x","value":"b"}]}`, "env[0].name"},
		{"env database url", `{"env":[{"name":"DATABASE_URL","value":"b"}]}`, "env[0].name"},
		{"env duplicate", `{"env":[{"name":"A","value":"1"},{"name":"A","value":"2"}]}`, "env[1].name"},
		{"env value number", `{"env":[{"name":"A","value":1}]}`, "env[0].value"},
		{"env value NUL", `{"env":[{"name":"A","value":"a\u0000b"}]}`, "env[0].value"},
		{"env secret without value", `{"env":[{"name":"A","secret":true}]}`, "env[0].value"},
		{"env keep non-secret", `{"env":[{"name":"A","value":{"set":true}}]}`, "env[0].value"},
		{"env keep with nothing stored", `{"env":[{"name":"A","secret":true,"value":{"set":true}}]}`, "env[0].value"},
		{"env secret not bool", `{"env":[{"name":"A","secret":"yes","value":"x"}]}`, "env[0].secret"},
		{"containment jail", `{"containment":"jail"}`, "-"},
		{"containment none", `{"containment":"none","mask":["/srv/secrets","/opt/keys"]}`, "-"},
		{"containment unknown", `{"containment":"off"}`, "containment"},
		{"mask not a list", `{"mask":"/srv"}`, "mask"},
		{"mask relative", `{"mask":["srv"]}`, "mask[0]"},
		{"mask root", `{"mask":["/"]}`, "mask[0]"},
		{"mask unclean", `{"mask":["/srv/../etc"]}`, "mask[0]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, errs := Parse(DriverLocal, []byte(tc.config), nil)
			if tc.wantErr == "-" {
				if len(errs) != 0 {
					t.Fatalf("errors = %v, want none", errs)
				}
				return
			}
			if _, ok := errs[tc.wantErr]; !ok {
				t.Fatalf("errors = %v, want one on %q", errs, tc.wantErr)
			}
		})
	}
}

func TestParseEnvTooLong(t *testing.T) {
	t.Parallel()
	env := make([]map[string]any, MaxEnvVars+1)
	for i := range env {
		env[i] = map[string]any{"name": "V" + strings.Repeat("X", i), "value": ""}
	}
	if _, _, errs := Parse(DriverLocal, mustJSON(t, map[string]any{"env": env}), nil); errs["env"] == "" {
		t.Fatalf("%d variables accepted: %v", len(env), errs)
	}
	big := map[string]any{"env": []map[string]any{{"name": "A", "value": strings.Repeat("x", MaxEnvValueBytes+1)}}}
	if _, _, errs := Parse(DriverLocal, mustJSON(t, big), nil); errs["env[0].value"] == "" {
		t.Fatalf("oversized value accepted: %v", errs)
	}
}

func TestParseEnvSecretsAndOrder(t *testing.T) {
	t.Parallel()
	raw := `{"env":[{"name":"Z","value":"z"},{"name":"TOKEN","value":"s3cret","secret":true},{"name":"A","value":"a"}]}`
	cfg, sec, errs := Parse(DriverLocal, []byte(raw), nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	names := []string{}
	for _, v := range cfg.Env {
		names = append(names, v.Name)
		if v.Secret && v.Value != "" {
			t.Fatalf("secret value left in the config: %+v", v)
		}
	}
	if !slices.Equal(names, []string{"A", "TOKEN", "Z"}) {
		t.Fatalf("env order = %v, want sorted by name", names)
	}
	if sec.Env["TOKEN"] != "s3cret" || len(sec.Env) != 1 {
		t.Fatalf("secrets = %+v", sec.Env)
	}
	doc, err := cfg.Document()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(doc), "s3cret") {
		t.Fatalf("document holds the secret: %s", doc)
	}

	// Keeping: {"set": true} keeps the stored value; a new value replaces it.
	kept, keptSec, errs := Parse(DriverLocal, []byte(`{"env":[{"name":"TOKEN","secret":true,"value":{"set":true}}]}`), &sec)
	if len(errs) != 0 || keptSec.Env["TOKEN"] != "s3cret" || len(kept.Env) != 1 {
		t.Fatalf("keep: %v %+v", errs, keptSec)
	}
	_, newSec, errs := Parse(DriverLocal, []byte(`{"env":[{"name":"TOKEN","secret":true,"value":"other"}]}`), &sec)
	if len(errs) != 0 || newSec.Env["TOKEN"] != "other" {
		t.Fatalf("replace: %v %+v", errs, newSec)
	}
}

func TestParseSSH(t *testing.T) {
	t.Parallel()
	keys := newTestKeys(t)
	encBlock := func() string {
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		b, err := ssh.MarshalPrivateKeyWithPassphrase(priv, "", []byte("pass"))
		if err != nil {
			t.Fatal(err)
		}
		return string(pem.EncodeToMemory(b))
	}()
	valid := func(edit func(m map[string]any)) []byte {
		m := map[string]any{"host": "build-1.example.com", "user": "deploy", "private_key": keys.private, "host_key": keys.public}
		if edit != nil {
			edit(m)
		}
		return mustJSON(t, m)
	}
	cases := []struct {
		name    string
		config  []byte
		wantErr string
	}{
		{"valid", valid(nil), "-"},
		{"ipv4", valid(func(m map[string]any) { m["host"] = "10.0.0.5" }), "-"},
		{"ipv6", valid(func(m map[string]any) { m["host"] = "::1" }), "-"},
		{"ipv6 brackets", valid(func(m map[string]any) { m["host"] = "[fe80::1]" }), "-"},
		{"known_hosts line", valid(func(m map[string]any) { m["host_key"] = "build-1.example.com " + keys.public }), "-"},
		{"key with comment", valid(func(m map[string]any) { m["host_key"] = keys.public + " root@build-1" }), "-"},
		{"port", valid(func(m map[string]any) { m["port"] = 2222 }), "-"},
		{"base dir absolute", valid(func(m map[string]any) { m["base_dir"] = "/srv/berth" }), "-"},
		{"base dir in home", valid(func(m map[string]any) { m["base_dir"] = "~/work/berth" }), "-"},
		{"base dir relative", valid(func(m map[string]any) { m["base_dir"] = "work" }), "base_dir"},
		{"base dir escapes home", valid(func(m map[string]any) { m["base_dir"] = "~/../etc" }), "base_dir"},
		{"base dir root", valid(func(m map[string]any) { m["base_dir"] = "/" }), "base_dir"},
		{"containment on ssh", valid(func(m map[string]any) { m["containment"] = "none" }), "containment"},
		{"missing host", valid(func(m map[string]any) { delete(m, "host") }), "host"},
		{"scheme", valid(func(m map[string]any) { m["host"] = "ssh://build-1" }), "host"},
		{"space", valid(func(m map[string]any) { m["host"] = "build 1" }), "host"},
		{"host with port", valid(func(m map[string]any) { m["host"] = "build-1:22" }), "host"},
		{"host with user", valid(func(m map[string]any) { m["host"] = "root@build-1" }), "host"},
		{"host option injection", valid(func(m map[string]any) { m["host"] = "-oProxyCommand=x" }), "host"},
		{"host not string", valid(func(m map[string]any) { m["host"] = 5 }), "host"},
		{"port zero", valid(func(m map[string]any) { m["port"] = 0 }), "port"},
		{"port too big", valid(func(m map[string]any) { m["port"] = 65536 }), "port"},
		{"port fraction", valid(func(m map[string]any) { m["port"] = 22.5 }), "port"},
		{"port string", valid(func(m map[string]any) { m["port"] = "22" }), "port"},
		{"missing user", valid(func(m map[string]any) { delete(m, "user") }), "user"},
		{"user dash first", valid(func(m map[string]any) { m["user"] = "-root" }), "user"},
		{"user space", valid(func(m map[string]any) { m["user"] = "a b" }), "user"},
		{"missing key", valid(func(m map[string]any) { delete(m, "private_key") }), "private_key"},
		{"key not PEM", valid(func(m map[string]any) { m["private_key"] = "hunter2" }), "private_key"},
		{"key garbage PEM", valid(func(m map[string]any) {
			m["private_key"] = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
		}), "private_key"},
		{"key with passphrase", valid(func(m map[string]any) { m["private_key"] = encBlock }), "private_key"},
		{"key keep with nothing stored", valid(func(m map[string]any) { m["private_key"] = map[string]bool{"set": true} }), "private_key"},
		{"key wrong shape", valid(func(m map[string]any) { m["private_key"] = map[string]bool{"set": false} }), "private_key"},
		{"missing host key", valid(func(m map[string]any) { delete(m, "host_key") }), "host_key"},
		{"host key garbage", valid(func(m map[string]any) { m["host_key"] = "ssh-ed25519 notbase64!" }), "host_key"},
		{"host key two lines", valid(func(m map[string]any) { m["host_key"] = keys.public + "\n" + keys.public }), "host_key"},
		{"host key revoked marker", valid(func(m map[string]any) { m["host_key"] = "@revoked * " + keys.public }), "host_key"},
		{"unknown key", valid(func(m map[string]any) { m["password"] = "x" }), "password"},
		{"sandbox key", valid(func(m map[string]any) { m["network"] = true }), "network"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, sec, errs := Parse(DriverSSH, tc.config, nil)
			if tc.wantErr == "-" {
				if len(errs) != 0 {
					t.Fatalf("errors = %v, want none", errs)
				}
				if sec.PrivateKey == "" || cfg.SSH.HostKey == "" || cfg.SSH.Host == "" {
					t.Fatalf("parsed = %+v", cfg)
				}
				return
			}
			if _, ok := errs[tc.wantErr]; !ok {
				t.Fatalf("errors = %v, want one on %q", errs, tc.wantErr)
			}
			for k, msg := range errs {
				if strings.Contains(msg, keys.private[40:80]) || strings.Contains(msg, "hunter2") {
					t.Fatalf("error %s quotes the key: %s", k, msg)
				}
			}
		})
	}
}

func TestParseSSHNormalizes(t *testing.T) {
	t.Parallel()
	keys := newTestKeys(t)
	raw := mustJSON(t, map[string]any{"host": "Build-1.Example.COM", "user": "deploy",
		"private_key": "\r\n" + strings.ReplaceAll(keys.private, "\n", "\r\n"), "host_key": "host.example " + keys.public + " a comment"})
	cfg, sec, errs := Parse(DriverSSH, raw, nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if cfg.SSH.Host != "build-1.example.com" || cfg.SSH.Port != DefaultSSHPort || cfg.SSH.HostKey != keys.public {
		t.Fatalf("normalized = %+v, want lower-case host, port 22, bare key", cfg.SSH)
	}
	if strings.Contains(sec.PrivateKey, "\r") || !strings.HasSuffix(sec.PrivateKey, "\n") || strings.HasPrefix(sec.PrivateKey, "\n") {
		t.Fatalf("private key not normalized: %q", sec.PrivateKey[:20])
	}
	if !strings.HasPrefix(HostKeyFingerprint(cfg.SSH.HostKey), "SHA256:") {
		t.Fatalf("fingerprint = %q", HostKeyFingerprint(cfg.SSH.HostKey))
	}

	// On a change the stored key is kept when omitted or {"set": true}.
	for _, edit := range []map[string]any{
		{"host": "b", "user": "u", "host_key": keys.public},
		{"host": "b", "user": "u", "host_key": keys.public, "private_key": map[string]bool{"set": true}},
	} {
		_, kept, errs := Parse(DriverSSH, mustJSON(t, edit), &sec)
		if len(errs) != 0 || kept.PrivateKey != sec.PrivateKey {
			t.Fatalf("keep %v: errors %v, key kept %v", edit, errs, kept.PrivateKey == sec.PrivateKey)
		}
	}
}

func TestParseSandbox(t *testing.T) {
	t.Parallel()
	cfg, _, errs := Parse(DriverSandbox, []byte(`{}`), nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	want := SandboxConfig{Network: false, SetupNetwork: true, MemoryMB: 1024, CPUs: 1, PidsMax: 512, TimeoutS: 3600}
	if cfg.Sandbox != want {
		t.Fatalf("defaults = %+v, want %+v", cfg.Sandbox, want)
	}
	cases := []struct {
		config  string
		wantErr string
	}{
		{`{"network":true,"setup_network":false,"memory_mb":64,"cpus":0.1,"pids_max":16,"timeout_s":1}`, "-"},
		{`{"memory_mb":65536,"cpus":64,"pids_max":65536,"timeout_s":86400}`, "-"},
		{`{"cpus":2.5}`, "-"},
		{`{"network":"yes"}`, "network"},
		{`{"setup_network":1}`, "setup_network"},
		{`{"memory_mb":63}`, "memory_mb"},
		{`{"memory_mb":65537}`, "memory_mb"},
		{`{"memory_mb":512.5}`, "memory_mb"},
		{`{"cpus":0.05}`, "cpus"},
		{`{"cpus":65}`, "cpus"},
		{`{"cpus":"2"}`, "cpus"},
		{`{"pids_max":15}`, "pids_max"},
		{`{"timeout_s":0}`, "timeout_s"},
		{`{"timeout_s":86401}`, "timeout_s"},
		{`{"timeout_s":1e20}`, "timeout_s"},
		{`{"active_image":"x"}`, "active_image"},
		{`{"host":"x"}`, "host"},
	}
	for _, tc := range cases {
		_, _, errs := Parse(DriverSandbox, []byte(tc.config), nil)
		if tc.wantErr == "-" {
			if len(errs) != 0 {
				t.Errorf("%s: errors = %v, want none", tc.config, errs)
			}
			continue
		}
		if _, ok := errs[tc.wantErr]; !ok {
			t.Errorf("%s: errors = %v, want one on %q", tc.config, errs, tc.wantErr)
		}
	}
}

func TestParseUnknownDriver(t *testing.T) {
	t.Parallel()
	if _, _, errs := Parse("docker", []byte(`{}`), nil); errs[""] == "" {
		t.Fatalf("unknown driver accepted: %v", errs)
	}
}

func TestDocumentLoadRoundTrip(t *testing.T) {
	t.Parallel()
	keys := newTestKeys(t)
	configs := map[string]string{
		DriverLocal:   `{"env":[{"name":"A","value":"1"},{"name":"S","value":"x","secret":true}]}`,
		DriverSSH:     string(mustJSON(t, map[string]any{"host": "h", "port": 2200, "user": "u", "private_key": keys.private, "host_key": keys.public})),
		DriverSandbox: `{"network":true,"cpus":1.5}`,
	}
	for driver, raw := range configs {
		cfg, _, errs := Parse(driver, []byte(raw), nil)
		if len(errs) != 0 {
			t.Fatalf("%s: %v", driver, errs)
		}
		doc, err := cfg.Document()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Load(driver, doc)
		if err != nil {
			t.Fatalf("%s: load: %v", driver, err)
		}
		if Fingerprint(back, Secrets{}, "") != Fingerprint(cfg, Secrets{}, "") {
			t.Fatalf("%s: round trip changed the config: %+v vs %+v", driver, back, cfg)
		}
	}
	if _, err := Load(DriverLocal, []byte(`{"env":[],"host":"x"}`)); err == nil {
		t.Fatal("Load accepted an unknown member")
	}
}

func TestRedactedRoundTrips(t *testing.T) {
	t.Parallel()
	keys := newTestKeys(t)
	raw := mustJSON(t, map[string]any{"host": "h", "user": "u", "private_key": keys.private, "host_key": keys.public,
		"env": []map[string]any{{"name": "TOKEN", "value": "s3cret-value", "secret": true}, {"name": "MODE", "value": "ci"}}})
	cfg, sec, errs := Parse(DriverSSH, raw, nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	red := mustJSON(t, cfg.Redacted())
	for _, secret := range []string{"s3cret-value", keys.private[40:80], "PRIVATE KEY"} {
		if strings.Contains(string(red), secret) {
			t.Fatalf("redacted config holds a secret: %s", red)
		}
	}
	if !strings.Contains(string(red), `"private_key":{"set":true}`) || !strings.Contains(string(red), `"value":{"set":true}`) {
		t.Fatalf("redacted config does not mark secrets as set: %s", red)
	}
	// What the API returns is accepted back unchanged and changes nothing.
	again, againSec, errs := Parse(DriverSSH, red, &sec)
	if len(errs) != 0 {
		t.Fatalf("redacted config refused: %v", errs)
	}
	if Fingerprint(again, againSec, "") != Fingerprint(cfg, sec, "") {
		t.Fatal("round trip through the redacted form changed the fingerprint")
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	keys := newTestKeys(t)
	other := newTestKeys(t)
	base := map[string]any{"host": "h", "user": "u", "private_key": keys.private, "host_key": keys.public,
		"env": []map[string]any{{"name": "B", "value": "2"}, {"name": "A", "value": "1"}, {"name": "S", "value": "pw", "secret": true}}}
	parse := func(edit func(m map[string]any)) (Config, Secrets) {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		if edit != nil {
			edit(m)
		}
		cfg, sec, errs := Parse(DriverSSH, mustJSON(t, m), nil)
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		sec.Salt = "salt"
		return cfg, sec
	}
	c0, s0 := parse(nil)
	fp := Fingerprint(c0, s0, "")
	if !strings.HasPrefix(fp, "sha256:") || len(fp) != len("sha256:")+64 {
		t.Fatalf("fingerprint = %q", fp)
	}
	same := []func(m map[string]any){
		func(m map[string]any) { m["port"] = 22 },                             // default written out
		func(m map[string]any) { m["host"] = "H" },                            // case of the host name
		func(m map[string]any) { m["host_key"] = keys.public + " comment" },   // comment on the key
		func(m map[string]any) { m["private_key"] = keys.private + "\n\n\n" }, // trailing space of the PEM
		func(m map[string]any) { // env order
			m["env"] = []map[string]any{{"name": "S", "value": "pw", "secret": true}, {"name": "A", "value": "1"}, {"name": "B", "value": "2"}}
		},
	}
	for i, edit := range same {
		if c, s := parse(edit); Fingerprint(c, s, "") != fp {
			t.Errorf("equivalent config %d changed the fingerprint", i)
		}
	}
	differ := []func(m map[string]any){
		func(m map[string]any) { m["port"] = 23 },
		func(m map[string]any) { m["host"] = "h2" },
		func(m map[string]any) { m["private_key"] = other.private },
		func(m map[string]any) { m["host_key"] = other.public },
		func(m map[string]any) {
			m["env"] = []map[string]any{{"name": "B", "value": "2"}, {"name": "A", "value": "1"}, {"name": "S", "value": "pw2", "secret": true}}
		},
		func(m map[string]any) {
			m["env"] = []map[string]any{{"name": "B", "value": "2"}, {"name": "A", "value": "1"}, {"name": "S", "value": "pw"}}
		},
	}
	for i, edit := range differ {
		if c, s := parse(edit); Fingerprint(c, s, "") == fp {
			t.Errorf("changed config %d kept the fingerprint", i)
		}
	}
	if Fingerprint(c0, s0, "image-2") == fp {
		t.Error("a new active image kept the fingerprint")
	}
	salted := s0
	salted.Salt = "another salt"
	if Fingerprint(c0, salted, "") == fp {
		t.Error("the secrets' share of the fingerprint is not keyed by the salt")
	}
	local, _, _ := Parse(DriverLocal, []byte(`{}`), nil)
	sandbox, _, _ := Parse(DriverSandbox, []byte(`{}`), nil)
	if Fingerprint(local, Secrets{}, "") == Fingerprint(sandbox, Secrets{}, "") {
		t.Error("a driver change kept the fingerprint")
	}
}

func TestChangedKeys(t *testing.T) {
	t.Parallel()
	a, as, _ := Parse(DriverSandbox, []byte(`{"memory_mb":2048,"env":[{"name":"S","value":"x","secret":true}]}`), nil)
	b, bs, _ := Parse(DriverSandbox, []byte(`{"memory_mb":4096,"env":[{"name":"S","value":"y","secret":true}]}`), nil)
	if got := ChangedKeys(a, as, b, bs); !slices.Equal(got, []string{"env", "memory_mb"}) {
		t.Fatalf("changed = %v", got)
	}
	if got := ChangedKeys(a, as, a, as); len(got) != 0 {
		t.Fatalf("no change reported %v", got)
	}
	l, ls, _ := Parse(DriverLocal, []byte(`{}`), nil)
	if got := ChangedKeys(a, as, l, ls); !slices.Contains(got, "memory_mb") || !slices.Contains(got, "env") {
		t.Fatalf("driver change = %v", got)
	}
}

func TestValidName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"local": true, "<script>alert(1)</script>": true, "Ünïcödé": true,
		"": false, "   ": false, strings.Repeat("x", 101): false, "a\nb": false, "tab\there": false,
	} {
		if got := ValidName(name) == ""; got != ok {
			t.Errorf("ValidName(%q) ok = %v, want %v", name, got, ok)
		}
	}
}
