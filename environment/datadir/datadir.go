// Package datadir is the layout of Berth's data dir (BERTH_DATA_DIR): every path below it, in
// one place. cmd/berth makes the one Layout of a process from its configuration and passes it
// down (jobs.Deps.Data, imagesetup.Sessions.Data, backup and restore), so no package works out
// a path under the data dir by itself. It only names paths: it creates, reads and removes
// nothing, and imports nothing of Berth.
//
//	pg/                      the embedded PostgreSQL cluster
//	secret.key               the secret key (unless BERTH_SECRET_KEY)
//	workspaces/ git-cache/ git-home/ run-git/   workspace.Manager's trees
//	artifacts/               capsules and other content-addressed artifacts
//	images/<env>/<n>/        image version n of an environment
//	images/<env>/scratch-<session>/  a setup session's scratch layer
//	setup-sessions/<session>/        a setup session's shell workspace
//	services/                runtime services' logs
//	uploads/                 uploaded OCI archives waiting for their import job
//	spool/runs/              run outcomes a stopped worker could not write yet
//	egress/                  the egress proxy's CA (sealed)
//	homes/                   per-workspace HOME directories of jailed commands
//	plugin-state/            plugins' own state
//	tmp/                     scratch space of plugin calls
//	demo/                    the demo project's repository (berth serve --demo)
package datadir

import (
	"path/filepath"
	"strconv"
)

// Layout names the paths under one data dir, Root (absolute, symlinks resolved by the caller).
// The zero Layout has no data dir: callers check Root == "" where a data dir is optional.
type Layout struct {
	Root string
}

// At is the layout of the data dir root.
func At(root string) Layout { return Layout{Root: root} }

func (l Layout) join(elem ...string) string {
	return filepath.Join(append([]string{l.Root}, elem...)...)
}

// Postgres is the embedded cluster's directory.
func (l Layout) Postgres() string { return l.join("pg") }

// SecretKey is the secret key file.
func (l Layout) SecretKey() string { return l.join("secret.key") }

// Artifacts is the artifact store's directory.
func (l Layout) Artifacts() string { return l.join("artifacts") }

// Images is the directory of every environment's image versions.
func (l Layout) Images() string { return l.join("images") }

// EnvironmentImages is the directory of one environment's image versions.
func (l Layout) EnvironmentImages(environmentID string) string {
	return l.join("images", environmentID)
}

// ImageLayer is where image version number of an environment lives.
func (l Layout) ImageLayer(environmentID string, number int) string {
	return l.join("images", environmentID, strconv.Itoa(number))
}

// ScratchLayer is a setup session's copy of its base version, which its shell changes and
// capture_image turns into the next version.
func (l Layout) ScratchLayer(environmentID, sessionID string) string {
	return l.join("images", environmentID, "scratch-"+sessionID)
}

// ScratchLayers is the glob of every setup session's scratch layer.
func (l Layout) ScratchLayers() string { return l.join("images", "*", "scratch-*") }

// SetupSession is a setup session's own directory (its shell's workspace is below it).
func (l Layout) SetupSession(sessionID string) string { return l.join("setup-sessions", sessionID) }

// SetupWorkspace is the workspace directory a setup session's shell starts in.
func (l Layout) SetupWorkspace(sessionID string) string {
	return l.join("setup-sessions", sessionID, "workspace")
}

// ServiceLogs is where runtime services' logs are written.
func (l Layout) ServiceLogs() string { return l.join("services") }

// Uploads is where uploaded image archives wait for their import job.
func (l Layout) Uploads() string { return l.join("uploads") }

// RunSpool is the run-outcome spool.
func (l Layout) RunSpool() string { return l.join("spool", "runs") }

// Egress is the egress proxy's state (its CA).
func (l Layout) Egress() string { return l.join("egress") }

// Homes is the parent of jailed commands' HOME directories.
func (l Layout) Homes() string { return l.join("homes") }

// PluginState is the plugins' state directory.
func (l Layout) PluginState() string { return l.join("plugin-state") }

// Tmp is scratch space of plugin calls.
func (l Layout) Tmp() string { return l.join("tmp") }

// Demo is the demo project's directory.
func (l Layout) Demo() string { return l.join("demo") }
