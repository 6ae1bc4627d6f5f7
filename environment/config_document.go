package environment

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// envDoc is an env entry as stored: a secret's value is absent.
type envDoc struct {
	Name   string     `json:"name"`
	Value  string     `json:"value,omitempty"`
	Secret bool       `json:"secret"`
	Inject *injectDoc `json:"inject,omitempty"`
}

// setMarker stands in for a secret value in what Berth returns.
type setMarker struct {
	Set bool `json:"set"`
}

// redactedEnv is an env entry as returned: a secret's value is {"set": true}.
type redactedEnv struct {
	Name   string     `json:"name"`
	Secret bool       `json:"secret"`
	Value  any        `json:"value"`
	Inject *injectDoc `json:"inject,omitempty"`
}

type localDoc struct {
	Containment     string     `json:"containment,omitempty"`
	Mask            []string   `json:"mask,omitempty"`
	Env             []envDoc   `json:"env"`
	MaxParallelRuns int        `json:"max_parallel_runs,omitempty"`
	Egress          *egressDoc `json:"egress,omitempty"`
}

type sshDoc struct {
	Host    string   `json:"host"`
	Port    int      `json:"port"`
	User    string   `json:"user"`
	HostKey string   `json:"host_key"`
	BaseDir string   `json:"base_dir,omitempty"`
	Env     []envDoc `json:"env"`
	// MaxParallelRuns, in every driver's document: Config.MaxParallelRuns (0 is not stored).
	MaxParallelRuns int `json:"max_parallel_runs,omitempty"`
}

type sandboxDoc struct {
	Network         bool       `json:"network"`
	SetupNetwork    bool       `json:"setup_network"`
	MemoryMB        int        `json:"memory_mb"`
	CPUs            float64    `json:"cpus"`
	PidsMax         int        `json:"pids_max"`
	TimeoutS        int        `json:"timeout_s"`
	Env             []envDoc   `json:"env"`
	MaxParallelRuns int        `json:"max_parallel_runs,omitempty"`
	Egress          *egressDoc `json:"egress,omitempty"`
}

// doc is the stored shape of c for its driver.
func (c Config) doc() any {
	env := make([]envDoc, 0, len(c.Env))
	for _, v := range c.Env {
		env = append(env, envDoc{Name: v.Name, Value: v.Value, Secret: v.Secret, Inject: v.Inject.doc()})
	}
	switch c.Driver {
	case DriverSSH:
		return sshDoc{Host: c.SSH.Host, Port: c.SSH.Port, User: c.SSH.User, HostKey: c.SSH.HostKey, BaseDir: c.SSH.BaseDir, Env: env,
			MaxParallelRuns: c.MaxParallelRuns}
	case DriverPlugin:
		return pluginDocOf(c, env)
	case DriverSandbox:
		s := c.Sandbox
		return sandboxDoc{Network: s.Network, SetupNetwork: s.SetupNetwork, MemoryMB: s.MemoryMB, CPUs: s.CPUs,
			PidsMax: s.PidsMax, TimeoutS: s.TimeoutS, Env: env, MaxParallelRuns: c.MaxParallelRuns,
			Egress: c.Egress.doc(DriverSandbox, s.Network)}
	default:
		d := localDoc{Mask: c.Masks, Env: env, MaxParallelRuns: c.MaxParallelRuns, Egress: c.Egress.doc(DriverLocal, true)}
		if c.Containment == ContainmentNone {
			d.Containment = ContainmentNone // "jail" is the default and not stored
		}
		return d
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
		e := redactedEnv{Name: v.Name, Secret: v.Secret, Value: v.Value, Inject: v.Inject.doc()}
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
		env, c.Masks, c.Containment, c.MaxParallelRuns = d.Env, d.Mask, ContainmentJail, d.MaxParallelRuns
		c.Egress = d.Egress.config(DriverLocal, true)
		if d.Containment == ContainmentNone {
			c.Containment = ContainmentNone
		}
	case DriverSSH:
		var d sshDoc
		err = strictUnmarshal(doc, &d)
		c.SSH, env = SSHConfig{Host: d.Host, Port: d.Port, User: d.User, HostKey: d.HostKey, BaseDir: d.BaseDir}, d.Env
		c.MaxParallelRuns = d.MaxParallelRuns
	case DriverSandbox:
		var d sandboxDoc
		err = strictUnmarshal(doc, &d)
		c.Sandbox = SandboxConfig{Network: d.Network, SetupNetwork: d.SetupNetwork, MemoryMB: d.MemoryMB,
			CPUs: d.CPUs, PidsMax: d.PidsMax, TimeoutS: d.TimeoutS}
		env, c.MaxParallelRuns = d.Env, d.MaxParallelRuns
		c.Egress = d.Egress.config(DriverSandbox, d.Network)
	case DriverPlugin:
		var d pluginDoc
		err = strictUnmarshal(doc, &d)
		c.Plugin, env, c.MaxParallelRuns = d.config(), d.Env, d.MaxParallelRuns
	default:
		err = fmt.Errorf("unknown driver %q", driver)
	}
	if err != nil {
		return Config{}, fmt.Errorf("load %s config: %w", driver, err)
	}
	c.Env = make([]EnvVar, 0, len(env))
	for _, e := range env {
		c.Env = append(c.Env, EnvVar{Name: e.Name, Value: e.Value, Secret: e.Secret, Inject: e.Inject.inject()})
	}
	return c, nil
}

func strictUnmarshal(b []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}

func (in *Inject) doc() *injectDoc {
	if in == nil {
		return nil
	}
	return &injectDoc{Hosts: in.Hosts, Header: in.Header, Format: in.Format}
}

func (d *injectDoc) inject() *Inject {
	if d == nil {
		return nil
	}
	return &Inject{Hosts: d.Hosts, Header: d.Header, Format: d.Format}
}
