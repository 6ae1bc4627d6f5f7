package environment

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"berth/environment/jail"
)

// startJail readies the host for spec (ownership, traversal) and makes the jail's command. done
// closes the jail's data pipes; call it after the command has ended. The trees handed to the run
// user stay its own while the workspace is open: a runtime service may still be writing there
// after the run that started it ended.
func startJail(h jail.Host, spec jail.Spec, within, store string) (*exec.Cmd, func(), error) {
	c, err := jail.Build(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", err, ErrInvalidRequest)
	}
	if err := h.Prepare(spec, within, store); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", err, ErrDriverUnavailable)
	}
	cmd, closeData, err := h.Command(c)
	if err != nil {
		return nil, nil, err
	}
	return cmd, closeData, nil
}

// envMap turns a KEY=VALUE list into a map.
func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// configuredEnv resolves an environment's configured variables, secret values included.
func configuredEnv(cfg Config, opts Options) (map[string]string, error) {
	env := make(map[string]string, len(cfg.Env))
	for _, v := range cfg.Env {
		if msg := envNameProblem(v.Name); msg != "" {
			return nil, fmt.Errorf("variable %s: %w", msg, ErrInvalidRequest)
		}
		value := v.Value
		if v.Secret {
			s, ok := opts.Secrets.Env[v.Name]
			if !ok {
				return nil, fmt.Errorf("secret variable %s has no value: %w", v.Name, ErrInvalidRequest)
			}
			value = s
		}
		env[v.Name] = value
	}
	return env, nil
}

// checkRequest refuses a malformed ExecRequest before anything starts.
func checkRequest(req ExecRequest) error {
	if strings.TrimSpace(req.Command) == "" || strings.ContainsRune(req.Command, 0) {
		return fmt.Errorf("command must be non-empty without NUL: %w", ErrInvalidRequest)
	}
	if !filepath.IsAbs(req.Dir) {
		return fmt.Errorf("dir must be an absolute path: %w", ErrInvalidRequest)
	}
	if fi, err := os.Stat(req.Dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("dir is not an existing directory: %w", ErrInvalidRequest)
	}
	if err := checkTag(req.Tag); err != nil {
		return err
	}
	if req.Timeout < 0 {
		return fmt.Errorf("timeout must not be negative: %w", ErrInvalidRequest)
	}
	return nil
}

// commandEnv is a command's whole environment: base, then the environment's configured
// variables, then the request's, plus the tag (first, so it is cheap to find).
func commandEnv(req ExecRequest, base, configured map[string]string) ([]string, error) {
	vars := maps.Clone(base)
	maps.Copy(vars, configured)
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("env %q: names need no '=' or NUL, values no NUL: %w", k, ErrInvalidRequest)
		}
		if k == TagVar && v != req.Tag {
			return nil, fmt.Errorf("env %s differs from the tag: %w", TagVar, ErrInvalidRequest)
		}
		vars[k] = v
	}
	delete(vars, TagVar)
	out := []string{TagVar + "=" + req.Tag}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		out = append(out, k+"="+vars[k])
	}
	return out, nil
}
