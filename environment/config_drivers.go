package environment

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// The settings of each driver (local containment, ssh, sandbox), read by the parser of
// config_parse.go.

// MaxMasks caps a local environment's mask list.
const MaxMasks = 32

// containment reads a local environment's "containment" ("jail", the default, or "none") and
// "mask" (absolute host paths no run may see, besides Berth's own data dir and home).
func (p *parser) containment() (string, []string) {
	mode := ContainmentJail
	if raw, ok := p.member("containment"); ok {
		var s string
		if json.Unmarshal(raw, &s) != nil || (s != ContainmentJail && s != ContainmentNone) {
			p.fail("containment", `must be "jail" (the default) or "none"`)
		} else {
			mode = s
		}
	}
	var masks []string
	if raw, ok := p.member("mask"); ok {
		if json.Unmarshal(raw, &masks) != nil {
			p.fail("mask", "must be a list of absolute paths")
			return mode, nil
		}
		if len(masks) > MaxMasks {
			p.fail("mask", fmt.Sprintf("at most %d paths", MaxMasks))
		}
		for i, m := range masks {
			if m == "" || m[0] != '/' || filepath.Clean(m) != m || m == "/" || strings.ContainsRune(m, 0) || len(m) > 4096 {
				p.fail(fmt.Sprintf("mask[%d]", i), "must be an absolute, clean path below /")
			}
		}
		slices.Sort(masks)
		masks = slices.Compact(masks)
	}
	return mode, masks
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
	if raw, ok := p.member("base_dir"); ok {
		var b string
		if json.Unmarshal(raw, &b) != nil || !validBaseDir(b) {
			p.fail("base_dir", `must be an absolute path or one under "~/" (the remote user's home), without ".." or control characters`)
		} else {
			c.BaseDir = b
		}
	}
	return c, p.privateKey(stored)
}

// validBaseDir accepts an absolute clean path, or "~/" and a clean relative path, below the root.
func validBaseDir(b string) bool {
	if len(b) > 1024 || strings.ContainsFunc(b, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return false
	}
	rest, home := strings.CutPrefix(b, "~/")
	if home {
		return rest != "" && filepath.IsLocal(rest) && filepath.Clean(rest) == rest
	}
	return filepath.IsAbs(b) && filepath.Clean(b) == b && b != "/"
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
