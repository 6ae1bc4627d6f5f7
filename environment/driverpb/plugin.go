// Package driverpb is Berth's environment driver protocol (driver.proto) and its go-plugin
// binding: the handshake both sides check, and the plugin set that serves and dispenses the
// Driver service over gRPC. Plugins import it to serve; Berth's plugin driver to call.
package driverpb

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// ProtocolVersion is the driver protocol this package speaks; the go-plugin handshake refuses a
// plugin built for another.
const ProtocolVersion = 1

// PluginName is the name the Driver service is dispensed under.
const PluginName = "driver"

// Handshake is what a plugin and Berth agree on before anything else: the protocol version and a
// cookie that keeps the executable from doing anything when started by hand.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "BERTH_DRIVER_PLUGIN",
	MagicCookieValue: "9f1c1e0a-berth-environment-driver",
}

// GRPCDriver is the go-plugin binding of the Driver service: Impl serves it in a plugin, and the
// client side dispenses a DriverClient.
type GRPCDriver struct {
	plugin.NetRPCUnsupportedPlugin
	Impl DriverServer
}

// GRPCServer registers Impl on the plugin's gRPC server.
func (p *GRPCDriver) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	RegisterDriverServer(s, p.Impl)
	return nil
}

// GRPCClient returns a DriverClient on Berth's side of the connection.
func (p *GRPCDriver) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewDriverClient(c), nil
}

// Plugins is the plugin set both sides use.
func Plugins(impl DriverServer) map[string]plugin.Plugin {
	return map[string]plugin.Plugin{PluginName: &GRPCDriver{Impl: impl}}
}

// Serve runs a plugin's Driver implementation until Berth ends it. A plugin's main calls it.
func Serve(impl DriverServer) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         Plugins(impl),
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}
