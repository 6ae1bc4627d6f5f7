package environment

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// onHost is the instance lifecycle of the drivers that run commands on this host (local and
// sandbox): one instance per node, and the workspace package already put the workspace on this
// host's disk, so realizing and syncing are checks only.
type onHost struct {
	driver string
	ref    string // the instance ref: driver + ":" + node id
}

// newOnHost names this node's instance of driver (node id, else the host name).
func newOnHost(driver, node string) onHost {
	if node == "" {
		if h, err := os.Hostname(); err == nil && h != "" {
			node = h
		} else {
			node = "localhost"
		}
	}
	return onHost{driver: driver, ref: driver + ":" + node}
}

// Acquire returns this node: a driver on this host has exactly one instance, shared by every run.
func (d onHost) Acquire(ctx context.Context, _ AcquireRequest) (Instance, error) {
	if err := ctx.Err(); err != nil {
		return Instance{}, fmt.Errorf("acquire: %w", err)
	}
	return Instance{Driver: d.driver, Ref: d.ref}, nil
}

// Realize checks that the workspace is a real directory on this node and runs commands right there.
func (d onHost) Realize(ctx context.Context, req RealizeRequest) (Realization, error) {
	if err := ctx.Err(); err != nil {
		return Realization{}, fmt.Errorf("realize: %w", err)
	}
	if err := d.ownInstance(req.Instance); err != nil {
		return Realization{}, fmt.Errorf("realize: %w", err)
	}
	p := req.HostPath
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return Realization{}, fmt.Errorf("realize: host path must be absolute and clean: %w", ErrInvalidRequest)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return Realization{}, fmt.Errorf("realize: host path: %s: %w", errnoText(err), ErrInvalidRequest)
	}
	if !fi.IsDir() {
		return Realization{}, fmt.Errorf("realize: host path is not a directory (or is a symlink): %w", ErrInvalidRequest)
	}
	return Realization{Root: p}, nil
}

// Sync has nothing to copy: commands wrote to the host path itself.
func (d onHost) Sync(ctx context.Context, req SyncRequest) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	if err := d.ownInstance(req.Instance); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	return nil
}

// Release has nothing to give back; Exec already stopped every process it started. Any instance
// of the driver is accepted, so cleanup never loops on an instance of a node that went away.
func (d onHost) Release(ctx context.Context, inst Instance) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	if inst.Driver != d.driver {
		return fmt.Errorf("release: a %q instance is not %s: %w", inst.Driver, d.driver, ErrInvalidRequest)
	}
	return nil
}

// ownInstance refuses an instance of another driver or another node, whose workspace is not on
// this host's disk.
func (d onHost) ownInstance(inst Instance) error {
	if inst.Driver != d.driver || inst.Ref != d.ref {
		return fmt.Errorf("instance %s %q is not this node's (%s): %w", inst.Driver, inst.Ref, d.ref, ErrInvalidRequest)
	}
	return nil
}
