package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"berth/environment"
	"berth/environment/plugincheck"
)

// pluginCmd is `berth plugin test PATH`: the driver protocol's contract suite against a plugin.
func pluginCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "test" {
		return fmt.Errorf("usage: berth plugin test [--settings JSON] [--image DIR] PATH")
	}
	fs := flag.NewFlagSet("plugin test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	settings := fs.String("settings", "{}", `the environment's "settings" object for the plugin (JSON)`)
	image := fs.String("image", "", "an image layer directory with /bin/sh (default: a minimal one made from this host's /bin/sh)")
	stateDir := fs.String("state-dir", "", "the plugins' state directory (default a temporary one)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: berth plugin test [--settings JSON] [--image DIR] PATH")
	}
	if !json.Valid([]byte(*settings)) || !strings.HasPrefix(strings.TrimSpace(*settings), "{") {
		return fmt.Errorf("--settings must be a JSON object")
	}
	runAs, err := environment.PluginRunAs(ctx)
	if err != nil {
		return fmt.Errorf("plugin test: %w", err)
	}
	fmt.Fprintf(stdout, "berth plugin test %s\n", fs.Arg(0))
	rep, err := plugincheck.Run(ctx, plugincheck.Options{Path: fs.Arg(0), Settings: json.RawMessage(*settings), ImageDir: *image,
		StateDir: *stateDir, RunAs: runAs, Out: stdout})
	if err != nil {
		return err
	}
	if !rep.OK {
		fmt.Fprintf(stdout, "FAIL: the plugin breaks the driver contract in %d of %d steps\n", len(rep.Failed()), len(rep.Steps))
		return errors.New("plugin test failed: " + strings.Join(rep.Failed(), "; "))
	}
	fmt.Fprintf(stdout, "PASS: %d steps\n", len(rep.Steps))
	return nil
}
