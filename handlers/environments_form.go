package handlers

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"berth/environment"
	"berth/views"
)

// The environment form's plumbing: reading a submitted create or edit form into the same input the
// API builds, mapping refusals back onto the form's fields, and refilling it without secret values.

// environmentFormValues is a submitted create or edit form.
type environmentFormValues struct {
	Name, Driver            string
	Host, Port, User        string
	PrivateKey, HostKey     string
	SandboxFields           bool
	Network, SetupNet       bool
	MemoryMB, CPUs, PidsMax string
	TimeoutS                string
	MaxParallelRuns         string // every driver
	Env, SecretEnv          string
	// Plugin, PluginSHA256 and PluginSettings are a plugin environment's (settings as JSON text).
	Plugin, PluginSHA256, PluginSettings string
	// EgressMode, EgressAllow, EgressDeny and Inject are a local or sandbox environment's egress
	// policy and injected secrets (egress_form.go).
	EgressMode, EgressAllow, EgressDeny, Inject string
	plainCount                                  int // env entries that came from the Env field, for mapping errors back
}

// readEnvironmentForm reads a submitted form (at most 1 MiB); a server-owned field is a 400.
func readEnvironmentForm(w http.ResponseWriter, r *http.Request) (environmentFormValues, error) {
	form, err := readForm(w, r, maxTextFormBody)
	if err != nil {
		return environmentFormValues{}, err
	}
	for _, f := range []string{"qualification", "company_id", "id", "generation", "status"} {
		if form.Has(f) {
			return environmentFormValues{}, errServerOwned(f, "")
		}
	}
	v := form.Get
	return environmentFormValues{
		Name: v("name"), Driver: v("driver"),
		Host: v("host"), Port: v("port"), User: v("user"), PrivateKey: v("private_key"), HostKey: v("host_key"),
		SandboxFields: v("sandbox_fields") != "", Network: v("network") != "", SetupNet: v("setup_network") != "",
		MemoryMB: v("memory_mb"), CPUs: v("cpus"), PidsMax: v("pids_max"), TimeoutS: v("timeout_s"),
		MaxParallelRuns: v("max_parallel_runs"), Env: v("env"), SecretEnv: v("secret_env"),
		Plugin: v("plugin"), PluginSHA256: v("sha256"), PluginSettings: v("settings"),
		EgressMode: v("egress_mode"), EgressAllow: v("egress_allow"), EgressDeny: v("egress_deny"), Inject: v("inject"),
	}, nil
}

// envJSONNumber matches a JSON number literal, so a typed number passes as a number and anything
// else stays a string for the config parser to refuse.
var envJSONNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// envFormNumber puts a numeric field into a config: omitted when empty (the default applies).
func envFormNumber(cfg map[string]any, key, value string) {
	value = strings.TrimSpace(value)
	switch {
	case value == "":
	case envJSONNumber.MatchString(value):
		cfg[key] = json.Number(value)
	default:
		cfg[key] = value
	}
}

// input turns the form into the same input the API builds; lines that are not NAME=value are
// field errors.
func (f *environmentFormValues) input() (environmentInput, map[string]string) {
	fields := map[string]string{}
	cfg := map[string]any{}
	switch f.Driver {
	case environment.DriverSSH:
		cfg["host"], cfg["user"], cfg["host_key"] = f.Host, f.User, f.HostKey
		envFormNumber(cfg, "port", f.Port)
		if strings.TrimSpace(f.PrivateKey) != "" {
			cfg["private_key"] = f.PrivateKey
		}
	case environment.DriverSandbox:
		if f.SandboxFields {
			cfg["network"], cfg["setup_network"] = f.Network, f.SetupNet
		}
		envFormNumber(cfg, "memory_mb", f.MemoryMB)
		envFormNumber(cfg, "cpus", f.CPUs)
		envFormNumber(cfg, "pids_max", f.PidsMax)
		envFormNumber(cfg, "timeout_s", f.TimeoutS)
	case environment.DriverPlugin:
		cfg["plugin"], cfg["sha256"] = strings.TrimSpace(f.Plugin), strings.TrimSpace(f.PluginSHA256)
		if t := strings.TrimSpace(f.PluginSettings); t != "" {
			if json.Valid([]byte(t)) {
				cfg["settings"] = json.RawMessage(t)
			} else {
				fields["settings"] = "must be a JSON object, such as {\"socket\": \"/run/podman/podman.sock\"}"
			}
		}
		envFormNumber(cfg, "timeout_s", f.TimeoutS)
	}
	envFormNumber(cfg, "max_parallel_runs", f.MaxParallelRuns)
	plain, errPlain := envFormLines(f.Env, false)
	secret, errSecret := envFormLines(f.SecretEnv, true)
	if errPlain != "" {
		fields["env"] = errPlain
	}
	if errSecret != "" {
		fields["secret_env"] = errSecret
	}
	f.plainCount = len(plain)
	if f.Driver == environment.DriverLocal || f.Driver == environment.DriverSandbox {
		if eg := f.egressDoc(); eg != nil {
			cfg["egress"] = eg
		}
		if msg := applyInjectLines(f.Inject, secret); msg != "" {
			fields["inject"] = msg
		}
	}
	cfg["env"] = append(plain, secret...)
	raw, err := json.Marshal(cfg)
	if err != nil {
		fields["config"] = "the settings could not be read"
	}
	name, driver := f.Name, f.Driver
	return environmentInput{Name: &name, Driver: &driver, Config: raw}, fields
}

// envFormLines reads NAME=value lines into env entries. In the secret field a line with only NAME
// keeps the stored value.
func envFormLines(text string, secret bool) ([]map[string]any, string) {
	entries := []map[string]any{}
	for i, line := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		name, value, hasValue := strings.Cut(line, "=")
		name = strings.TrimSpace(name)
		switch {
		case hasValue:
			entries = append(entries, map[string]any{"name": name, "value": value, "secret": secret})
		case secret:
			entries = append(entries, map[string]any{"name": name, "value": map[string]bool{"set": true}, "secret": true})
		default:
			return nil, fmt.Sprintf("line %d: write NAME=value", i+1)
		}
	}
	return entries, ""
}

// formFields maps the API's field keys onto the form's fields.
func (f environmentFormValues) formFields(apiFields map[string]string) map[string]string {
	out := map[string]string{}
	add := func(k, msg string) {
		if prev, ok := out[k]; ok {
			msg = prev + "; " + msg
		}
		out[k] = msg
	}
	for _, k := range slices.Sorted(maps.Keys(apiFields)) {
		msg := apiFields[k]
		key, isConfig := strings.CutPrefix(k, "config.")
		switch {
		case !isConfig:
			add(k, msg)
		case strings.HasPrefix(key, "egress"):
			add(egressFormField(key), msg)
		case strings.HasPrefix(key, "env[") && strings.Contains(key, "].inject"):
			add("inject", msg)
		case strings.HasPrefix(key, "env["):
			idx, _ := strconv.Atoi(strings.TrimPrefix(key[:strings.IndexByte(key, ']')], "env["))
			if idx < f.plainCount {
				add("env", msg)
			} else {
				add("secret_env", msg)
			}
		default:
			add(key, msg)
		}
	}
	return out
}

// refill is the form shown again after a refusal: what was typed, except secret values (the
// private key is never sent back; secret lines keep their names only).
func (f environmentFormValues) refill(form views.EnvironmentForm, errs map[string]string) views.EnvironmentForm {
	keySet := form.KeySet && f.Driver == form.Driver
	form.Name = f.Name
	setEnvironmentFormDriver(&form, f.Driver)
	form.Host, form.Port, form.User, form.HostKey, form.KeySet = f.Host, f.Port, f.User, f.HostKey, keySet
	if f.SandboxFields {
		form.Network, form.SetupNet = f.Network, f.SetupNet
	}
	form.MemoryMB, form.CPUs, form.PidsMax, form.TimeoutS = f.MemoryMB, f.CPUs, f.PidsMax, f.TimeoutS
	form.MaxParallelRuns = f.MaxParallelRuns
	form.Plugin, form.PluginSHA256, form.PluginSettings = f.Plugin, f.PluginSHA256, f.PluginSettings
	form.Env = f.Env
	form.EgressMode, form.EgressAllow, form.EgressDeny, form.Inject = f.EgressMode, f.EgressAllow, f.EgressDeny, f.Inject
	var names []string
	typedValues := false
	for _, line := range strings.Split(strings.ReplaceAll(f.SecretEnv, "\r\n", "\n"), "\n") {
		name, _, hasValue := strings.Cut(line, "=")
		if name = strings.TrimSpace(name); name != "" {
			names, typedValues = append(names, name), typedValues || hasValue
		}
	}
	form.SecretEnv = strings.Join(names, "\n")
	form.Errors = errs
	if _, hasSecretErr := errs["secret_env"]; typedValues && !hasSecretErr {
		form.Errors["secret_env"] = "Secret values are not shown again: enter NAME=value again for the ones you typed."
	}
	return form
}
