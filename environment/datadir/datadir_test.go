package datadir

import "testing"

// TestPaths: the layout names the paths the data dir has always had (a restored or upgraded
// instance finds its files where an older Berth put them).
func TestPaths(t *testing.T) {
	l := At("/var/lib/berth")
	for got, want := range map[string]string{
		l.Postgres():             "/var/lib/berth/pg",
		l.SecretKey():            "/var/lib/berth/secret.key",
		l.Artifacts():            "/var/lib/berth/artifacts",
		l.ImageLayer("e", 3):     "/var/lib/berth/images/e/3",
		l.ScratchLayer("e", "s"): "/var/lib/berth/images/e/scratch-s",
		l.ScratchLayers():        "/var/lib/berth/images/*/scratch-*",
		l.SetupWorkspace("s"):    "/var/lib/berth/setup-sessions/s/workspace",
		l.RunSpool():             "/var/lib/berth/spool/runs",
		l.Uploads():              "/var/lib/berth/uploads",
		l.EnvironmentImages("e"): "/var/lib/berth/images/e",
		l.ServiceLogs():          "/var/lib/berth/services",
		l.Egress():               "/var/lib/berth/egress",
		l.Homes():                "/var/lib/berth/homes",
		l.PluginState():          "/var/lib/berth/plugin-state",
		l.Tmp():                  "/var/lib/berth/tmp",
		l.Demo():                 "/var/lib/berth/demo",
		l.SetupSession("s"):      "/var/lib/berth/setup-sessions/s",
		l.Images():               "/var/lib/berth/images",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}
