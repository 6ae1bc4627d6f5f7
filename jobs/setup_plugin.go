package jobs

import (
	"context"
	"fmt"

	"berth/db"
	"berth/environment"
)

// Setup sessions of plugin environments (docs/plugins.md "Services and terminals"): the
// session's shell is the plugin's Terminal on an instance acquired for the session (key
// "setup-<session id>", the environment's active image version), not a setup jail on this host.
// The instance is recorded on the session (provider_ref) and released when the session ends:
// cancel, finish or expiry.

// SetupTerminals is the terminal side of a plugin environment's driver (an error wrapping
// environment.ErrTerminalUnsupported when its plugin names no terminal capability).
func SetupTerminals(ctx context.Context, d Deps, env db.Environment) (environment.RemoteTerminals, error) {
	drv, err := environmentDriver(ctx, d, env)
	if err != nil {
		return nil, err
	}
	rt, ok, err := environment.TerminalsOf(ctx, drv)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("setup terminal: %s environments have no plugin terminal: %w", env.Driver, environment.ErrTerminalUnsupported)
	}
	return rt, nil
}

// AcquireSetupInstance acquires the instance of session sess on its plugin environment env and
// records it on the session.
func AcquireSetupInstance(ctx context.Context, d Deps, env db.Environment, sess db.SetupSession) (environment.RemoteTerminals, environment.Instance, error) {
	rt, err := SetupTerminals(ctx, d, env)
	if err != nil {
		return nil, environment.Instance{}, err
	}
	inst, err := rt.Acquire(ctx, environment.AcquireRequest{Key: "setup-" + sess.ID, Tag: sess.ID})
	if err != nil {
		return nil, environment.Instance{}, err
	}
	if err := db.SetSetupSessionProviderRef(ctx, d.Pool, sess.CompanyID, sess.ID, inst.Ref); err != nil {
		return nil, environment.Instance{}, fmt.Errorf("%w (instance %s left for release)", err, inst.Ref)
	}
	return rt, inst, nil
}

// ReleaseSetupInstance releases the plugin instance of an ended session (nothing for a session
// that has none); releasing twice is not an error.
func ReleaseSetupInstance(ctx context.Context, d Deps, sess db.SetupSession) error {
	inst, ok := environment.RemoteInstance(sess.ProviderRef)
	if !ok || inst.Driver != environment.DriverPlugin {
		return nil
	}
	env, err := db.EnvironmentByID(ctx, d.Pool, sess.CompanyID, sess.EnvironmentID)
	if err != nil {
		return fmt.Errorf("release setup instance: %w", err)
	}
	drv, err := environmentDriver(ctx, d, env)
	if err != nil {
		return fmt.Errorf("release setup instance: %w", err)
	}
	return drv.Release(ctx, inst)
}
