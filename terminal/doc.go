// Package terminal bridges an instance administrator's browser to a setup sandbox's pty over a
// token-checked WebSocket (docs/terminal.md). Terminal tokens are single use and short-lived and
// never travel in a URL; one client is attached to a session at a time (a new attach takes over);
// the pty outlives a dropped connection for a grace period, and its last output (a scrollback
// ring) is replayed to the next client. One goroutine per client owns every write to its socket;
// the pty's reader only appends to the ring, so a client that stops reading never stalls the pty:
// a write deadline cuts it off, and memory stays at the ring's size.
package terminal
