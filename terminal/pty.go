package terminal

// Pty is the seam between the bridge and a shell: its output, its input, its window size, and
// its end. The bridge starts no process: a local setup shell comes from
// environment.StartSetupShell (the setup jail on a pty, the only pty Berth starts) and a plugin
// environment's from environment.PluginTerminal; tests use a fake or a plain process
// (plainpty_test.go).
type Pty interface {
	Read(p []byte) (int, error)
	Write(p []byte) (int, error)
	Resize(cols, rows int) error
	// Wait blocks until the process has exited and returns its exit code (-1 when killed).
	Wait() int
	// Close kills the process group and releases the pty; Wait then returns.
	Close() error
}
