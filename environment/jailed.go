package environment

import (
	"fmt"
	"os/exec"
	"strings"

	"berth/environment/jail"
)

// startJail readies the host for spec (ownership, traversal) and makes the jail's command. done
// closes the jail's data pipes and hands the written trees back to Berth's uid; call it after the
// command has ended.
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
	done := func() {
		closeData()
		// The workspace goes back to Berth's uid between runs; HOME stays the run user's.
		for _, p := range []string{spec.Workspace, store} {
			if p != "" && within != "" && p != within && jail.Within(p, within) {
				_ = h.HandBack(p)
			}
		}
	}
	return cmd, done, nil
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
