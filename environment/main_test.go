package environment

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"berth/environment/jail"
)

// testRoot is where tests put workspaces: outside /tmp (the jail gives every command a private
// /tmp, which would hide a workspace there by accident and prove nothing) and below a 0700
// directory the run user cannot enter, as a data dir under /root would be.
var testRoot string

// testJail is this machine's jail; the tests need bubblewrap (make test installs it).
var testJail jail.Host

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	h, err := jail.Detect(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "environment tests need bubblewrap:", err)
		return 1
	}
	testJail = h
	dir, err := os.MkdirTemp("/var/tmp", "berth-envtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	testRoot = dir // 0700
	return m.Run()
}

// workDir is a fresh directory for one test's workspace, below testRoot.
func workDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp(testRoot, filepath.Base(t.Name())+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func fileUID(fi os.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
