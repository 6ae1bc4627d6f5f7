package main

import (
	"fmt"
	"net"
	"strings"

	"berth/handlers/preview"
)

// previewOrigins is where previews are served (DESIGN §14, docs/previews.md): one host per
// service under BERTH_PREVIEW_DOMAIN, else one port per running service of BERTH_PREVIEW_PORTS
// (default 18100-18199) bound on BERTH_ADDR's interface.
type previewOrigins struct {
	Domain string
	Ports  preview.PortRange
	Bind   string
}

// readPreviewOrigins reads BERTH_PREVIEW_DOMAIN and BERTH_PREVIEW_PORTS for a server on addr.
func readPreviewOrigins(getenv func(string) string, addr string) (previewOrigins, error) {
	var o previewOrigins
	if d := strings.TrimSpace(getenv("BERTH_PREVIEW_DOMAIN")); d != "" {
		d = strings.TrimSuffix(strings.TrimPrefix(strings.ToLower(d), "*."), ".")
		if strings.ContainsAny(d, "/:*@ ") || !strings.Contains(d, ".") && d != "localhost" {
			return o, fmt.Errorf("BERTH_PREVIEW_DOMAIN %q: want a wildcard domain like *.preview.example.com", d)
		}
		o.Domain = d
	}
	ports, err := preview.ParsePorts(getenv("BERTH_PREVIEW_PORTS"))
	if err != nil {
		return o, err
	}
	o.Ports = ports
	host, _, _ := net.SplitHostPort(addr)
	if host == "" {
		host = "0.0.0.0"
	}
	o.Bind = host
	return o, nil
}

// describe is the banner line about previews.
func (o previewOrigins) describe(urlHost string) string {
	if o.Domain != "" {
		return "previews at https://{service}." + o.Domain + "/ (BERTH_PREVIEW_DOMAIN)"
	}
	return fmt.Sprintf("previews at http://%s:%d-%d/ (one port per running service, BERTH_PREVIEW_PORTS)",
		urlHost, o.Ports.Lo, o.Ports.Hi)
}
