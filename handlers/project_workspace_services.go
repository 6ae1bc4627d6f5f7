package handlers

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"berth/db"
	"berth/views"
)

// Runtime service definitions of a project workspace: validation and defaults (the edit form's
// rows are project_workspace_services_form.go).

// Limits and defaults of runtime service definitions.
const (
	maxWorkspaceServices   = 20
	defaultServicePortEnv  = "PORT"
	defaultServiceHealth   = "/"
	defaultServiceTimeoutS = 30
	maxServiceTimeoutS     = 600
	serviceStopManual      = "manual"
	serviceLifecycleEphem  = "ephemeral"
	maxServiceHealthLength = 1024
	maxServiceIdleM        = 7 * 24 * 60
)

var (
	serviceNameRE    = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)
	servicePortEnvRE = regexp.MustCompile(`^[A-Z_][A-Z0-9_]{0,63}$`)
	serviceStops     = []string{"manual", "on_run_finish", "idle_timeout"}
	serviceLifecycle = []string{"shared", "ephemeral"}
	// servicePortEnvReserved are variables a service's port must not replace: the process would
	// lose its PATH or identity, or could impersonate Berth's own run variables.
	servicePortEnvReserved = []string{"PATH", "HOME", "USER", "SHELL", "PWD", "TMPDIR", "LD_PRELOAD", "LD_LIBRARY_PATH"}
)

// serviceInput is a runtime service definition as submitted; empty members take defaults.
type serviceInput struct {
	Name          string `json:"name"`
	Command       string `json:"command"`
	PortEnv       string `json:"port_env"`
	HealthPath    string `json:"health_path"`
	ReadyTimeoutS *int   `json:"ready_timeout_s"`
	StopPolicy    string `json:"stop_policy"`
	Lifecycle     string `json:"lifecycle"`
	StripPrefix   *bool  `json:"strip_prefix"`
	IdleTimeoutM  *int   `json:"idle_timeout_m"`
}

// normalizeProjectServices validates service definitions and fills their defaults. Messages are
// keyed
// services[i].member; problems with the list itself are keyed services.
func normalizeProjectServices(in []serviceInput, fields map[string]string) []db.ServiceDefinition {
	if len(in) > maxWorkspaceServices {
		fields["services"] = fmt.Sprintf("at most %d services per workspace", maxWorkspaceServices)
		return nil
	}
	out := make([]db.ServiceDefinition, 0, len(in))
	seen := map[string]int{}
	for i, sv := range in {
		key := func(member string) string { return fmt.Sprintf("services[%d].%s", i, member) }
		d := db.ServiceDefinition{Name: strings.TrimSpace(sv.Name), Command: strings.TrimSpace(sv.Command),
			PortEnv: sv.PortEnv, HealthPath: sv.HealthPath, ReadyTimeoutS: defaultServiceTimeoutS,
			StopPolicy: sv.StopPolicy, Lifecycle: sv.Lifecycle}
		if d.PortEnv == "" {
			d.PortEnv = defaultServicePortEnv
		}
		if d.HealthPath == "" {
			d.HealthPath = defaultServiceHealth
		}
		if sv.ReadyTimeoutS != nil {
			d.ReadyTimeoutS = *sv.ReadyTimeoutS
		}
		if d.StopPolicy == "" {
			d.StopPolicy = serviceStopManual
		}
		if d.Lifecycle == "" {
			d.Lifecycle = serviceLifecycleEphem
		}
		if sv.StripPrefix != nil && !*sv.StripPrefix {
			d.StripPrefix = new(false) // stored only when false: absent means stripped
		}
		if sv.IdleTimeoutM != nil {
			d.IdleTimeoutM = *sv.IdleTimeoutM
			if d.IdleTimeoutM < 1 || d.IdleTimeoutM > maxServiceIdleM {
				fields[key("idle_timeout_m")] = fmt.Sprintf("must be from 1 to %d minutes", maxServiceIdleM)
			}
		}
		if j, dup := seen[d.Name]; dup && d.Name != "" {
			fields[key("name")] = fmt.Sprintf("%q is already the name of services[%d]", d.Name, j)
		} else if !serviceNameRE.MatchString(d.Name) {
			fields[key("name")] = "must be 1–64 of a-z, 0-9 and -"
		}
		seen[d.Name] = i
		projectAddProblem(fields, key("command"), serviceCommandProblem(d.Command))
		projectAddProblem(fields, key("port_env"), servicePortEnvProblem(d.PortEnv))
		projectAddProblem(fields, key("health_path"), serviceHealthProblem(d.HealthPath))
		if d.ReadyTimeoutS < 1 || d.ReadyTimeoutS > maxServiceTimeoutS {
			fields[key("ready_timeout_s")] = fmt.Sprintf("must be from 1 to %d seconds", maxServiceTimeoutS)
		}
		if !slices.Contains(serviceStops, d.StopPolicy) {
			fields[key("stop_policy")] = `must be "manual", "on_run_finish" or "idle_timeout"`
		}
		if !slices.Contains(serviceLifecycle, d.Lifecycle) {
			fields[key("lifecycle")] = `must be "shared" or "ephemeral"`
		}
		out = append(out, d)
	}
	return out
}

// serviceCommandProblem says what is wrong with a service command, or "".
func serviceCommandProblem(cmd string) string {
	switch {
	case cmd == "":
		return "is required"
	case utf8.RuneCountInString(cmd) > maxWorkspaceCommandLen:
		return fmt.Sprintf("must be at most %d characters", maxWorkspaceCommandLen)
	case strings.ContainsRune(cmd, 0):
		return "must not contain NUL bytes"
	}
	return ""
}

// servicePortEnvProblem says what is wrong with the variable that carries a service's port, or "".
func servicePortEnvProblem(name string) string {
	switch {
	case !servicePortEnvRE.MatchString(name):
		return "must be an environment variable name: A-Z, 0-9 and _, not starting with a digit (at most 64)"
	case slices.Contains(servicePortEnvReserved, name) || strings.HasPrefix(name, "BERTH_"):
		return fmt.Sprintf("%s is reserved; use a name such as PORT", name)
	}
	return ""
}

// serviceHealthProblem says what is wrong with a service's health path, or "".
func serviceHealthProblem(p string) string {
	switch {
	case !strings.HasPrefix(p, "/"):
		return `must start with "/"`
	case strings.HasPrefix(p, "//"):
		return `must be a path on the service, not start with "//"`
	case len(p) > maxServiceHealthLength:
		return fmt.Sprintf("must be at most %d characters", maxServiceHealthLength)
	case strings.ContainsFunc(p, func(r rune) bool { return r == ' ' || projectControlRune(r) }):
		return "must not contain spaces or control characters"
	}
	return ""
}

// serviceInputOf is a stored definition as input again, for a change that keeps it.
func serviceInputOf(d db.ServiceDefinition) serviceInput {
	in := serviceInput{Name: d.Name, Command: d.Command, PortEnv: d.PortEnv, HealthPath: d.HealthPath,
		ReadyTimeoutS: new(d.ReadyTimeoutS), StopPolicy: d.StopPolicy, Lifecycle: d.Lifecycle, StripPrefix: d.StripPrefix}
	if d.IdleTimeoutM > 0 {
		in.IdleTimeoutM = new(d.IdleTimeoutM)
	}
	return in
}

// sameServices reports whether two definition lists say the same (StripPrefix by value).
func sameServices(a, b []db.ServiceDefinition) bool {
	return slices.EqualFunc(a, b, func(x, y db.ServiceDefinition) bool {
		strip := func(d db.ServiceDefinition) bool { return d.StripPrefix == nil || *d.StripPrefix }
		if strip(x) != strip(y) {
			return false
		}
		x.StripPrefix, y.StripPrefix = nil, nil
		return x == y
	})
}

// serviceRow is a stored definition as the project workspace page shows it.
func serviceRow(d db.ServiceDefinition) views.ProjectServiceRow {
	return views.ProjectServiceRow{Name: d.Name, Command: d.Command, PortEnv: d.PortEnv, HealthPath: d.HealthPath,
		ReadyTimeoutS: d.ReadyTimeoutS, StopPolicy: d.StopPolicy, Lifecycle: d.Lifecycle,
		StripPrefix: d.StripPrefix == nil || *d.StripPrefix, IdleTimeoutM: d.IdleTimeoutM}
}
