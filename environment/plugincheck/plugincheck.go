// Package plugincheck is the driver protocol's contract suite (`berth plugin test PATH`): it runs
// a plugin the way Berth does (pinned by its sha256, as its own user, every call under a deadline)
// and checks each promise of docs/plugins.md, so a third party knows before an environment
// depends on it. A failed step says what the plugin did instead.
package plugincheck

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"berth/environment"
)

// Options say which plugin to check and with what.
type Options struct {
	// Path is the plugin executable. Its directory stands in for BERTH_PLUGIN_DIR.
	Path string
	// Settings is the environment's "settings" object for the plugin (JSON; default {}).
	Settings json.RawMessage
	// ImageDir is the image layer the suite's lease uses; it must hold /bin/sh. Default: a
	// minimal layer made from this host's /bin/sh and the libraries it needs.
	ImageDir string
	// StateDir is BERTH_PLUGIN_STATE_DIR for the run (default a temporary directory).
	StateDir string
	// RunAs is the identity the plugin runs as (nil: Berth's own).
	RunAs *environment.PluginIdentity
	// Out receives one line per step as it ends.
	Out io.Writer
}

// Step is one checked promise.
type Step struct {
	Name   string
	OK     bool
	Detail string
	Took   time.Duration
}

// Report is the suite's outcome: every step run, and whether all passed.
type Report struct {
	Steps []Step
	OK    bool
}

// Failed names the failed steps.
func (r Report) Failed() []string {
	var out []string
	for _, s := range r.Steps {
		if !s.OK {
			out = append(out, s.Name+": "+s.Detail)
		}
	}
	return out
}

// suite is one run's state.
type suite struct {
	opts   Options
	host   *environment.PluginHost
	drv    environment.Driver
	report Report
	work   string // scratch directory on this host
	// lastTag is the tag of the latest command.
	lastTag string
}

// Run checks the plugin at opts.Path. The error is only for a suite that could not be set up;
// a plugin that breaks the contract is a Report with OK false.
func Run(ctx context.Context, opts Options) (Report, error) {
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if len(opts.Settings) == 0 {
		opts.Settings = json.RawMessage("{}")
	}
	abs, err := filepath.Abs(opts.Path)
	if err != nil {
		return Report{}, err
	}
	opts.Path = abs
	sum, err := fileSHA256(abs)
	if err != nil {
		return Report{}, fmt.Errorf("plugin test: %w", err)
	}
	work, err := os.MkdirTemp("", "berth-plugin-test-")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o755); err != nil {
		return Report{}, err
	}
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(work, "state")
	}
	if opts.ImageDir == "" {
		opts.ImageDir = filepath.Join(work, "image")
		if err := MinimalImage(opts.ImageDir); err != nil {
			return Report{}, fmt.Errorf("plugin test: image: %w", err)
		}
	}
	imageDigest, err := layerDigest(opts.ImageDir)
	if err != nil {
		return Report{}, fmt.Errorf("plugin test: image: %w", err)
	}
	s := &suite{opts: opts, work: work}
	s.host = environment.NewPluginHost(environment.PluginHostOptions{Dir: filepath.Dir(abs), StateDir: opts.StateDir, RunAs: opts.RunAs})
	defer s.host.Close()
	cfg := environment.Config{Driver: environment.DriverPlugin, Plugin: environment.PluginConfig{Name: filepath.Base(abs),
		SHA256: sum, Settings: opts.Settings, TimeoutS: 3600}, Env: []environment.EnvVar{}}
	s.drv, err = environment.New(cfg, environment.Options{Plugins: s.host, ImageDir: opts.ImageDir, ImageDigest: imageDigest,
		DataDir: work, Grace: 2 * time.Second})
	if err != nil {
		return Report{}, fmt.Errorf("plugin test: %w", err)
	}
	s.run(ctx, cfg)
	s.report.OK = len(s.report.Failed()) == 0
	return s.report, nil
}

// step runs one check under its own deadline and records it.
func (s *suite) step(ctx context.Context, name string, limit time.Duration, f func(context.Context) (string, error)) bool {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	t0 := time.Now()
	detail, err := f(ctx)
	st := Step{Name: name, OK: err == nil, Detail: detail, Took: time.Since(t0)}
	if err != nil {
		st.Detail = err.Error()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			st.Detail = fmt.Sprintf("no answer within %s: %s", limit, err)
		}
	}
	s.report.Steps = append(s.report.Steps, st)
	mark := "ok  "
	if !st.OK {
		mark = "FAIL"
	}
	fmt.Fprintf(s.opts.Out, "%s %-28s %6s  %s\n", mark, name, st.Took.Round(time.Millisecond), st.Detail)
	return st.OK
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// layerDigest is a digest naming the test image (the SHA-256 of its file list and contents).
func layerDigest(dir string) (string, error) {
	h := sha256.New()
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %o %d\n", rel, fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), err
}

// contains reports whether out holds every one of want.
func contains(out string, want ...string) bool {
	for _, w := range want {
		if !strings.Contains(out, w) {
			return false
		}
	}
	return true
}
