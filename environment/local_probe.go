package environment

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unicode/utf8"
)

// Probe checks that /bin/sh runs a command with Berth's environment handling, and that a file can
// be created and removed in the probe directory; it also reports the operating system and whether
// bubblewrap is installed, for information.
func (d *local) Probe(ctx context.Context) (ProbeResult, error) {
	if err := ctx.Err(); err != nil {
		return ProbeResult{}, fmt.Errorf("probe: %w", err)
	}
	osCheck, bwrap := probeOS(), d.probeBubblewrap()
	checks := []Check{d.probeShell(ctx), probeScratch(d.probeDir), osCheck, bwrap}
	if err := ctx.Err(); err != nil {
		return ProbeResult{}, fmt.Errorf("probe: %w", err)
	}
	r := ProbeResult{OK: true, Checks: checks}
	var failed []string
	for _, c := range checks {
		if c.Status == CheckFail {
			r.OK = false
			failed = append(failed, c.Name+": "+c.Detail)
		}
	}
	if r.OK {
		r.Summary = "Local commands run on this host (" + osCheck.Detail + "); bubblewrap " + bwrap.Detail + "."
	} else {
		r.Summary = "Local probe failed: " + strings.Join(failed, "; ") + "."
	}
	return r, nil
}

func (d *local) probeShell(ctx context.Context) Check {
	c := Check{Name: "shell", Status: CheckFail}
	fi, err := os.Stat("/bin/sh")
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		c.Detail = "/bin/sh is missing or not executable"
		return c
	}
	dir, err := os.MkdirTemp(d.probeDir, ".berth-probe-")
	if err == nil {
		defer os.RemoveAll(dir)
		err = os.Chmod(dir, 0o755) // the run user must be able to enter it
	}
	if err != nil {
		c.Detail = "cannot make a probe directory: " + errnoText(err)
		return c
	}
	var out bytes.Buffer
	res, err := d.Exec(ctx, ExecRequest{Command: "echo berth-probe", Dir: dir, Timeout: probeTimeout, Log: &out,
		Tag: "probe-" + randomHex(8)})
	switch {
	case err != nil:
		c.Detail = "running /bin/sh failed: " + err.Error()
	case res.TimedOut || res.ExitCode != 0 || out.String() != "berth-probe\n":
		c.Detail = fmt.Sprintf("/bin/sh -c did not run a test command (exit %d)", res.ExitCode) +
			failureOutput(out.String(), "berth-probe", d.probeDir, d.dataDir)
	default:
		c.Status, c.Detail = CheckPass, "/bin/sh runs commands"
	}
	return c
}

// maxFailureOutput is how much of a failed probe command's output (bubblewrap's own complaint,
// typically) a check's detail quotes.
const maxFailureOutput = 300

// failureOutput is ": " and the last maxFailureOutput bytes of what a failed probe command
// printed, on one line, with expected (the test command's own output) dropped and every host path
// in hide replaced by "…" (details never name Berth's directories); "" when it printed nothing
// else. bubblewrap writes why it could not build the jail ("bwrap: Can't mkdir …") to the same
// log, so this is the real reason a jailed shell failed.
func failureOutput(out, expected string, hide ...string) string {
	out = strings.ReplaceAll(out, expected+"\n", "")
	for _, h := range hide {
		if h != "" && h != "/" {
			out = strings.ReplaceAll(out, h, "…")
		}
	}
	out = strings.Join(strings.Fields(strings.ToValidUTF8(out, "?")), " ")
	if out == "" {
		return ""
	}
	if len(out) > maxFailureOutput {
		cut := len(out) - maxFailureOutput
		for cut < len(out) && !utf8.RuneStart(out[cut]) {
			cut++
		}
		out = "…" + out[cut:]
	}
	return ": " + out
}

// probeScratch creates, writes and removes a file in dir. Details never name the directory.
func probeScratch(dir string) Check {
	c := Check{Name: "scratch_dir", Status: CheckFail}
	f, err := os.CreateTemp(dir, ".berth-probe-*")
	if err != nil {
		c.Detail = "cannot create a file in the probe directory: " + errnoText(err)
		return c
	}
	name := f.Name()
	_, werr := f.Write([]byte("berth probe\n"))
	cerr := f.Close()
	rerr := os.Remove(name)
	switch {
	case werr != nil || cerr != nil:
		c.Detail = "cannot write a file in the probe directory: " + errnoText(errors.Join(werr, cerr))
	case rerr != nil:
		c.Detail = "cannot remove a file in the probe directory: " + errnoText(rerr)
	default:
		c.Status, c.Detail = CheckPass, "can create and remove files in the probe directory"
	}
	return c
}

// errnoText is an error without the path an *os.PathError carries.
func errnoText(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// probeOS names the kernel, the architecture and, when /etc/os-release says, the distribution.
func probeOS() Check {
	desc := "unknown kernel"
	typ, err1 := os.ReadFile("/proc/sys/kernel/ostype")
	rel, err2 := os.ReadFile("/proc/sys/kernel/osrelease")
	if err1 == nil && err2 == nil {
		desc = strings.TrimSpace(string(typ)) + " " + strings.TrimSpace(string(rel))
	}
	desc += " " + runtime.GOARCH
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
				if name := strings.Trim(v, `"'`); name != "" {
					desc += ", " + name
				}
			}
		}
	}
	return Check{Name: "os", Status: CheckInfo, Detail: desc}
}

// probeBubblewrap reports whether bwrap is on the commands' PATH; only sandbox environments need it.
func (d *local) probeBubblewrap() Check {
	c := Check{Name: "bubblewrap", Status: CheckInfo, Detail: "not installed"}
	for _, dir := range filepath.SplitList(d.path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, "bwrap")); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			c.Detail = "installed"
			break
		}
	}
	return c
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}
