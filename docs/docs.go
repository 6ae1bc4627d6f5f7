// Package docs embeds Berth's documentation so the running server can show it as its help pages
// (/help/{name}; handlers/help.go). The Markdown files here are the source for both readers of
// the repository and users of the pages.
package docs

import "embed"

// Files holds every document (*.md) and the screenshots they show (screenshots/*.png).
//
//go:embed *.md all:screenshots
var Files embed.FS
