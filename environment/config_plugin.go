package environment

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
)

// Plugin settings limits and defaults (docs/plugins.md).
const (
	// MaxPluginSettingsBytes caps the settings object a plugin environment passes to its plugin.
	MaxPluginSettingsBytes = 64 << 10
	// DefaultPluginTimeoutS is a plugin environment's command time limit when none is set.
	DefaultPluginTimeoutS = 3600
)

// PluginConfig names the executable of a plugin environment and pins it: Name is a file under
// BERTH_PLUGIN_DIR, SHA256 the hex digest that file must have (a mismatch is refused before it
// runs). Settings is the plugin's own configuration, a JSON object Berth passes on unread.
type PluginConfig struct {
	Name     string
	SHA256   string
	Settings json.RawMessage
	TimeoutS int
}

// pluginNamePattern is a plugin's file name: one path component, no hidden files.
var pluginNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// sha256Pattern is a lower-case hex SHA-256.
var sha256Pattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ValidPluginName reports whether name can name a file under BERTH_PLUGIN_DIR.
func ValidPluginName(name string) bool { return pluginNamePattern.MatchString(name) }

// plugin reads a plugin environment's settings.
func (p *parser) plugin() PluginConfig {
	c := PluginConfig{TimeoutS: p.integer("timeout_s", DefaultPluginTimeoutS, 1, 86400), Settings: json.RawMessage("{}")}
	if name, ok := p.str("plugin", "required: the plugin's file name under BERTH_PLUGIN_DIR"); ok {
		if ValidPluginName(name) {
			c.Name = name
		} else {
			p.fail("plugin", "must be a file name: letters, digits, '.', '_' or '-', at most 64, not starting with '.' or '-'")
		}
	}
	if sum, ok := p.str("sha256", "required: the plugin file's SHA-256 (sha256sum prints it)"); ok {
		if sha256Pattern.MatchString(sum) {
			c.SHA256 = sum
		} else {
			p.fail("sha256", "must be 64 lower-case hex digits, as sha256sum prints them")
		}
	}
	if raw, ok := p.member("settings"); ok {
		var obj map[string]json.RawMessage
		var buf bytes.Buffer
		switch {
		case json.Unmarshal(raw, &obj) != nil || obj == nil:
			p.fail("settings", "must be a JSON object (the plugin's own settings)")
		case json.Compact(&buf, raw) != nil || buf.Len() > MaxPluginSettingsBytes:
			p.fail("settings", fmt.Sprintf("at most %d bytes", MaxPluginSettingsBytes))
		default:
			c.Settings = json.RawMessage(buf.Bytes())
		}
	}
	return c
}

// pluginDoc is a plugin environment's stored config.
type pluginDoc struct {
	Plugin          string          `json:"plugin"`
	SHA256          string          `json:"sha256"`
	Settings        json.RawMessage `json:"settings"`
	TimeoutS        int             `json:"timeout_s"`
	Env             []envDoc        `json:"env"`
	MaxParallelRuns int             `json:"max_parallel_runs,omitempty"`
}

func pluginDocOf(c Config, env []envDoc) pluginDoc {
	settings := c.Plugin.Settings
	if len(settings) == 0 {
		settings = json.RawMessage("{}")
	}
	return pluginDoc{Plugin: c.Plugin.Name, SHA256: c.Plugin.SHA256, Settings: settings, TimeoutS: c.Plugin.TimeoutS,
		Env: env, MaxParallelRuns: c.MaxParallelRuns}
}

func (d pluginDoc) config() PluginConfig {
	return PluginConfig{Name: d.Plugin, SHA256: d.SHA256, Settings: d.Settings, TimeoutS: d.TimeoutS}
}
