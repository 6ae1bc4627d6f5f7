package jail

// What a Spec may ask for: the checks Build makes before it computes a jail (ErrInvalid), and
// the path predicates they and the profiles share.

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

func (s Spec) check() error {
	switch s.Profile {
	case Local, Sandbox, Setup, Git:
	default:
		return fmt.Errorf("unknown profile %q: %w", s.Profile, ErrInvalid)
	}
	if !absClean(s.Bwrap) {
		return fmt.Errorf("bwrap must be an absolute path: %w", ErrInvalid)
	}
	if s.RunAs != nil && (!absClean(s.Setpriv) || s.RunAs.UID <= 0 || s.RunAs.GID <= 0) {
		return fmt.Errorf("a run identity needs setpriv's absolute path and non-root ids: %w", ErrInvalid)
	}
	if !absClean(s.Workspace) || s.Workspace == "/" {
		return fmt.Errorf("workspace must be an absolute, clean path below /: %w", ErrInvalid)
	}
	if s.Dir != "" && (filepath.IsAbs(s.Dir) || !filepath.IsLocal(s.Dir)) {
		return fmt.Errorf("dir must be relative to the workspace and stay inside it: %w", ErrInvalid)
	}
	if strings.TrimSpace(s.Command) == "" || strings.ContainsRune(s.Command, 0) {
		return fmt.Errorf("command must be non-empty without NUL: %w", ErrInvalid)
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("env %q: names need no '=' or NUL, values no NUL: %w", k, ErrInvalid)
		}
	}
	switch s.Profile {
	case Local, Git:
		if s.Home != "" && !absClean(s.Home) {
			return fmt.Errorf("home must be an absolute, clean path: %w", ErrInvalid)
		}
		for _, m := range s.Masks {
			if !absClean(m) || m == "/" {
				return fmt.Errorf("mask %q must be an absolute, clean path below /: %w", m, ErrInvalid)
			}
			if m == s.Workspace {
				return fmt.Errorf("a mask may not be the workspace itself: %w", ErrInvalid)
			}
		}
		for _, b := range append(slices.Clone(s.ReadOnly), s.ReadWrite...) {
			if !absClean(b.Src) || !absClean(b.dst()) || b.dst() == "/" {
				return fmt.Errorf("bind paths must be absolute and clean: %w", ErrInvalid)
			}
			if s.Profile == Git && overGitRoot(b.dst()) {
				return fmt.Errorf("a git jail binds nothing over its own root: %w", ErrInvalid)
			}
		}
		if s.Profile == Git && (Within(s.Workspace, "/usr") || Within(s.Workspace, "/etc")) {
			return fmt.Errorf("a git jail's workspace cannot be under /usr or /etc: %w", ErrInvalid)
		}
	case Sandbox, Setup:
		for _, b := range s.ReadOnly {
			if !absClean(b.Src) || !absClean(b.dst()) || !Within(b.dst(), "/tmp") {
				return fmt.Errorf("a sandbox's extra binds are files under its /tmp: %w", ErrInvalid)
			}
		}
		if !absClean(s.Image) {
			return fmt.Errorf("image layer must be an absolute, clean path: %w", ErrInvalid)
		}
		if (s.Limits.MemoryMB > 0 || s.Limits.PidsMax > 0) && !absClean(s.Prlimit) {
			return fmt.Errorf("limits need prlimit's absolute path: %w", ErrInvalid)
		}
		if s.Limits.MemoryMB < 0 || s.Limits.PidsMax < 0 {
			return fmt.Errorf("limits must not be negative: %w", ErrInvalid)
		}
	}
	return nil
}

func absClean(p string) bool { return p != "" && filepath.IsAbs(p) && filepath.Clean(p) == p }

// Within reports whether p is dir or below it.
func Within(p, dir string) bool {
	if p == dir {
		return true
	}
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return strings.HasPrefix(p, dir+"/")
}

// overGitRoot reports whether a bind at dst would cover part of the git jail's own root: its /usr,
// /etc, /proc or devices. Below /dev/shm is not: it is a tmpfs where a data dir may live (the git
// jail's /dev/shm is its own, so a bind there hides nothing of the host's).
func overGitRoot(dst string) bool {
	if Within(dst, "/dev/shm") && dst != "/dev/shm" {
		return false
	}
	return Within(dst, "/usr") || Within(dst, "/etc") || Within(dst, "/proc") || Within(dst, "/dev")
}
