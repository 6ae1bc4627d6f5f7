package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"berth/environment"
)

// pluginHost is this process's host of environment plugins: off (nil) unless BERTH_PLUGIN_DIR
// names the directory instance admins put plugin executables in. BERTH_PLUGIN_STATE_DIR is where
// each plugin keeps its own files (default /var/lib/berth-plugins when Berth runs as root, where
// plugins run as the berth-plugin user and cannot reach the data dir; else <data dir>/plugin-state).
func pluginHost(ctx context.Context, getenv func(string) string, dataDir string, log *slog.Logger) (*environment.PluginHost, error) {
	dir := getenv("BERTH_PLUGIN_DIR")
	if dir == "" {
		return nil, nil
	}
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("BERTH_PLUGIN_DIR must be an absolute path")
	}
	runAs, err := environment.PluginRunAs(ctx)
	if err != nil {
		return nil, fmt.Errorf("plugins: %w", err)
	}
	state := getenv("BERTH_PLUGIN_STATE_DIR")
	switch {
	case state != "" && !filepath.IsAbs(state):
		return nil, fmt.Errorf("BERTH_PLUGIN_STATE_DIR must be an absolute path")
	case state == "" && runAs != nil:
		state = "/var/lib/berth-plugins"
	case state == "":
		state = filepath.Join(dataDir, "plugin-state")
	}
	return environment.NewPluginHost(environment.PluginHostOptions{Dir: filepath.Clean(dir), StateDir: filepath.Clean(state),
		RunAs: runAs, Log: log}), nil
}
