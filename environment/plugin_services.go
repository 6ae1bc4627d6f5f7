package environment

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"

	"berth/environment/driverpb"
)

// Runtime services on a plugin's instances (docs/plugins.md "Services and terminals"). A plugin
// that names the services capability runs a service in an instance of its own (its container),
// never on this host: Berth acquires an instance for the service, realizes the workspace there,
// asks the plugin to start it and reaches it on the host loopback address the plugin answers.

// Optional capabilities a plugin names in Info.
const (
	CapabilityServices = "services"
	CapabilityTerminal = "terminal"
)

// ErrTerminalUnsupported means an environment's driver offers no interactive terminal.
var ErrTerminalUnsupported = errors.New("terminal unsupported")

// RemoteServiceRequest is one runtime service to start on a new instance of a plugin.
type RemoteServiceRequest struct {
	// Key names the service's instance (Acquire's key: a retry finds the same instance).
	Key string
	// Tag is the service's id; the instance's processes carry it.
	Tag string
	// WorkspaceRef and HostPath are the realized workspace to place on the instance.
	WorkspaceRef, HostPath string
	Name                   string // the service's name (one service per name on an instance)
	Command                string // run as /bin/sh -c Command in the workspace's root
	PortEnv                string // the variable that carries the port (default PORT)
	Env                    map[string]string
}

// RemoteService is a runtime service a plugin runs: its instance, and where this host reaches it
// (always 127.0.0.1).
type RemoteService struct {
	Instance Instance
	Root     string // the workspace's root on the instance
	Address  string // 127.0.0.1:port
	Port     int
}

// RemoteServices is a driver that runs runtime services on instances of its own.
type RemoteServices interface {
	// StartRemoteService acquires an instance for the service, realizes the workspace on it and
	// starts the service there. On failure nothing of it is left (the instance is released).
	StartRemoteService(ctx context.Context, req RemoteServiceRequest) (RemoteService, error)
	// StopRemoteService stops the service and releases its instance (everything of it gone).
	StopRemoteService(ctx context.Context, inst Instance, name string) error
}

// ServicesOf says how an environment's driver runs runtime services: ok is false for this
// host's drivers (the Supervisor runs them in a jail); for a plugin it is the plugin's own, or an
// error wrapping ErrServicesUnsupported when the plugin does not name the services capability.
func ServicesOf(ctx context.Context, drv Driver) (RemoteServices, bool, error) {
	d, ok := drv.(*pluginDriver)
	if !ok {
		return nil, false, nil
	}
	info, err := d.Info(ctx)
	if err != nil {
		return nil, true, err
	}
	if !slices.Contains(info.Capabilities, CapabilityServices) {
		return nil, true, fmt.Errorf("plugin %s (%s %s) does not offer runtime services (its Info names no %q capability); nothing was started: %w",
			d.cfg.Name, info.Name, info.Version, CapabilityServices, ErrServicesUnsupported)
	}
	return d, true, nil
}

// StartRemoteService implements RemoteServices.
func (d *pluginDriver) StartRemoteService(ctx context.Context, req RemoteServiceRequest) (RemoteService, error) {
	if req.Name == "" || req.Command == "" {
		return RemoteService{}, fmt.Errorf("start service: a name and a command are required: %w", ErrInvalidRequest)
	}
	if err := checkTag(req.Tag); err != nil {
		return RemoteService{}, fmt.Errorf("start service: %w", err)
	}
	portEnv := req.PortEnv
	if portEnv == "" {
		portEnv = "PORT"
	}
	inst, err := d.Acquire(ctx, AcquireRequest{Key: req.Key, Tag: req.Tag})
	if err != nil {
		return RemoteService{}, fmt.Errorf("start service: %w", err)
	}
	fail := func(err error) (RemoteService, error) {
		return RemoteService{}, errors.Join(fmt.Errorf("start service: %w", err), d.Release(context.WithoutCancel(ctx), inst))
	}
	real, err := d.Realize(ctx, RealizeRequest{Instance: inst, WorkspaceRef: req.WorkspaceRef, HostPath: req.HostPath})
	if err != nil {
		return fail(err)
	}
	ref, _ := refOf(inst)
	vars := map[string]string{"LANG": "C.UTF-8", "TERM": "dumb"}
	maps.Copy(vars, d.env)
	for k, v := range req.Env {
		vars[k] = v
	}
	delete(vars, TagVar)
	vars[ServiceVar] = req.Tag
	var resp *driverpb.StartServiceResponse
	err = d.call(ctx, "start service", pluginCallTimeout, func(ctx context.Context, c driverpb.DriverClient) error {
		var err error
		resp, err = c.StartService(ctx, &driverpb.StartServiceRequest{Settings: d.cfg.Settings, Ref: ref, Name: req.Name,
			Command: req.Command, Dir: real.Root, Env: vars, PortEnv: portEnv})
		return err
	})
	if err != nil {
		return fail(err)
	}
	port, err := loopbackPort(resp.Address)
	if err != nil {
		return fail(fmt.Errorf("plugin %s answered %q: %w", d.cfg.Name, pluginMessage(resp.Address), err))
	}
	return RemoteService{Instance: inst, Root: real.Root, Address: resp.Address, Port: port}, nil
}

// loopbackPort accepts only 127.0.0.1:PORT: a plugin never points Berth's preview proxy anywhere
// but this host's loopback.
func loopbackPort(addr string) (int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, errors.New("not host:port")
	}
	port, err := strconv.Atoi(p)
	if host != "127.0.0.1" || err != nil || port < 1 || port > 65535 {
		return 0, errors.New("not an address on 127.0.0.1")
	}
	return port, nil
}

// StopRemoteService implements RemoteServices: StopService (the plugin's grace), then Release,
// which removes the instance and whatever the service left; both under the plugin's deadlines.
func (d *pluginDriver) StopRemoteService(ctx context.Context, inst Instance, name string) error {
	ref, err := refOf(inst)
	if err != nil {
		return fmt.Errorf("stop service: %w", err)
	}
	stopErr := d.call(ctx, "stop service", pluginCallTimeout, func(ctx context.Context, c driverpb.DriverClient) error {
		_, err := c.StopService(ctx, &driverpb.StopServiceRequest{Settings: d.cfg.Settings, Ref: ref, Name: name})
		return err
	})
	if err := d.Release(ctx, inst); err != nil {
		return errors.Join(stopErr, err)
	}
	return nil // released: whatever StopService could not stop is gone with the instance
}
