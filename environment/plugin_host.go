package environment

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"berth/environment/driverpb"
)

// ErrPluginDigest means a plugin file's SHA-256 is not the one its environment pins: Berth does
// not run it. Refusals name the file and both digests, nothing else.
var ErrPluginDigest = errors.New("plugin_digest_mismatch")

// PluginUser is the host user plugins run as when Berth runs as root (created on first use, no
// login shell, no home): a plugin cannot read Berth's data dir, its secret key or its database.
const PluginUser = "berth-plugin"

// Deadlines of plugin calls (docs/plugins.md). Exec's is the command's own timeout plus grace.
const (
	pluginStartTimeout = 10 * time.Second
	pluginInfoTimeout  = 10 * time.Second
	pluginCallTimeout  = 2 * time.Minute  // probe, acquire, release, cancel, services
	pluginDataTimeout  = 30 * time.Minute // realize, sync and images: streams of up to gigabytes
	pluginRestartWait  = time.Second      // between two starts of one plugin
)

// PluginHostOptions say where plugins live and as whom they run.
type PluginHostOptions struct {
	// Dir is BERTH_PLUGIN_DIR: the only directory plugin executables are taken from.
	Dir string
	// StateDir holds a directory per plugin, its own to write (images, scratch files).
	StateDir string
	// RunAs is the identity plugins run as; nil keeps Berth's own (when Berth is not root).
	RunAs *PluginIdentity
	// Log receives plugin starts, exits and the plugins' own log lines.
	Log *slog.Logger
}

// PluginIdentity is a uid/gid pair a plugin process runs as.
type PluginIdentity struct{ UID, GID int }

// PluginHost starts, watches and restarts plugin processes: one per plugin file and digest, shared
// by every environment that names them, restarted after a crash at its next call. It lives as
// long as the Berth process; Close ends every plugin.
type PluginHost struct {
	opts PluginHostOptions

	mu     sync.Mutex
	slots  map[string]*pluginSlot // by name + "@" + sha256
	closed bool
}

// pluginSlot holds one plugin's process; its lock is held while the process starts, so a plugin
// that is slow to start (or never answers) delays only its own callers.
type pluginSlot struct {
	mu sync.Mutex
	p  *pluginProc
}

// NewPluginHost makes a host for plugins under opts.Dir.
func NewPluginHost(opts PluginHostOptions) *PluginHost {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &PluginHost{opts: opts, slots: map[string]*pluginSlot{}}
}

// PluginInfo is what a running plugin says about itself.
type PluginInfo struct {
	Name            string   `json:"name"`
	Version         string   `json:"version"`
	ProtocolVersion uint32   `json:"protocol_version"`
	Capabilities    []string `json:"capabilities"`
}

// pluginProc is one running plugin process.
type pluginProc struct {
	client *plugin.Client
	rpc    driverpb.DriverClient
	info   PluginInfo
	file   string
}

// alive reports whether the process is still there.
func (p *pluginProc) alive() bool { return !p.client.Exited() }

// proc returns the running process of cfg's plugin, starting it (after checking its digest) when
// there is none or the last one exited.
func (h *PluginHost) proc(ctx context.Context, cfg PluginConfig) (*pluginProc, error) {
	if h == nil || h.opts.Dir == "" {
		return nil, fmt.Errorf("plugins are not enabled on this node (set BERTH_PLUGIN_DIR): %w", ErrDriverUnavailable)
	}
	slot, err := h.slot(cfg)
	if err != nil {
		return nil, err
	}
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if p := slot.p; p != nil {
		if p.alive() {
			return p, nil
		}
		h.opts.Log.Warn("plugin exited; restarting it", "plugin", cfg.Name)
		p.client.Kill()
		slot.p = nil
	}
	p, err := h.start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	slot.p = p
	return p, nil
}

// slot is cfg's plugin slot, made on first use.
func (h *PluginHost) slot(cfg PluginConfig) (*pluginSlot, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, fmt.Errorf("plugin %s: the host is shutting down: %w", cfg.Name, ErrDriverUnavailable)
	}
	key := cfg.Name + "@" + cfg.SHA256
	s := h.slots[key]
	if s == nil {
		s = &pluginSlot{}
		h.slots[key] = s
	}
	return s, nil
}

// start verifies the plugin file and runs it.
func (h *PluginHost) start(ctx context.Context, cfg PluginConfig) (*pluginProc, error) {
	if !ValidPluginName(cfg.Name) || !sha256Pattern.MatchString(cfg.SHA256) {
		return nil, fmt.Errorf("plugin config names no plugin file and digest: %w", ErrInvalidRequest)
	}
	file := filepath.Join(h.opts.Dir, cfg.Name)
	sum, err := verifyPluginFile(file, h.opts.RunAs)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", cfg.Name, err)
	}
	if sum != cfg.SHA256 {
		return nil, fmt.Errorf("plugin %s: the file's sha256 is %s, the environment pins %s: %w", cfg.Name, sum, cfg.SHA256, ErrPluginDigest)
	}
	state, err := h.stateDir(cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", cfg.Name, err)
	}
	want, _ := hex.DecodeString(sum)
	cmd := exec.Command(file)
	cmd.Dir = state
	// TMPDIR stays the system's: go-plugin puts the plugin's socket there (in a 0700 directory of
	// the plugin's own), and a socket path must stay short.
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=" + state, "TMPDIR=/tmp",
		"LANG=C.UTF-8", "BERTH_PLUGIN_STATE=" + state}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if id := h.opts.RunAs; id != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(id.UID), Gid: uint32(id.GID), NoSetGroups: true}
	}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  driverpb.Handshake,
		Plugins:          driverpb.Plugins(nil),
		Cmd:              cmd,
		SecureConfig:     &plugin.SecureConfig{Checksum: want, Hash: sha256.New()}, // checked again just before exec
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		StartTimeout:     pluginStartTimeout,
		SkipHostEnv:      true, // nothing of Berth's own environment reaches a plugin
		Logger:           pluginLogger(h.opts.Log, cfg.Name),
		Stderr:           io.Discard,
	})
	fail := func(err error) (*pluginProc, error) {
		client.Kill()
		return nil, fmt.Errorf("plugin %s did not start: %w: %w", cfg.Name, err, ErrDriverUnavailable)
	}
	cp, err := client.Client()
	if err != nil {
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			client.Kill()
			return nil, fmt.Errorf("plugin %s changed while it was started: %w", cfg.Name, ErrPluginDigest)
		}
		return fail(err)
	}
	raw, err := cp.Dispense(driverpb.PluginName)
	if err != nil {
		return fail(err)
	}
	rpc, ok := raw.(driverpb.DriverClient)
	if !ok {
		return fail(errors.New("it does not serve the driver protocol"))
	}
	ictx, cancel := context.WithTimeout(ctx, pluginInfoTimeout)
	defer cancel()
	info, err := rpc.Info(ictx, &driverpb.InfoRequest{})
	if err != nil {
		return fail(fmt.Errorf("Info: %w", callError(err)))
	}
	if info.ProtocolVersion != driverpb.ProtocolVersion {
		return fail(fmt.Errorf("it speaks protocol %d, Berth %d", info.ProtocolVersion, driverpb.ProtocolVersion))
	}
	h.opts.Log.Info("plugin started", "plugin", cfg.Name, "name", info.Name, "version", info.Version)
	return &pluginProc{client: client, rpc: rpc, file: file, info: PluginInfo{Name: info.Name, Version: info.Version,
		ProtocolVersion: info.ProtocolVersion, Capabilities: info.Capabilities}}, nil
}

// stateDir makes the plugin's own directory (and its tmp) owned by its identity.
func (h *PluginHost) stateDir(name string) (string, error) {
	if h.opts.StateDir == "" || !filepath.IsAbs(h.opts.StateDir) {
		return "", fmt.Errorf("no plugin state dir (BERTH_PLUGIN_STATE_DIR): %w", ErrDriverUnavailable)
	}
	if err := os.MkdirAll(h.opts.StateDir, 0o755); err != nil {
		return "", fmt.Errorf("plugin state dir: %w", err)
	}
	dir := filepath.Join(h.opts.StateDir, name)
	for _, d := range []string{dir, filepath.Join(dir, "tmp")} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("plugin state dir: %w", err)
		}
		if id := h.opts.RunAs; id != nil {
			if err := os.Lchown(d, id.UID, id.GID); err != nil {
				return "", fmt.Errorf("plugin state dir: %w", err)
			}
		}
	}
	return dir, nil
}

// verifyPluginFile hashes a plugin file after checking that nobody but root or Berth's own user
// can replace it (the file and its directory are not writable by group, others or the plugin's
// identity): a file the plugin user could rewrite would not stay the one that was pinned.
func verifyPluginFile(file string, runAs *PluginIdentity) (string, error) {
	for _, p := range []string{filepath.Dir(file), file} {
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("%s: %w", filepath.Base(p), ErrDriverUnavailable)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return "", fmt.Errorf("no ownership information: %w", ErrDriverUnavailable)
		}
		owner := int(st.Uid)
		if fi.Mode().Perm()&0o022 != 0 || (owner != 0 && owner != os.Geteuid()) || (runAs != nil && owner == runAs.UID) {
			return "", fmt.Errorf("%s must belong to root (or Berth's user) and be writable by nobody else: %w",
				filepath.Base(p), ErrDriverUnavailable)
		}
		if p == file && (!fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0) {
			return "", fmt.Errorf("not an executable file: %w", ErrDriverUnavailable)
		}
	}
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("open: %w", ErrDriverUnavailable)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read: %w", ErrDriverUnavailable)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Info starts cfg's plugin if needed and returns what it says about itself.
func (h *PluginHost) Info(ctx context.Context, cfg PluginConfig) (PluginInfo, error) {
	p, err := h.proc(ctx, cfg)
	if err != nil {
		return PluginInfo{}, err
	}
	return p.info, nil
}

// forget drops p if it is still cfg's process and kills it, so the next call starts a new one.
func (h *PluginHost) forget(cfg PluginConfig, p *pluginProc) {
	if slot, err := h.slot(cfg); err == nil {
		slot.mu.Lock()
		if slot.p == p {
			slot.p = nil
		}
		slot.mu.Unlock()
	}
	p.client.Kill()
}

// Close ends every plugin process; later calls fail with ErrDriverUnavailable.
func (h *PluginHost) Close() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	slots := h.slots
	h.slots, h.closed = map[string]*pluginSlot{}, true
	h.mu.Unlock()
	for _, s := range slots {
		s.mu.Lock()
		if s.p != nil {
			s.p.client.Kill()
		}
		s.mu.Unlock()
	}
	return nil
}

// pluginLogger forwards go-plugin's log (and the plugin's stderr lines) to slog at debug level,
// warnings and errors as they are.
func pluginLogger(log *slog.Logger, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "plugin." + name, Level: hclog.Warn, Output: slogWriter{log: log, plugin: name},
		DisableTime: true})
}

// slogWriter turns hclog's lines into slog records.
type slogWriter struct {
	log    *slog.Logger
	plugin string
}

func (w slogWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	if len(line) > 2048 {
		line = line[:2048]
	}
	w.log.Warn("plugin log", "plugin", w.plugin, "line", line)
	return len(p), nil
}

// Kill ends cfg's plugin process as a crash would (SIGKILL); the next call starts it again. The
// contract suite uses it to check the restart.
func (h *PluginHost) Kill(cfg PluginConfig) {
	slot, err := h.slot(cfg)
	if err != nil {
		return
	}
	slot.mu.Lock()
	p := slot.p
	slot.mu.Unlock()
	if p == nil {
		return
	}
	if rc := p.client.ReattachConfig(); rc != nil && rc.Pid > 0 {
		_ = syscall.Kill(rc.Pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.alive() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}
