package handlers

import (
	"fmt"
	"strings"

	"berth/environment"
	"berth/environment/egress"
	"berth/views"
)

// An environment's egress policy and injected secrets on its form, its page and the plan
// (docs/network.md): the form's text fields become the same config members the API takes, so the
// config parser's field errors apply to both.

// egressDoc is the form's egress member; nil leaves the driver's default (nothing typed).
func (f environmentFormValues) egressDoc() map[string]any {
	allow, deny := egressEntries(f.EgressAllow), egressEntries(f.EgressDeny)
	mode := strings.TrimSpace(f.EgressMode)
	if mode == "" && len(allow) == 0 && len(deny) == 0 {
		return nil
	}
	doc := map[string]any{"allow": allow, "deny": deny}
	if mode != "" {
		doc["mode"] = mode
	}
	return doc
}

// egressEntries splits a textarea into entries: one per line (commas and spaces separate too).
func egressEntries(text string) []string {
	out := []string{}
	for _, e := range strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == '\r' || r == ',' || r == ' ' || r == '\t' }) {
		out = append(out, e)
	}
	return out
}

// egressFormField maps a config field key under "egress" onto the form's field.
func egressFormField(key string) string {
	switch {
	case strings.HasPrefix(key, "egress.allow"):
		return "egress_allow"
	case strings.HasPrefix(key, "egress.deny"):
		return "egress_deny"
	}
	return "egress_mode"
}

// applyInjectLines reads "NAME host,host [| Header: format]" lines onto the secret entries they
// name; it returns a field error for a line that names no secret entry or cannot be read.
func applyInjectLines(text string, secrets []map[string]any) string {
	for i, line := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		spec, custom, hasCustom := strings.Cut(line, "|")
		fields := strings.Fields(spec)
		if len(fields) < 2 {
			return fmt.Sprintf("line %d: write NAME host[,host…] [| Header: format]", i+1)
		}
		name := fields[0]
		var entry map[string]any
		for _, e := range secrets {
			if e["name"] == name {
				entry = e
			}
		}
		if entry == nil {
			return fmt.Sprintf("line %d: %s is not one of the secret variables", i+1, name)
		}
		inject := map[string]any{"hosts": egressEntries(strings.Join(fields[1:], ","))}
		if hasCustom {
			header, format, ok := strings.Cut(custom, ":")
			if !ok {
				return fmt.Sprintf("line %d: after | write Header: format, such as Authorization: Bearer {value}", i+1)
			}
			inject["header"], inject["format"] = strings.TrimSpace(header), strings.TrimSpace(format)
		}
		entry["inject"] = inject
	}
	return ""
}

// injectLines is the form's text for the stored injections (names and hosts, never values).
func injectLines(env []environment.EnvVar) string {
	var lines []string
	for _, v := range env {
		if !v.Secret || v.Inject == nil {
			continue
		}
		line := v.Name + " " + strings.Join(v.Inject.Hosts, ",")
		if h, f := v.Inject.Header, v.Inject.Format; (h != "" && h != environment.DefaultInjectHeader) || (f != "" && f != environment.DefaultInjectFormat) {
			line += " | " + h + ": " + f
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// fillEgressForm puts a stored config's egress onto its edit form; the driver's default stays
// "" (so a sandbox that turns its network on follows the default again).
func fillEgressForm(f *views.EnvironmentForm, cfg environment.Config) {
	e := cfg.Egress
	if e.Mode == "" || (e.Mode == environment.DefaultEgress(cfg.Driver, cfg.Sandbox.Network).Mode && len(e.Allow) == 0 && len(e.Deny) == 0) {
		return
	}
	f.EgressMode, f.EgressAllow, f.EgressDeny = string(e.Mode), strings.Join(e.Allow, "\n"), strings.Join(e.Deny, "\n")
}

// egressSettingsView phrases the egress policy and the injected secrets for the environment page.
func egressSettingsView(c environment.Config) []views.EnvironmentSetting {
	if c.Driver != environment.DriverLocal && c.Driver != environment.DriverSandbox {
		return nil
	}
	out := []views.EnvironmentSetting{egressSetting(c.Egress)}
	if len(c.Egress.Deny) > 0 {
		out = append(out, views.EnvironmentSetting{Label: "Egress denied", Value: strings.Join(c.Egress.Deny, ", "), Mono: true,
			Hint: "Deny beats allow."})
	}
	for _, v := range c.Env {
		if v.Secret && v.Inject != nil {
			out = append(out, views.EnvironmentSetting{Label: "Injected secret", Value: v.Name + " → " + strings.Join(v.Inject.Hosts, ", "), Mono: true,
				Hint: "The egress proxy adds it to HTTPS requests to these hosts; the value never enters the sandbox."})
		}
	}
	return out
}

// egressSetting is the policy's one-line summary.
func egressSetting(e environment.EgressConfig) views.EnvironmentSetting {
	s := views.EnvironmentSetting{Label: "Egress"}
	switch e.Mode {
	case egress.ModeOpen:
		s.Value, s.Hint = "open", "Any public host through the egress proxy; private, loopback and metadata addresses refused unless allowed."
		if len(e.Allow) > 0 {
			s.Hint += " Also allowed: " + strings.Join(e.Allow, ", ") + "."
		}
	case egress.ModeAllowlist:
		s.Value, s.Mono, s.Hint = "only "+strings.Join(e.Allow, ", "), true, "Everything else is refused (403 with X-Berth-Egress)."
	default:
		s.Value, s.Hint = "off", "Nothing leaves the sandbox; Berth's API still answers."
	}
	return s
}

// planEgress is the plan's egress member: what the chosen environment's jails may reach (null
// for ssh and plugin environments, whose own host is the boundary).
type planEgress struct {
	Mode  string   `json:"mode"`
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
}
