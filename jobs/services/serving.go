package services

import (
	"context"
	"net"
	"strconv"
)

// Serving is the port service id's process listens on while this process's supervisor runs it
// and it has not exited; false otherwise. The preview proxy uses it to trust a cached service row
// (handlers/preview/cache.go).
func (m *Supervisor) Serving(id string) (int, bool) {
	if p, ok := m.sup.Running(id); ok {
		return p.Port, true
	}
	if r, ok := m.remoteRunning(id); ok {
		return r.port, true
	}
	return 0, false
}

// DialService connects to port in execution workspace workspaceID's network on this node: its
// namespace while a jail of it lives (services listen there, not on the host), else the host's
// loopback (an uncontained service, a node that has no namespaces, or a service of a plugin
// environment, which the plugin published on the host's loopback: plugin.go).
func (m *Supervisor) DialService(ctx context.Context, workspaceID string, port int) (net.Conn, error) {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if m.deps.Networks != nil && !m.remoteFor(workspaceID, port) {
		if c, err := m.deps.Networks.Dial(ctx, workspaceID, "tcp", addr); err == nil {
			return c, nil
		}
	}
	return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
}
