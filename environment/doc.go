// Package environment holds the drivers that execute commands for Berth (local, ssh, and a
// bubblewrap sandbox) behind one interface, and the supervisor for runtime services. Handlers
// never start processes themselves; they go through jobs, which go through this package.
package environment
