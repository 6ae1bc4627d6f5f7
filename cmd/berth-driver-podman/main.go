// Command berth-driver-podman is Berth's reference environment plugin (docs/plugins.md): each
// lease is a container on rootful podman, started from the environment's image version (an OCI
// image Berth imported, or a layer built in a setup session) with the layer as its root
// filesystem under a throwaway overlay. Realize copies the verified capsule in, Exec runs
// commands with podman exec, Sync copies the workspace back out as a capsule, services publish
// a port on the host's loopback, and the terminal is podman exec -it.
//
// Berth starts it (go-plugin over gRPC) as its own unprivileged user; it reaches podman through
// the service socket named in its settings. The same executable, bind-mounted read-only into each
// container at /.berth/helper, is the container's init and the process-group keeper of each
// command (helper.go).
package main

import (
	"fmt"
	"os"

	"berth/environment/driverpb"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "0.1.0"

func main() {
	if len(os.Args) > 1 {
		if err := helper(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "berth helper:", err)
			os.Exit(125)
		}
		return
	}
	driverpb.Serve(newServer(os.Getenv("BERTH_PLUGIN_STATE")))
}
