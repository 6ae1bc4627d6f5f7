package environment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"berth/environment/driverpb"
)

// pluginRefPrefix starts every instance ref of a plugin environment, so jobs can tell a plugin's
// instances from this host's (RemoteInstance) without knowing the plugin.
const pluginRefPrefix = DriverPlugin + ":"

// pluginDriver is a Driver whose instances live wherever a plugin puts them (docs/plugins.md).
// Core keeps everything else: the lease, its fencing, the ledger, the receipts. Every call has a
// deadline; a plugin that crashed fails its calls with ErrDriverUnavailable and is started again
// at the next one.
type pluginDriver struct {
	host        *PluginHost
	cfg         PluginConfig
	env         map[string]string
	image       string // host directory of the active image layer ("" for none)
	imageDigest string
	tmp         string // where capsules are staged on this host
	grace       time.Duration

	mu    sync.Mutex
	roots map[string]string // realized roots on instances → the plugin's instance ref
}

func newPlugin(cfg Config, opts Options) (*pluginDriver, error) {
	env, err := configuredEnv(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("new plugin driver: %w", err)
	}
	if !ValidPluginName(cfg.Plugin.Name) || !sha256Pattern.MatchString(cfg.Plugin.SHA256) {
		return nil, fmt.Errorf("new plugin driver: the config names no plugin and digest: %w", ErrInvalidRequest)
	}
	d := &pluginDriver{host: opts.Plugins, cfg: cfg.Plugin, env: env, image: opts.ImageDir, imageDigest: opts.ImageDigest,
		tmp: os.TempDir(), grace: opts.Grace, roots: map[string]string{}}
	if opts.DataDir != "" {
		d.tmp = filepath.Join(opts.DataDir, "tmp")
		if err := os.MkdirAll(d.tmp, 0o700); err != nil {
			return nil, fmt.Errorf("new plugin driver: %w", err)
		}
	}
	if d.grace <= 0 {
		d.grace = DefaultGrace
	}
	if len(d.cfg.Settings) == 0 {
		d.cfg.Settings = []byte("{}")
	}
	return d, nil
}

// remoteInstances marks plugins as Remote: the workspace is realized on the plugin's instance.
func (d *pluginDriver) remoteInstances() {}

// RemoteInstance is the instance a lease's provider ref names when it is one of a remote driver
// (ssh or a plugin), which finalize must sync from and cleanup must release; ok is false for this
// host's drivers.
func RemoteInstance(providerRef string) (Instance, bool) {
	switch {
	case strings.HasPrefix(providerRef, DriverSSH+":"):
		return Instance{Driver: DriverSSH, Ref: providerRef}, true
	case strings.HasPrefix(providerRef, pluginRefPrefix):
		return Instance{Driver: DriverPlugin, Ref: providerRef}, true
	}
	return Instance{}, false
}

// Info names the plugin behind this driver (starting it if needed).
func (d *pluginDriver) Info(ctx context.Context) (PluginInfo, error) { return d.host.Info(ctx, d.cfg) }

// PluginInfoOf starts an environment's plugin if needed and returns what it says about itself;
// ok is false for drivers that are not plugins.
func PluginInfoOf(ctx context.Context, drv Driver) (PluginInfo, bool, error) {
	d, ok := drv.(*pluginDriver)
	if !ok {
		return PluginInfo{}, false, nil
	}
	info, err := d.Info(ctx)
	return info, true, err
}

// call runs one unary plugin call under its deadline and turns its failure into a driver error.
func (d *pluginDriver) call(ctx context.Context, what string, timeout time.Duration, f func(context.Context, driverpb.DriverClient) error) error {
	p, err := d.host.proc(ctx, d.cfg)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := f(cctx, p.rpc); err != nil {
		return d.failed(ctx, p, what, timeout, err)
	}
	return nil
}

// failed classifies a failed call: the caller's own end, a plugin that is gone or stopped
// answering (ErrDriverUnavailable; it is restarted at the next call), a refused request
// (ErrInvalidRequest), or the plugin's own error message.
func (d *pluginDriver) failed(ctx context.Context, p *pluginProc, what string, timeout time.Duration, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	st, isStatus := status.FromError(err)
	switch {
	case !p.alive() || st.Code() == codes.Unavailable:
		d.host.forget(d.cfg, p)
		return fmt.Errorf("%s: driver_unavailable: plugin %s stopped (it is started again at the next call): %w", what, d.cfg.Name,
			ErrDriverUnavailable)
	case st.Code() == codes.DeadlineExceeded:
		if !d.answers(p) {
			d.host.forget(d.cfg, p)
		}
		return fmt.Errorf("%s: driver_unavailable: plugin %s did not answer within %s: %w", what, d.cfg.Name, timeout, ErrDriverUnavailable)
	case st.Code() == codes.InvalidArgument:
		return fmt.Errorf("%s: %s: %w", what, pluginMessage(st.Message()), ErrInvalidRequest)
	case !isStatus: // Berth's own verdict on what the plugin sent (a capsule that does not match)
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: plugin %s: %s", what, d.cfg.Name, pluginMessage(st.Message()))
}

// answers reports whether the plugin still answers Info within a few seconds (a slow call is not
// a hung plugin).
func (d *pluginDriver) answers(p *pluginProc) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := p.rpc.Info(ctx, &driverpb.InfoRequest{})
	return err == nil
}

// callError is the message of a failed call, for errors outside a driver method.
func callError(err error) error {
	if st, ok := status.FromError(err); ok {
		return errors.New(pluginMessage(st.Message()))
	}
	return err
}

// pluginMessage keeps a plugin's error text printable and short: it ends up in logs and pages.
func pluginMessage(m string) string {
	m = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, m)
	if len(m) > 1024 {
		m = m[:1024] + "…"
	}
	return m
}

// refOf checks that inst is one of this driver's and returns the plugin's own ref.
func refOf(inst Instance) (string, error) {
	ref, ok := strings.CutPrefix(inst.Ref, pluginRefPrefix)
	if inst.Driver != DriverPlugin || !ok || ref == "" {
		return "", fmt.Errorf("instance %s %q is not a plugin's: %w", inst.Driver, inst.Ref, ErrInvalidRequest)
	}
	return ref, nil
}

// Acquire asks the plugin for the lease's instance, sending the active image first when the
// plugin says it does not have it.
func (d *pluginDriver) Acquire(ctx context.Context, req AcquireRequest) (Instance, error) {
	if !keyPattern.MatchString(req.Key) {
		return Instance{}, fmt.Errorf("acquire: the key must be 1 to 128 letters, digits, '.', '_', ':' or '-': %w", ErrInvalidRequest)
	}
	for attempt := 0; ; attempt++ {
		var resp *driverpb.AcquireResponse
		err := d.call(ctx, "acquire", pluginCallTimeout, func(ctx context.Context, c driverpb.DriverClient) error {
			var err error
			resp, err = c.Acquire(ctx, &driverpb.AcquireRequest{Settings: d.cfg.Settings, Key: req.Key, Tag: req.Tag,
				ImageDigest: d.imageDigest})
			return err
		})
		if err != nil {
			return Instance{}, err
		}
		if !resp.NeedImage {
			if resp.Ref == "" || len(resp.Ref) > 512 || strings.ContainsAny(resp.Ref, "\x00\n") {
				return Instance{}, fmt.Errorf("acquire: plugin %s answered no usable ref", d.cfg.Name)
			}
			return Instance{Driver: DriverPlugin, Ref: pluginRefPrefix + resp.Ref}, nil
		}
		if attempt > 0 || d.image == "" {
			return Instance{}, fmt.Errorf("acquire: plugin %s still lacks image %s", d.cfg.Name, d.imageDigest)
		}
		if err := d.putImage(ctx); err != nil {
			return Instance{}, fmt.Errorf("acquire: send image: %w", err)
		}
	}
}

// Release asks the plugin to give the instance back.
func (d *pluginDriver) Release(ctx context.Context, inst Instance) error {
	ref, err := refOf(inst)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return d.call(ctx, "release", pluginCallTimeout, func(ctx context.Context, c driverpb.DriverClient) error {
		_, err := c.Release(ctx, &driverpb.ReleaseRequest{Settings: d.cfg.Settings, Ref: ref})
		return err
	})
}

// Probe asks the plugin to qualify the environment and adds what Berth knows of the plugin.
func (d *pluginDriver) Probe(ctx context.Context) (ProbeResult, error) {
	info, err := d.host.Info(ctx, d.cfg)
	if err != nil {
		c := Check{Name: "plugin", Status: CheckFail, Detail: err.Error()}
		return ProbeResult{OK: false, Summary: "Plugin probe failed: " + c.Detail + ".", Checks: []Check{c}}, nil
	}
	pc := Check{Name: "plugin", Status: CheckInfo, Detail: fmt.Sprintf("%s %s (file %s, protocol %d; %s)", info.Name, info.Version,
		d.cfg.Name, info.ProtocolVersion, capabilityText(info.Capabilities))}
	var resp *driverpb.ProbeResponse
	err = d.call(ctx, "probe", pluginCallTimeout, func(ctx context.Context, c driverpb.DriverClient) error {
		var err error
		resp, err = c.Probe(ctx, &driverpb.ProbeRequest{Settings: d.cfg.Settings})
		return err
	})
	if err != nil {
		c := Check{Name: "probe", Status: CheckFail, Detail: err.Error()}
		return ProbeResult{Summary: "Plugin probe failed: " + c.Detail + ".", Checks: []Check{pc, c}}, nil
	}
	r := ProbeResult{OK: resp.Ok, Summary: pluginMessage(resp.Summary), Checks: []Check{pc}}
	for _, c := range resp.Checks {
		st := CheckStatus(c.Status)
		if st != CheckPass && st != CheckFail && st != CheckInfo {
			st = CheckInfo
		}
		if st == CheckFail {
			r.OK = false
		}
		r.Checks = append(r.Checks, Check{Name: pluginMessage(c.Name), Status: st, Detail: pluginMessage(c.Detail)})
	}
	if r.Summary == "" {
		r.Summary = "Plugin probe passed."
		if !r.OK {
			r.Summary = "Plugin probe failed."
		}
	}
	return r, nil
}

func capabilityText(caps []string) string {
	if len(caps) == 0 {
		return "no optional capabilities"
	}
	return strings.Join(caps, ", ")
}

// chunkSize is the size of the data messages of every stream Berth sends.
const chunkSize = 256 << 10

// chunkWriter sends what is written to it as data messages.
type chunkWriter struct{ send func([]byte) error }

func (w chunkWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += chunkSize {
		end := min(off+chunkSize, len(p))
		if err := w.send(p[off:end]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// copyChunks sends r in data messages and returns how many bytes went.
func copyChunks(r io.Reader, send func([]byte) error) (int64, error) {
	buf := make([]byte, chunkSize)
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			if serr := send(buf[:k]); serr != nil {
				return n, serr
			}
			n += int64(k)
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
