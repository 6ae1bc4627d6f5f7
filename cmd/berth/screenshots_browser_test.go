package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestDocsScreenshots takes the screenshots docs/pages.md shows: the project, task, run and
// workspace pages of a demo install after one run, at 1400 and 390 px, in the light theme. It
// runs only with BERTH_DOCS_SCREENSHOTS=<dir> (scripts/screenshots.sh sets it to
// docs/screenshots), so the figures are made the same way each time: same demo, same task, same
// widths, the viewport's height, animations off.
func TestDocsScreenshots(t *testing.T) {
	dir := os.Getenv("BERTH_DOCS_SCREENSHOTS")
	if dir == "" {
		t.Skip("set BERTH_DOCS_SCREENSHOTS to a directory (scripts/screenshots.sh) to take the docs' screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := browser(t)
	base := serveDemoForBrowser(t, nil).Base
	pages := demoWithRun(t, ctx, base)
	colorScheme(t, ctx, "light")
	for _, width := range []int64{1400, 390} {
		for _, name := range []string{"project", "task", "run", "workspace"} {
			browserStep(t, ctx, name, chromedp.EmulateViewport(width, 1000), chromedp.Navigate(base+pages[name]),
				chromedp.WaitVisible(chromedp.CSS(`main .page-header`)))
			// Times and durations differ from run to run; the layout does not.
			png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+"-"+strconv.FormatInt(width, 10)+".png")
			if err := os.WriteFile(file, png, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", file)
		}
	}
}
