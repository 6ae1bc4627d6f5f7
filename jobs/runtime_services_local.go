package jobs

import (
	"context"
	"net"
	"strconv"
)

// Serving is the port service id's process listens on while this process's supervisor runs it
// and it has not exited; false otherwise. The preview proxy uses it to trust a cached service row
// (handlers/preview/cache.go).
func (m *Services) Serving(id string) (int, bool) {
	p, ok := m.sup.Running(id)
	if !ok {
		return 0, false
	}
	return p.Port, true
}

// DialService connects to port in execution workspace workspaceID's network on this node: its
// namespace while a jail of it lives (services listen there, not on the host), else the host's
// loopback (an uncontained service, or a node that has no namespaces).
func (m *Services) DialService(ctx context.Context, workspaceID string, port int) (net.Conn, error) {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if m.deps.Networks != nil {
		if c, err := m.deps.Networks.Dial(ctx, workspaceID, "tcp", addr); err == nil {
			return c, nil
		}
	}
	return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
}
